"""`magretrieve diagnose`: does magnitude carry signal, which side to normalize, and when not to.

:func:`diagnose` runs the parts and returns one JSON-able report:

* :mod:`.plan` — the stages, their estimates from a quick timing, and the probes' time budget;
* :mod:`.magnitude` — corpus norm CV, Cohen's d of raw norms (relevant vs non-relevant in
  the top-100), norm–length correlation; for the encoder and for any trained runs passed;
* :mod:`.side` — ΔCV probe trainings (paper v1) and the experimental Fisher κ;
* :mod:`.symmetry` — STS Spearman per mode in both orders and the asymmetry;
* :mod:`.plots` — PNG figures; :mod:`.report` — the recommendation and ``diagnose.json``;
  :mod:`.html` — ``diagnose.html``, the same report as one self-contained page.

Torch is imported only when this package is used (``import magretrieve`` stays torch-free).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from magretrieve.core.errors import ConfigError
from magretrieve.data.readers import RetrievalDataset, SentencePair, load_beir, load_sentence_pairs
from magretrieve.diagnose.cache import EmbeddingCache, model_fingerprint
from magretrieve.diagnose.magnitude import MagnitudeSignal, magnitude_signal
from magretrieve.diagnose.plan import (
    DEFAULT_TIME_BUDGET,
    FREE_SHARE,
    Plan,
    Stage,
    corpus_sample,
    delta_cv_seconds,
    encode_seconds,
    fisher_seconds,
    quick_timing,
)
from magretrieve.diagnose.report import recommend, verdict_text, write_report
from magretrieve.diagnose.side import delta_cv, fisher_kappa, probe_queries
from magretrieve.diagnose.symmetry import symmetry_check, symmetry_verdict

__all__ = ["diagnose", "recommend"]

logger = logging.getLogger(__name__)
TRAIN_LOG = "train_log.json"


def _load_encoder(model: Any) -> Any:
    from magretrieve.train.encoder import Encoder

    return model if isinstance(model, Encoder) else Encoder.load(model)


def _cache_for(
    encoder: Any, cache_dir: str | Path | None, progress: bool
) -> tuple[EmbeddingCache, Path | None]:
    cache = EmbeddingCache(encoder)
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"embeddings-{model_fingerprint(encoder)}.npz"
        if cache.load(path):
            logger.info("reusing cached embeddings %s", path)
    return cache, path


def _magnitude_plots(sig: MagnitudeSignal, out: Path, label: str, stem: str) -> list[str]:
    from magretrieve.diagnose import plots

    paths = [
        plots.norm_histograms(
            sig.relevant_norms,
            sig.nonrelevant_norms,
            sig.cohens_d,
            out / f"{stem}norms_relevant_vs_nonrelevant.png",
            f"{label}: raw ‖d‖ of top-100 documents on {sig.dataset} ({sig.mode} retrieval)",
        ),
        plots.norm_length_scatter(
            sig.doc_lengths,
            sig.doc_norms,
            sig.pearson_norm_length,
            sig.spearman_norm_length,
            out / f"{stem}norm_vs_length.png",
            f"{label}: document norm vs length on {sig.dataset}",
        ),
        plots.score_decomposition(
            sig.top_hits,
            out / f"{stem}score_decomposition.png",
            f"{label}: top-10 hits per query on {sig.dataset}, cos θ vs ‖d‖",
        ),
    ]
    return [str(p) for p in paths]


def _training(folder: Path, out: Path | None, stem: str) -> tuple[dict[str, Any] | None, list[str]]:
    log_path = folder / TRAIN_LOG
    if not log_path.is_file():
        return None, []
    log = json.loads(log_path.read_text())
    steps = log.get("steps", [])
    summary = {
        "mode": log.get("encoder", {}).get("mode"),
        "total_steps": log.get("total_steps"),
        "final_gamma_q": log.get("final_gamma_q"),
        "final_gamma_d": log.get("final_gamma_d"),
        "first_mean_query_norm": steps[0]["mean_query_norm"] if steps else None,
        "last_mean_query_norm": steps[-1]["mean_query_norm"] if steps else None,
        "first_mean_doc_norm": steps[0]["mean_doc_norm"] if steps else None,
        "last_mean_doc_norm": steps[-1]["mean_doc_norm"] if steps else None,
        "best_validation_ndcg@10": log.get("best_validation_ndcg@10"),
    }
    plots_made = []
    if out is not None and steps:
        from magretrieve.diagnose import plots

        plots_made.append(
            str(
                plots.training_curves(
                    log, out / f"{stem}training.png", f"{folder.name}: {summary['mode']} training"
                )
            )
        )
    return summary, plots_made


def encoder_name(model: Any) -> str:
    """What tables and plot titles call the encoder: its alias, or its folder's name."""
    if hasattr(model, "config"):
        return str(model.config.base_model or "encoder")
    text = str(model).rstrip("/\\")
    return Path(text).name or text or "encoder"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _silent(line: str) -> None:
    return None


def _missing(cache: EmbeddingCache, texts: Sequence[str], side: str) -> list[str]:
    store = cache.store[side]
    return list(dict.fromkeys(t for t in texts if t not in store))


def _tokens(encoder: Any, texts: Sequence[str], side: str) -> int:
    return int(sum(encoder.token_lengths(texts, side))) if texts else 0


def _plan(
    encoder: Any,
    cache: EmbeddingCache,
    dataset: RetrievalDataset,
    pairs: Sequence[Any],
    sts_pairs: Sequence[SentencePair] | None,
    runs: Sequence[str | Path],
    *,
    name: str,
    probes: bool,
    probe_steps: int,
    probe_batch_size: int,
    probe_max_document_length: int | None,
    fisher_batches: int,
    budget: float,
    seed: int,
    say: Callable[[str], None],
) -> tuple[Plan, dict[str, Stage], RetrievalDataset, str]:
    """Stages in run order (training-free first) with estimates from a quick timing."""
    docs = [d.full_text for d in dataset.corpus.values()]
    queries = list(dataset.queries.values())
    rates = quick_timing(
        encoder,
        docs,
        pairs if probes else (),
        short_texts=queries,
        batch_size=probe_batch_size,
        max_document_length=probe_max_document_length,
        seed=seed,
    )
    query_tokens = _tokens(encoder, _missing(cache, queries, "query"), "query")
    sts_tokens = 0
    sentences: list[str] = []
    if sts_pairs is not None:
        sentences = list(dict.fromkeys(t for p in sts_pairs for t in (p.a, p.b)))
        sts_tokens = _tokens(encoder, _missing(cache, sentences, "query"), "query")
        sts_tokens += _tokens(encoder, _missing(cache, sentences, "document"), "document")
    # what each document costs to encode: for this encoder (unless cached) and for every run
    ids = list(dataset.corpus)
    lengths = encoder.token_lengths(docs, "document")
    cached = cache.store["document"]
    costs = {
        i: encode_seconds(n * ((t not in cached) + len(runs)), rates)
        for i, t, n in zip(ids, docs, lengths, strict=True)
    }
    fixed = encode_seconds(query_tokens * (1 + len(runs)) + sts_tokens, rates, short=True)
    allowance = FREE_SHARE * budget - rates.timing_seconds - fixed
    dataset, sampled = corpus_sample(dataset, costs, allowance, seed)
    kept = [i for i in ids if i in dataset.corpus]
    doc_tokens = sum(n for i, n in zip(ids, lengths, strict=True) if i in dataset.corpus)
    new = sum(
        n
        for i, t, n in zip(ids, docs, lengths, strict=True)
        if i in dataset.corpus and t not in cached
    )
    what = sampled or f"{len(kept):,} documents"
    stages = {
        "magnitude": Stage(
            "magnitude",
            "magnitude signal (no training)",
            f"encode {what} and {len(queries):,} queries, rank under cosine and dot",
            encode_seconds(new, rates) + encode_seconds(query_tokens, rates, short=True),
        )
    }
    for run in runs:
        label = encoder_name(run)
        stages[f"run:{run}"] = Stage(
            f"run:{run}",
            f"trained run {label} (no training)",
            f"load it, encode the same {len(kept):,} documents and {len(queries):,} queries",
            encode_seconds(doc_tokens, rates)
            + encode_seconds(_tokens(encoder, queries, "query"), rates, short=True),
        )
    if sts_pairs is not None:
        stages["symmetry"] = Stage(
            "symmetry",
            "task symmetry (no training)",
            f"encode {len(sentences):,} STS sentences as queries and as documents",
            encode_seconds(sts_tokens, rates, short=True),
        )
    if probes:
        probe_q = probe_queries(pairs, 512, seed)
        stages["delta_cv"] = Stage(
            "delta_cv",
            "ΔCV probes (training)",
            f"two probe trainings (dnorm, dot) of {probe_steps} steps, batch {probe_batch_size}",
            delta_cv_seconds(probe_steps, _tokens(encoder, probe_q, "query"), rates),
            probe=True,
        )
        stages["fisher"] = Stage(
            "fisher",
            "Fisher κ (gradients, experimental)",
            f"per-example gradients of {fisher_batches} batches of {probe_batch_size} pairs "
            "under qnorm and dnorm",
            fisher_seconds(fisher_batches, rates),
            probe=True,
        )
    plan = Plan(list(stages.values()), budget, say=say)
    header = f"diagnose {name} on {dataset.name}:{dataset.split}"
    plan.announce(header, rates)
    if sampled:
        say(
            f"The magnitude figures use {sampled}; --time-budget "
            f"{math.ceil((sum(costs.values()) + fixed) / 60 / FREE_SHARE) + 1} or more encodes "
            "the whole corpus."
        )
    return plan, stages, dataset, sampled


def diagnose(
    model: Any,
    data: str | Path | RetrievalDataset,
    *,
    sts: str | Path | Sequence[SentencePair] | None = None,
    out: str | Path | None = None,
    runs: Sequence[str | Path] = (),
    probe_steps: int = 100,
    probe_batch_size: int = 16,
    probe_lr: float = 2e-5,
    probe_max_document_length: int | None = 128,
    fisher_batches: int = 8,
    fisher_sketch_dim: int = 1024,
    skip_probes: bool = False,
    time_budget: float | None = DEFAULT_TIME_BUDGET,
    cache_dir: str | Path | None = None,
    results_dir: str | Path | None = None,
    seed: int = 42,
    progress: bool = True,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Diagnose ``model`` on a BEIR split ``data`` (``DIR:split``, default split ``train``).

    Returns the report dict (also written to ``out/diagnose.json`` with PNG plots when
    ``out`` is given). ``runs`` are trained run folders whose magnitude figures are reported
    next to the model's. ``cache_dir`` keeps raw embeddings between invocations.
    ``results_dir`` holds measured ``qnorm-s*.json``/``dnorm-s*.json`` runs to validate the
    side predictors against (see :mod:`.validate`).

    The stages and their estimates are printed through ``say`` (stderr when ``progress``)
    before the work starts; the checks without training run first, and each probe stage
    runs only if it fits in what is left of ``time_budget`` minutes (None: no limit).
    """
    started = time.perf_counter()
    say = say or (_stderr if progress else _silent)
    dataset = data if isinstance(data, RetrievalDataset) else load_beir(data, default_split="train")
    sts_pairs = None
    sts_name = "sts"
    if sts is not None:
        if isinstance(sts, (str, Path)):
            sts_name = f"{Path(sts).parent.name}/{Path(sts).stem}"
            sts_pairs = load_sentence_pairs(sts)
        else:
            sts_pairs = list(sts)
    if time_budget is not None and not time_budget > 0:
        raise ConfigError(f"--time-budget must be > 0 minutes, got {time_budget}")
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)

    encoder = _load_encoder(model)
    name = encoder_name(model)
    cache, cache_path = _cache_for(encoder, cache_dir, progress)
    pairs = dataset.training_pairs()
    plan, stage, dataset, sampled = _plan(
        encoder,
        cache,
        dataset,
        pairs,
        sts_pairs,
        runs,
        name=name,
        probes=not skip_probes,
        probe_steps=probe_steps,
        probe_batch_size=probe_batch_size,
        probe_max_document_length=probe_max_document_length,
        fisher_batches=fisher_batches,
        budget=math.inf if time_budget is None else 60.0 * time_budget,
        seed=seed,
        say=say,
    )
    report: dict[str, Any] = {
        "model": str(model) if not hasattr(model, "config") else model.config.base_model,
        "name": name,
        "data": f"{dataset.name}:{dataset.split}",
        "corpus_sample": sampled,
        "encoder": {
            "mode": encoder.config.mode,
            "gamma_q": encoder.config.gamma_q,
            "gamma_d": encoder.config.gamma_d,
            "pooling": encoder.config.pooling,
            "max_document_length": encoder.config.max_document_length,
            "removed_normalize": bool(encoder.config.extra.get("removed_normalize")),
        },
        "plots": [],
    }

    plan.begin(stage["magnitude"])
    sig = magnitude_signal(cache, dataset, encoder.similarity, progress=progress)
    report["magnitude"] = sig.to_dict()
    if sampled:
        report["magnitude"]["verdict"] += f"; measured on {sampled}"
    if cache_path is not None:
        cache.save(cache_path)
    if out_dir is not None:
        report["plots"] += _magnitude_plots(sig, out_dir, name, "")
    folder = Path(str(model)) if isinstance(model, (str, Path)) else None
    if folder is not None and folder.is_dir():
        summary, made = _training(folder, out_dir, "")
        if summary is not None:
            report["training"] = summary
            report["plots"] += made
    plan.end(stage["magnitude"])

    report["runs"] = []
    for run in runs:
        plan.begin(stage[f"run:{run}"])
        run_name = encoder_name(run)
        run_encoder = _load_encoder(run)
        run_cache, run_cache_path = _cache_for(run_encoder, cache_dir, progress)
        run_sig = magnitude_signal(run_cache, dataset, run_encoder.similarity, progress=progress)
        if run_cache_path is not None:
            run_cache.save(run_cache_path)
        entry = {"model": str(run), "name": run_name, **run_sig.to_dict()}
        summary, made = _training(Path(run), out_dir, f"{Path(run).name}-")
        if summary is not None:
            entry["training"] = summary
            report["plots"] += made
        if out_dir is not None:
            report["plots"] += _magnitude_plots(run_sig, out_dir, run_name, f"{Path(run).name}-")
        report["runs"].append(entry)
        del run_encoder, run_cache
        plan.end(stage[f"run:{run}"])

    if sts_pairs is not None:
        plan.begin(stage["symmetry"])
        rows = symmetry_check(
            cache, sts_pairs, name=sts_name, own=encoder.similarity, progress=progress
        )
        report["sts"] = rows
        report["symmetry_verdict"] = symmetry_verdict(rows)
        if out_dir is not None:
            from magretrieve.diagnose import plots

            report["plots"].append(
                str(
                    plots.symmetry_bars(
                        rows, out_dir / "sts_symmetry.png", f"{name}: task symmetry on {sts_name}"
                    )
                )
            )
        if cache_path is not None:
            cache.save(cache_path)
        plan.end(stage["symmetry"])

    if skip_probes:
        report["side"] = {"skipped": True}
    else:
        side: dict[str, Any] = {}
        if plan.begin(stage["delta_cv"]):
            side["delta_cv"] = delta_cv(
                encoder,
                pairs,
                steps=probe_steps,
                batch_size=probe_batch_size,
                lr=probe_lr,
                seed=seed,
                max_document_length=probe_max_document_length,
                progress=progress,
            ).to_dict()
            plan.end(stage["delta_cv"])
        else:
            side["delta_cv"] = {"skipped": True, "reason": stage["delta_cv"].skipped}
        if plan.begin(stage["fisher"]):
            side["fisher"] = fisher_kappa(
                encoder,
                pairs,
                n_batches=fisher_batches,
                batch_size=probe_batch_size,
                sketch_dim=fisher_sketch_dim,
                seed=seed,
                max_document_length=probe_max_document_length,
                progress=progress,
            ).to_dict()
            plan.end(stage["fisher"])
        else:
            side["fisher"] = {"skipped": True, "reason": stage["fisher"].skipped}
        if side["delta_cv"].get("skipped") and side["fisher"].get("skipped"):
            side["skipped"] = True
        report["side"] = side

    side = report["side"]
    dcv, fis = side.get("delta_cv") or {}, side.get("fisher") or {}
    figures = {
        "removed_normalize": report["encoder"]["removed_normalize"],
        "cohens_d": sig.cohens_d,
        "norm_cv": sig.norm_cv,
        "delta_cv": dcv.get("delta_cv"),
        "kappa": fis.get("kappa"),
        "sts": report.get("sts"),
    }
    report["recommendation"] = recommend(figures).to_dict()
    if results_dir is not None and not side.get("skipped"):
        from magretrieve.diagnose.validate import validation_rows

        report["validation"] = validation_rows(
            {"delta_cv": dcv.get("prediction", ""), "kappa": fis.get("prediction", "")},
            results_dir,
        )
    report["verdict"] = verdict_text(report)
    report["seconds"] = time.perf_counter() - started
    report["plan"] = plan.to_dict()
    if out_dir is not None:
        from magretrieve.diagnose.html import write_html

        report["html"] = str(write_html(report, out_dir))
        report["report"] = str(write_report(report, out_dir))
    return report
