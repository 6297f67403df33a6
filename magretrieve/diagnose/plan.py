"""The stages of a diagnose run, how long each should take, and the time budget of the probes.

Before any long work, :func:`quick_timing` encodes a few documents (and, when probes may run,
times one forward and backward pass of a probe batch) and :func:`plan` turns those rates and
the data sizes (tokens after truncation) into one estimate per stage. The training-free
stages always run; a probe stage runs only when its estimate, scaled by how far the finished
stages ran over or under theirs, fits in what is left of the time budget
(:meth:`Plan.admit`). The estimates are printed first, so nobody waits an hour in the dark.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: Default budget of a run, in minutes: the probes run only if they fit in it.
DEFAULT_TIME_BUDGET = 10.0
#: Documents encoded to time the encoder (after a two-text warm-up).
SAMPLE_DOCUMENTS = 32
#: A Fisher batch costs about this many probe training steps: one forward pass, then per
#: example a backward pass through the last layer only (a sixth of a full one for six layers,
#: sixteen of them a batch). A rough count, not a measurement: the plan says "~".
FISHER_STEPS_PER_BATCH = 2.0


@dataclass
class Stage:
    """One step of the run: what it does, its estimate and, once run, its wall time."""

    key: str
    title: str
    detail: str
    estimate: float
    probe: bool = False
    seconds: float | None = None
    skipped: str = ""
    started: float = field(default=0.0, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("started")
        return data


@dataclass
class Rates:
    """Measured speeds of this encoder on this machine."""

    seconds_per_token: float
    #: The same for short texts (queries, STS sentences): padding and per-text costs weigh more.
    seconds_per_short_token: float
    #: One probe training step (forward and backward of a batch), None when not timed.
    seconds_per_step: float | None = None
    timing_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def minutes(seconds: float) -> str:
    """``~3.2 min`` / ``~40 s``: an estimate as people read it."""
    if not math.isfinite(seconds):
        return "unbounded"
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{max(1, round(seconds))} s"


def quick_timing(
    encoder: Any,
    documents: Sequence[str],
    pairs: Sequence[Any] = (),
    *,
    short_texts: Sequence[str] = (),
    batch_size: int = 16,
    max_document_length: int | None = 128,
    seed: int = 42,
) -> Rates:
    """Seconds per encoded token from a sample of ``documents`` (and of ``short_texts``, encoded
    as queries), and one probe step's time.

    The probe step is a forward and backward pass of ``batch_size`` training pairs under a
    throw-away loss; the gradients are cleared afterwards, the weights are not touched.
    """
    started = time.perf_counter()
    rng = random.Random(seed)
    sample = rng.sample(list(documents), min(SAMPLE_DOCUMENTS, len(documents)))
    encoder.embed(sample[:2], "document")  # warm-up: thread pools, first allocations
    tokens = max(1, sum(encoder.token_lengths(sample, "document")))
    t0 = time.perf_counter()
    encoder.embed(sample, "document")
    per_token = (time.perf_counter() - t0) / tokens
    per_short = per_token
    if short_texts:
        short = rng.sample(list(short_texts), min(4 * SAMPLE_DOCUMENTS, len(short_texts)))
        short_tokens = max(1, sum(encoder.token_lengths(short, "query")))
        t0 = time.perf_counter()
        encoder.embed(short, "query")
        per_short = (time.perf_counter() - t0) / short_tokens
    per_step = None
    if len(pairs) >= 2:
        chosen = rng.sample(list(pairs), min(batch_size, len(pairs)))
        keep = encoder.config.max_document_length
        if max_document_length is not None:
            encoder.config.max_document_length = min(keep, max_document_length)
        was_training = encoder.training
        try:
            encoder.train()
            for _ in range(2):  # the first pass pays for allocations: time the second
                t0 = time.perf_counter()
                q = encoder(**encoder.tokenize([p.query for p in chosen], "query"), side="query")
                d = encoder(
                    **encoder.tokenize([p.positive for p in chosen], "document"), side="document"
                )
                (q @ d.T).logsumexp(dim=1).sum().backward()
                per_step = time.perf_counter() - t0
        finally:
            encoder.config.max_document_length = keep
            encoder.zero_grad(set_to_none=True)
            encoder.train(was_training)
    return Rates(per_token, per_short, per_step, time.perf_counter() - started)


@dataclass
class Plan:
    """The stages in run order, the budget (seconds, ``inf`` for none) and the clock."""

    stages: list[Stage]
    budget: float
    started: float = field(default_factory=time.perf_counter)
    say: Callable[[str], None] = print

    @property
    def estimate(self) -> float:
        return sum(s.estimate for s in self.stages)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def pace(self) -> float:
        """Measured / estimated time of the finished stages (1 before any finished)."""
        done = [s for s in self.stages if s.seconds is not None and s.estimate > 0]
        est = sum(s.estimate for s in done)
        if est < 1.0:  # too short to tell the machine's load from noise
            return 1.0
        return min(5.0, max(0.2, sum(s.seconds or 0.0 for s in done) / est))

    def announce(self, header: str, rates: Rates) -> None:
        """Print every stage with its estimate, before the first one starts."""
        budget = (
            "no time budget" if math.isinf(self.budget) else f"time budget {minutes(self.budget)}"
        )
        free = sum(s.estimate for s in self.stages if not s.probe)
        probes = sum(s.estimate for s in self.stages if s.probe)
        self.say(
            f"{header}: {len(self.stages)} stage{'s' if len(self.stages) != 1 else ''}, estimated {minutes(self.estimate)} on this "
            f"machine ({budget}; quick timing took {minutes(rates.timing_seconds)})"
        )
        for i, s in enumerate(self.stages, 1):
            self.say(f"  {i}. {s.title}: {s.detail} (~{minutes(s.estimate)})")
        if any(s.probe for s in self.stages):
            self.say(
                f"The checks without training come first (~{minutes(free)}). The probes "
                f"(~{minutes(probes)}) run only if they fit in the time budget: "
                "--time-budget MINUTES sets it (inf: no limit), --skip-probes skips them."
            )
        else:
            self.say("No probe trainings in this run (--skip-probes).")
        if free > self.budget:
            self.say(
                f"The checks without training alone need ~{minutes(free)}, more than the "
                "budget; they run anyway (the probes will not)."
            )

    def begin(self, stage: Stage) -> bool:
        """Print the stage heading; False (and the reason recorded) when a probe is over budget."""
        n = self.stages.index(stage) + 1
        head = f"[{n}/{len(self.stages)}] {stage.title}"
        if stage.probe:
            need = stage.estimate * self.pace()
            left = self.budget - self.elapsed()
            if need > left:
                stage.skipped = (
                    f"needs ~{minutes(need)}, {minutes(max(0.0, left))} left of the "
                    f"{minutes(self.budget)} time budget; rerun with --time-budget "
                    f"{math.ceil((self.elapsed() + need) / 60) + 1} to run it"
                )
                self.say(f"{head}: skipped, {stage.skipped}")
                return False
        self.say(f"{head} (~{minutes(stage.estimate * self.pace())})")
        stage.started = time.perf_counter()
        return True

    def end(self, stage: Stage) -> None:
        stage.seconds = time.perf_counter() - stage.started
        self.say(f"      done in {minutes(stage.seconds)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "time_budget_seconds": None if math.isinf(self.budget) else self.budget,
            "estimate_seconds": self.estimate,
            "stages": [s.to_dict() for s in self.stages],
        }


def encode_seconds(tokens: int, rates: Rates, short: bool = False) -> float:
    return tokens * (rates.seconds_per_short_token if short else rates.seconds_per_token)


def delta_cv_seconds(steps: int, probe_query_tokens: int, rates: Rates) -> float:
    """Two probe trainings, and the probe queries encoded before and after each."""
    step = rates.seconds_per_step or 0.0
    return 2 * steps * step + 3 * encode_seconds(probe_query_tokens, rates, short=True)


def fisher_seconds(batches: int, rates: Rates) -> float:
    """Per-example gradients under qnorm and dnorm."""
    return 2 * batches * FISHER_STEPS_PER_BATCH * (rates.seconds_per_step or 0.0)


#: Share of the budget the checks without training may use before the corpus is sampled.
FREE_SHARE = 0.8


def corpus_sample(
    dataset: Any, costs: dict[str, float], allowance: float, seed: int
) -> tuple[Any, str]:
    """``dataset`` with a corpus whose encoding ``costs`` (seconds by id) fit in ``allowance``.

    Every judged document is kept (Cohen's d compares relevant with retrieved non-relevant
    ones), then a seeded random sample of the rest until the allowance is spent. Returns the
    dataset unchanged and ``""`` when the whole corpus fits, else the sampled dataset and a
    note saying how many documents it holds.
    """
    from dataclasses import replace

    total = sum(costs.values())
    if total <= allowance:
        return dataset, ""
    judged = {d for docs in dataset.qrels.values() for d in docs if d in dataset.corpus}
    keep = [d for d in dataset.corpus if d in judged]
    spent = sum(costs[d] for d in keep)
    rest = [d for d in dataset.corpus if d not in judged]
    random.Random(seed).shuffle(rest)
    for d in rest:
        if spent + costs[d] > allowance:
            break
        keep.append(d)
        spent += costs[d]
    chosen = set(keep)
    corpus = {d: doc for d, doc in dataset.corpus.items() if d in chosen}
    note = (
        f"a sample of {len(corpus):,} of {len(dataset.corpus):,} documents (all "
        f"{len(judged):,} judged ones and a seeded random sample of the others) to fit the "
        "time budget"
    )
    return replace(dataset, corpus=corpus), note
