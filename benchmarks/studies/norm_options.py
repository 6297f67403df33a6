"""Magnitude options for a normalization-pretrained encoder (all-MiniLM-L6-v2), side by side.

Cheap options reuse the zero-shot embeddings cached once by ``_normhead_cache.py``:

* zero-shot cosine and zero-shot qnorm (raw norms) — references;
* frozen encoder + norm head (linear, linear bounded 0.5·tanh, 2-layer MLP), trained on the
  cached unit vectors with qnorm InfoNCE, hard negatives = zero-shot top-30 non-relevant;
* the corpus hub prior exp(−β·z), on the zero-shot vectors and (``--tuned``) on top of
  fine-tuned cosine models.

Every hyperparameter is chosen on scifact *train*: heads on a validation split of 20 % of the
training queries (learning rate and number of epochs), β of the prior on all training
queries. Test sets (scifact test, cranfield) are only scored. The fine-tuned runs of
``benchmarks/quality.py`` (its per-run JSON, ``--quality``) are read and shown next to them,
so every row shares one document length and one training budget. The committed table:

    C=.cache/normhead128 Q=.cache/quality/runs
    flock .cache/cpu.lock python benchmarks/_normhead_cache.py $C --max-doc-length 128
    for s in 42 43; do flock .cache/cpu.lock python benchmarks/_normhead_cache.py \
        $C/cosine-s$s --model $Q/cosine-s$s; done
    flock .cache/cpu.lock python benchmarks/study.py norm_options --cache $C \
        --tuned $C/cosine-s42 --tuned $C/cosine-s43 --out benchmarks/results/norm_options.md
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import numpy as np
from _common import recorded_command

from magretrieve.core import metrics
from magretrieve.data.readers import load_beir
from magretrieve.evaluation.retrieval import exact_search, magnitude_statistics
from magretrieve.priors.base import unit
from magretrieve.priors.hub import hub_scores
from magretrieve.priors.select import choose_prior

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
HEADS = {
    "linear": {"kind": "linear", "bound": 0.0},
    "linear-tanh0.5": {"kind": "linear", "bound": 0.5},
    "mlp": {"kind": "mlp", "bound": 0.0},
}
LRS = (1e-3, 3e-3)
MAX_EPOCHS = int(os.environ.get("NH_MAX_EPOCHS", "30"))
SEEDS = (42, 43)


def load_cached(cache: Path, name: str, part: str) -> tuple[list[str], np.ndarray]:
    data = np.load(cache / f"{name}-{part}.npz")
    return [str(x) for x in data["ids"]], data["raw"].astype(np.float32)


class Split:
    """One evaluation set over cached vectors: query/document rows and qrels."""

    def __init__(self, label, qids, q_raw, doc_ids, d_raw, qrels):
        self.label = label
        self.qids = [q for q in qids if q in qrels]
        row = {q: i for i, q in enumerate(qids)}
        self.q_unit = unit(q_raw[[row[q] for q in self.qids]])
        self.doc_ids = doc_ids
        self.d_raw = d_raw
        self.d_unit = unit(d_raw)
        self.qrels = {q: qrels[q] for q in self.qids}

    def score(self, stored: np.ndarray, norms: np.ndarray | None = None) -> dict[str, float]:
        """NDCG@10 of unit queries against ``stored``; Cohen's d of ``norms`` (default: stored)."""
        q = self.q_unit
        idx, scores = exact_search(q, stored, 100)
        run = {
            qid: {self.doc_ids[j]: float(s) for j, s in zip(idx[r], scores[r], strict=True)}
            for r, qid in enumerate(self.qids)
        }
        m = metrics.retrieval_metrics(self.qrels, run)
        mags = magnitude_statistics(
            np.linalg.norm(stored, axis=1) if norms is None else norms,
            idx,
            self.qids,
            self.doc_ids,
            self.qrels,
        )
        return {"ndcg@10": m["ndcg@10"], "cohens_d": mags["cohens_d"], "norm_cv": mags["norm_cv"]}


def load_splits(cache: Path, data: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, splits in (("scifact", ("train", "test")), ("cranfield", ("test",))):
        qids, q_raw = load_cached(cache, name, "queries")
        doc_ids, d_raw = load_cached(cache, name, "corpus")
        for split in splits:
            ds = load_beir(f"{data / name}:{split}")
            assert set(ds.corpus) == set(doc_ids), f"{name}: cached corpus differs"
            out[f"{name}:{split}"] = Split(f"{name}:{split}", qids, q_raw, doc_ids, d_raw, ds.qrels)
    return out


def sub_split(split: Split, qids: list[str], label: str) -> Split:
    s = object.__new__(Split)
    keep = [split.qids.index(q) for q in qids]
    s.label, s.qids, s.q_unit = label, list(qids), split.q_unit[keep]
    s.doc_ids, s.d_raw, s.d_unit = split.doc_ids, split.d_raw, split.d_unit
    s.qrels = {q: split.qrels[q] for q in qids}
    return s


def training_rows(split: Split, top: int = 30):
    """(query row, doc row) positives and zero-shot top-``top`` non-relevant hard negatives."""
    col = {d: j for j, d in enumerate(split.doc_ids)}
    positives = [
        (r, col[d]) for r, q in enumerate(split.qids) for d, s in split.qrels[q].items() if s > 0
    ]
    idx, _ = exact_search(split.q_unit, split.d_unit, top)
    negatives = {
        r: [int(j) for j in idx[r] if split.qrels[q].get(split.doc_ids[j], 0) <= 0]
        for r, q in enumerate(split.qids)
    }
    return positives, negatives


def head_stored(head, d_unit: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        g = head(torch.from_numpy(d_unit)).numpy()
    return apply_magnitudes(d_unit, np.exp(g))


def train_head(split: Split, spec: dict, lr: float, epochs: int, seed: int, on_epoch=None):
    """Train a head for ``epochs`` on ``split``; ``on_epoch(epoch, head)`` is called after each."""
    from magretrieve.train.heads import train_head_on_vectors

    positives, negatives = training_rows(split)
    head, _ = train_head_on_vectors(
        split.q_unit,
        split.d_unit,
        positives,
        negatives,
        kind=spec["kind"],
        bound=spec["bound"],
        epochs=epochs,
        lr=lr,
        seed=seed,
        on_epoch=on_epoch,
    )
    return head


def validation_split(train: Split, fraction: float = 0.2, seed: int = 42) -> tuple[Split, Split]:
    """Same rule as trainer.split_validation: shuffle sorted qids, hold out the first 20 %."""
    qids = sorted(train.qids)
    random.Random(seed).shuffle(qids)
    held = set(qids[: max(1, round(fraction * len(qids)))])
    fit = [q for q in train.qids if q not in held]
    val = [q for q in train.qids if q in held]
    return sub_split(train, fit, "scifact:train-fit"), sub_split(
        train, val, "scifact:train-validation"
    )


def read_results(pattern_dir: Path, prefix: str) -> list[dict[str, Any]]:
    rows = []
    if not pattern_dir.is_dir():
        return rows
    for path in sorted(pattern_dir.glob(f"{prefix}-s*.json")):
        try:
            rows.append({"file": str(path), **json.loads(path.read_text())})
        except (OSError, json.JSONDecodeError):
            continue
    return rows


def find_metric(obj: Any, dataset: str, key: str) -> float | None:
    """Dig ``key`` for ``dataset`` out of a results JSON of unknown nesting."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if dataset in str(k) and isinstance(v, dict) and key in v:
                return float(v[key])
            if isinstance(v, dict | list):
                found = find_metric(v, dataset, key)
                if found is not None:
                    return found
        if obj.get("dataset", "").startswith(dataset) and key in obj:
            return float(obj[key])
    if isinstance(obj, list):
        for v in obj:
            found = find_metric(v, dataset, key)
            if found is not None:
                return found
    return None


#: quality.py configurations shown next to the options (fine-tuned with the same settings).
QUALITY_ROWS = {
    "cosine": "fine-tuned cosine",
    "qnorm": "fine-tuned qnorm (paper recipe)",
    "dnorm": "fine-tuned dnorm",
    "learnable-warm": "fine-tuned learnable, γ from 0.95",
    "calibrated-qnorm": "fine-tuned calibrated qnorm",
    "head-joint": "fine-tuned encoder + linear head (joint)",
}


def add_external(results, add, quality: Path, tests: list[Split]) -> None:
    """Fine-tuned runs of benchmarks/quality.py (its per-run JSON), when present."""
    for prefix, label in QUALITY_ROWS.items():
        for r in read_results(quality, prefix):
            row = {}
            for t in tests:
                base = t.label.split(":")[0]
                ndcg = find_metric(r, base, "ndcg_at_10")
                row[t.label] = {
                    "ndcg@10": ndcg if ndcg is not None else find_metric(r, base, "ndcg@10"),
                    "cohens_d": find_metric(r, base, "cohens_d"),
                }
            add(f"{label} (quality.py)", Path(r["file"]).stem, row)


def apply_magnitudes(d_unit: np.ndarray, magnitudes: np.ndarray) -> np.ndarray:
    """Stored vectors ``d̂·m`` (float32)."""
    return (np.asarray(d_unit, dtype=np.float32) * magnitudes[:, None]).astype(np.float32)


@dataclass
class PriorChoice:
    """β of the hub prior chosen on training queries (0 = cosine won) and every candidate."""

    beta: float
    k: int
    grid: dict[str, float]
    selection: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return self.selection


def prior_rows(train: Split, tests: list[Split]) -> tuple[Any, dict[str, dict[str, float]]]:
    """β chosen on ``train``'s queries; each test corpus gets its own hub statistics."""
    sel = choose_prior(
        train.q_unit,
        train.d_unit,
        train.qids,
        train.doc_ids,
        train.qrels,
        method="hub",
        chosen_on="scifact:train",
    )
    beta = float(getattr(sel.prior, "beta", 0.0))
    prior = PriorChoice(beta, int(getattr(sel.prior, "k", 10)), sel.grid, sel.to_dict())
    row = {}
    for t in tests:
        h = hub_scores(t.d_unit, prior.k)
        z = (h - h.mean()) / h.std()
        row[t.label] = t.score(apply_magnitudes(t.d_unit, np.exp(-beta * z)))
    return prior, row


def fmt_cell(values: list[float]) -> str:
    vals = [v for v in values if v is not None and np.isfinite(v)]
    if not vals:
        return "–"
    if len(vals) == 1:
        return f"{vals[0]:.3f}"
    return f"{np.mean(vals):.3f} ± {np.std(vals):.3f}"


@click.command()
@click.option(
    "--cache",
    type=click.Path(path_type=Path),
    default=Path(".cache/normhead128"),
    show_default=True,
)
@click.option("--data", type=click.Path(path_type=Path), default=DATA)
@click.option(
    "--quality",
    type=click.Path(path_type=Path),
    default=Path(".cache/quality/results"),
    show_default=True,
)
@click.option(
    "--tuned",
    "tuned",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Cache (_normhead_cache.py) of a fine-tuned cosine run, named <config>-s<seed>: adds "
    "'fine-tuned cosine + corpus prior' for it (β chosen on its own training-query scores).",
)
@click.option(
    "--out", type=click.Path(path_type=Path), default=Path("benchmarks/results/norm_options.md")
)
@click.option(
    "--refresh-external",
    is_flag=True,
    help="Keep the computed rows of --out's JSON; only re-read the fine-tuned runs.",
)
def main(
    cache: Path,
    data: Path,
    quality: Path,
    tuned: tuple[Path, ...],
    out: Path,
    refresh_external: bool,
) -> None:
    import torch

    torch.set_num_threads(1)  # tiny ops: one thread is 4x faster than two on a busy machine
    started = time.perf_counter()
    splits = load_splits(cache, data)
    train, tests = splits["scifact:train"], [splits["scifact:test"], splits["cranfield:test"]]
    results: dict[str, Any] = {"rows": {}, "selection": {}}

    def add(name: str, seed: Any, per_set: dict[str, dict[str, float]]) -> None:
        results["rows"].setdefault(name, {})[str(seed)] = per_set

    if refresh_external:
        results = json.loads(out.with_suffix(".json").read_text())
        results["rows"] = {
            k: v for k, v in results["rows"].items() if not k.endswith("(quality.py)")
        }
        add_external(results, add, quality, tests)
        out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=float) + "\n")
        out.write_text(render(results, tests))
        click.echo(out.read_text())
        return

    # references (Cohen's d of the raw norms, as the table reports it)
    add(
        "zero-shot cosine",
        "-",
        {t.label: t.score(t.d_unit, np.linalg.norm(t.d_raw, axis=1)) for t in tests},
    )
    add("zero-shot qnorm (raw norms)", "-", {t.label: t.score(t.d_raw) for t in tests})

    # frozen encoder + head: select lr and epochs on the validation split
    fit, val = validation_split(train)
    for name, spec in HEADS.items():
        best = (-1.0, None, None)
        curve: dict[str, list[float]] = {}
        for lr in LRS:
            scores: list[float] = []

            def on_epoch(epoch, head, scores=scores):
                scores.append(val.score(head_stored(head, val.d_unit))["ndcg@10"])

            train_head(fit, spec, lr, MAX_EPOCHS, 42, on_epoch)
            curve[f"{lr:g}"] = scores
            epoch = int(np.argmax(scores)) + 1
            if scores[epoch - 1] > best[0]:
                best = (scores[epoch - 1], lr, epoch)
        val_cos = val.score(val.d_unit)["ndcg@10"]
        results["selection"][name] = {
            "lr": best[1],
            "epochs": best[2],
            "validation_ndcg@10": best[0],
            "validation_cosine_ndcg@10": val_cos,
            "curves": curve,
        }
        for seed in SEEDS:
            head = train_head(train, spec, best[1], best[2], seed)
            add(
                f"frozen encoder + {name} head",
                seed,
                {t.label: t.score(head_stored(head, t.d_unit)) for t in tests},
            )
        click.echo(
            f"{name}: lr {best[1]} epochs {best[2]} (val {best[0]:.4f} vs cosine {val_cos:.4f})"
        )

    # corpus prior: β on all training queries; z recomputed on each corpus
    prior, row = prior_rows(train, tests)
    results["selection"]["corpus prior"] = prior.to_dict()
    add(f"corpus prior on zero-shot (β={prior.beta:g})", "-", row)
    click.echo(f"corpus prior: β={prior.beta} grid {prior.grid}")

    # the same prior on top of fine-tuned cosine models (no further training)
    for folder in tuned:
        t_splits = load_splits(folder, data)
        t_tests = [t_splits["scifact:test"], t_splits["cranfield:test"]]
        seed = folder.name.rsplit("-s", 1)[-1]
        add(
            "fine-tuned cosine (re-encoded)",
            seed,
            {t.label: t.score(t.d_unit, np.linalg.norm(t.d_raw, axis=1)) for t in t_tests},
        )
        t_prior, t_row = prior_rows(t_splits["scifact:train"], t_tests)
        results["selection"][f"corpus prior on {folder.name}"] = t_prior.to_dict()
        add("fine-tuned cosine + corpus prior (β per seed)", seed, t_row)
        click.echo(f"{folder.name}: corpus prior β={t_prior.beta} grid {t_prior.grid}")

    add_external(results, add, quality, tests)

    results["seconds"] = time.perf_counter() - started
    results["command"] = recorded_command()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=float) + "\n")
    out.write_text(render(results, tests))
    click.echo(out.read_text())


def render(results: dict[str, Any], tests: list[Split]) -> str:
    lines = [
        "# Magnitude options for all-MiniLM-L6-v2 (normalization-pretrained)",
        "",
        "Generated by `benchmarks/study.py norm_options` (cached zero-shot embeddings; heads trained on",
        "them). NDCG@10, mean ± std over seeds where there are several; Cohen's d of the stored",
        "document norms (relevant vs non-relevant in each query's top-100) after training.",
        "Hyperparameters chosen on scifact train only (validation split / training queries).",
        "",
        f"Command: `{results.get('command', '')}`",
        "",
        "| option | seeds | scifact test | cranfield | Cohen's d scifact | Cohen's d cranfield |",
        "|---|---|---|---|---|---|",
    ]
    for name, by_seed in results["rows"].items():
        runs = list(by_seed.values())
        cells = []
        for key in ("ndcg@10", "cohens_d"):
            for t in tests:
                cells.append(fmt_cell([r.get(t.label, {}).get(key) for r in runs]))
        seeds = ", ".join(s for s in by_seed if s != "-") or "deterministic"
        lines.append(f"| {name} | {seeds} | {cells[0]} | {cells[1]} | {cells[2]} | {cells[3]} |")
    lines += ["", "## Selection (scifact train only)", ""]
    for name, sel in results["selection"].items():
        shown = {k: v for k, v in sel.items() if k not in ("curves", "grid")}
        lines.append(f"- **{name}**: {json.dumps(shown, default=float)}")
        if "grid" in sel:
            lines.append(f"  - NDCG@10 of training queries per β: {json.dumps(sel['grid'])}")
    lines += ["", f"Run time: {results['seconds']:.0f} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
