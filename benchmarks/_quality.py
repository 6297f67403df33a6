"""The training and evaluation core that benchmarks/quality.py, data_size.py and priors.py share.

One configuration (:class:`BenchConfig`) is trained with the settings of
:func:`train_settings` and evaluated with its own similarity on every eval set
(:func:`run_ours`); runs record what they were trained with, so a cached result of one
benchmark can be reused by another only when it was trained the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np

MODES = ("cosine", "dot", "qnorm", "dnorm", "learnable")


@dataclass
class BenchConfig:
    """One row of the benchmark: how to build, train (or not) and score a model."""

    name: str
    mode: str
    train: bool = True
    peer: bool = False
    encoder_kwargs: dict[str, Any] = field(default_factory=dict)
    train_kwargs: dict[str, Any] = field(default_factory=dict)
    describe: str = ""
    #: Divide raw vectors by the training corpus's mean document norm before training.
    calibrate: bool = False
    #: Take the trained model of this configuration (same seed) instead of training again.
    reuse: str = ""
    #: Score with the corpus prior on top (β chosen on the training queries).
    prior: bool = False


def evaluate_all(encoder: Any, evals: list[Any]) -> dict[str, Any]:
    from magretrieve.evaluation.retrieval import evaluate_retrieval

    return {f"{d.name}:{d.split}": evaluate_retrieval(encoder, d).to_dict() for d in evals}


def memoize_embeddings(encoder: Any, cache_dir: Path, tag: str) -> None:
    """Cache ``encoder.embed`` on disk: untrained configurations share one encoding per text set."""
    import hashlib

    original = encoder.embed

    def embed(texts, side, batch_size=64, progress=False):
        key = hashlib.sha256("\x1f".join([side, *texts]).encode()).hexdigest()[:20]
        path = cache_dir / f"{tag}-{side}-{key}.npy"
        if path.is_file():
            return np.load(path)
        out = original(texts, side, batch_size=batch_size, progress=progress)
        cache_dir.mkdir(parents=True, exist_ok=True)
        np.save(path, out)
        return out

    encoder.embed = embed


def train_settings(
    epochs: int, batch_size: int, lr: float, scale: float, max_steps: int | None = None
) -> dict[str, Any]:
    """The TrainConfig fields every configuration shares; stored with each cached result, so
    other benchmarks (data_size.py) can tell whether a cached run was trained the same way."""
    settings: dict[str, Any] = {
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "scale": scale,
        "warmup_ratio": 0.1,
    }
    if max_steps:
        settings["max_steps"] = max_steps
    return settings


def train_summary(log: dict[str, Any], encoder: Any) -> dict[str, Any]:
    """The part of a train log the benchmark keeps."""
    return {
        "steps": log["total_steps"],
        "seconds": log["seconds"],
        "steps_per_second": log["steps_per_second"],
        "first_loss": log["steps"][0]["loss"],
        "first_grad_norm": log["steps"][0]["grad_norm"],
        "final_loss": log["steps"][-1]["loss"],
        "norm_scale": encoder.config.norm_scale,
        "gamma_q": log["final_gamma_q"],
        "gamma_d": log["final_gamma_d"],
    }


def run_ours(
    cfg: BenchConfig,
    model: str,
    pairs: list,
    seed: int,
    settings: dict[str, Any],
    run_dir: Path,
    evals: list[Any],
    train_dataset: Any = None,
) -> dict[str, Any]:
    from magretrieve.train.encoder import Encoder
    from magretrieve.train.trainer import TrainConfig, train

    record: dict[str, Any] = {
        "config": cfg.name,
        "mode": cfg.mode,
        "seed": seed,
        "describe": cfg.describe,
    }
    if (cfg.calibrate or cfg.prior) and train_dataset is None:
        raise click.UsageError(f"{cfg.name} needs a BEIR training set (DIR:split)")
    reused = run_dir.parent / f"{cfg.reuse}-s{seed}" if cfg.reuse else None
    if reused is not None and (reused / "train_log.json").is_file():
        encoder = Encoder.load(reused)  # that configuration's trained model, as saved
        log = json.loads((reused / "train_log.json").read_text())
        record["train"] = {**train_summary(log, encoder), "reused": str(reused)}
        memoize_embeddings(encoder, run_dir.parent.parent / "embeddings", reused.name)
    else:
        encoder = Encoder.load(model, cfg.mode, **cfg.encoder_kwargs)
        if cfg.calibrate:
            from magretrieve.train.calibration import calibrate

            calibrate(encoder, [d.full_text for d in train_dataset.corpus.values()], progress=True)
        if not cfg.train:  # the starting weights: one encoding serves every zero-shot mode
            memoize_embeddings(encoder, run_dir.parent.parent / "embeddings", "zero-shot")
        if cfg.train:
            tc = TrainConfig(seed=seed, **settings, **cfg.train_kwargs)
            result = train(encoder, pairs, tc, out_dir=run_dir)
            record["train"] = train_summary(result.log, encoder)
    scorer = encoder
    if cfg.prior:
        from magretrieve.priors.fit import WithPrior, fit_prior

        selection = fit_prior(encoder, train_dataset, method="hub")  # β chosen, 0 = cosine
        record["prior"] = selection.to_dict()
        scorer = WithPrior(encoder, selection.prior)
    record["eval"] = evaluate_all(scorer, evals)
    return record
