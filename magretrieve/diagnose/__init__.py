"""`magretrieve diagnose`: does magnitude carry signal, which side to normalize, and when not to.

:func:`diagnose` runs the parts and returns one JSON-able report:

* :mod:`.magnitude` — corpus norm CV, Cohen's d of raw norms (relevant vs non-relevant in
  the top-100), norm–length correlation; for the model and for any trained runs passed;
* :mod:`.side` — ΔCV probe trainings (paper v1) and the experimental Fisher κ;
* :mod:`.symmetry` — STS Spearman per mode in both orders and the asymmetry;
* :mod:`.plots` — PNG figures; :mod:`.report` — the recommendation and ``diagnose.json``;
  :mod:`.html` — ``diagnose.html``, the same report as one self-contained page.

Torch is imported only when this package is used (``import magretrieve`` stays torch-free).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from magretrieve.data.readers import RetrievalDataset, SentencePair, load_beir, load_sentence_pairs
from magretrieve.diagnose.cache import EmbeddingCache, model_fingerprint
from magretrieve.diagnose.magnitude import MagnitudeSignal, magnitude_signal
from magretrieve.diagnose.report import recommend, verdict_text, write_report
from magretrieve.diagnose.side import delta_cv, fisher_kappa
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


def _training(
    folder: Path, out: Path | None, label: str
) -> tuple[dict[str, Any] | None, list[str]]:
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

        stem = "" if label == "model" else f"{folder.name}-"
        plots_made.append(
            str(
                plots.training_curves(
                    log, out / f"{stem}training.png", f"{folder.name}: {summary['mode']} training"
                )
            )
        )
    return summary, plots_made


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
    cache_dir: str | Path | None = None,
    results_dir: str | Path | None = None,
    seed: int = 42,
    progress: bool = True,
) -> dict[str, Any]:
    """Diagnose ``model`` on a BEIR split ``data`` (``DIR:split``, default split ``train``).

    Returns the report dict (also written to ``out/diagnose.json`` with PNG plots when
    ``out`` is given). ``runs`` are trained run folders whose magnitude figures are reported
    next to the model's. ``cache_dir`` keeps raw embeddings between invocations.
    ``results_dir`` holds measured ``qnorm-s*.json``/``dnorm-s*.json`` runs to validate the
    side predictors against (see :mod:`.validate`).
    """
    started = time.perf_counter()
    dataset = data if isinstance(data, RetrievalDataset) else load_beir(data, default_split="train")
    sts_pairs = None
    sts_name = "sts"
    if sts is not None:
        if isinstance(sts, (str, Path)):
            sts_name = f"{Path(sts).parent.name}/{Path(sts).stem}"
            sts_pairs = load_sentence_pairs(sts)
        else:
            sts_pairs = list(sts)
    out_dir = Path(out) if out is not None else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)

    encoder = _load_encoder(model)
    cache, cache_path = _cache_for(encoder, cache_dir, progress)
    report: dict[str, Any] = {
        "model": str(model) if not hasattr(model, "config") else model.config.base_model,
        "data": f"{dataset.name}:{dataset.split}",
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

    sig = magnitude_signal(cache, dataset, encoder.similarity, progress=progress)
    report["magnitude"] = sig.to_dict()
    if cache_path is not None:
        cache.save(cache_path)
    if out_dir is not None:
        report["plots"] += _magnitude_plots(sig, out_dir, "model", "")
    folder = Path(str(model)) if isinstance(model, (str, Path)) else None
    if folder is not None and folder.is_dir():
        summary, made = _training(folder, out_dir, "model")
        if summary is not None:
            report["training"] = summary
            report["plots"] += made

    report["runs"] = []
    for run in runs:
        run_encoder = _load_encoder(run)
        run_cache, run_cache_path = _cache_for(run_encoder, cache_dir, progress)
        run_sig = magnitude_signal(run_cache, dataset, run_encoder.similarity, progress=progress)
        if run_cache_path is not None:
            run_cache.save(run_cache_path)
        entry = {"model": str(run), **run_sig.to_dict()}
        summary, made = _training(Path(run), out_dir, "run")
        if summary is not None:
            entry["training"] = summary
            report["plots"] += made
        if out_dir is not None:
            report["plots"] += _magnitude_plots(
                run_sig, out_dir, Path(run).name, f"{Path(run).name}-"
            )
        report["runs"].append(entry)
        del run_encoder, run_cache

    pairs = dataset.training_pairs()
    if skip_probes:
        report["side"] = {"skipped": True}
    else:
        dcv = delta_cv(
            encoder,
            pairs,
            steps=probe_steps,
            batch_size=probe_batch_size,
            lr=probe_lr,
            seed=seed,
            max_document_length=probe_max_document_length,
            progress=progress,
        )
        kappa = fisher_kappa(
            encoder,
            pairs,
            n_batches=fisher_batches,
            batch_size=probe_batch_size,
            sketch_dim=fisher_sketch_dim,
            seed=seed,
            max_document_length=probe_max_document_length,
            progress=progress,
        )
        report["side"] = {"delta_cv": dcv.to_dict(), "fisher": kappa.to_dict()}

    if sts_pairs is not None:
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
                        rows, out_dir / "sts_symmetry.png", f"task symmetry on {sts_name}"
                    )
                )
            )
        if cache_path is not None:
            cache.save(cache_path)

    side = report["side"]
    figures = {
        "removed_normalize": report["encoder"]["removed_normalize"],
        "cohens_d": sig.cohens_d,
        "norm_cv": sig.norm_cv,
        "delta_cv": side.get("delta_cv", {}).get("delta_cv"),
        "kappa": side.get("fisher", {}).get("kappa"),
        "sts": report.get("sts"),
    }
    report["recommendation"] = recommend(figures).to_dict()
    if results_dir is not None and not side.get("skipped"):
        from magretrieve.diagnose.validate import validation_rows

        report["validation"] = validation_rows(
            {"delta_cv": side["delta_cv"]["prediction"], "kappa": side["fisher"]["prediction"]},
            results_dir,
        )
    report["verdict"] = verdict_text(report)
    report["seconds"] = time.perf_counter() - started
    if out_dir is not None:
        from magretrieve.diagnose.html import write_html

        report["html"] = str(write_html(report, out_dir))
        report["report"] = str(write_report(report, out_dir))
    return report
