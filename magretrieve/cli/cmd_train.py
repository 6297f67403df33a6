"""`magretrieve train`: fine-tune an encoder under a similarity mode."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from magretrieve.cli._common import device_option, model_option
from magretrieve.cli._group import main
from magretrieve.cli._options import click_options
from magretrieve.core.similarity import MODES
from magretrieve.core.training import TrainConfig

F = TypeVar("F", bound=Callable[..., Any])


def _settings(*names: str) -> Callable[[F], F]:
    """The options of these :class:`TrainConfig` settings, in this order (their flags,
    defaults and help are the config's declarations)."""
    return click_options(TrainConfig.named(name) for name in names)


@main.command("train")
@model_option("Hugging Face or sentence-transformers folder (or hub name).")
@click.option(
    "--train",
    "train_spec",
    required=True,
    help="BEIR DIR:split (default split train) or pairs .jsonl.",
)
@click.option("--mode", type=click.Choice(MODES), default="qnorm", show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Run folder to write.")
@click.option(
    "--eval",
    "eval_specs",
    multiple=True,
    help="BEIR DIR:split to evaluate after each epoch (reported, not used to pick a checkpoint).",
)
@_settings("epochs", "batch_size", "lr", "gamma_lr")
@click.option(
    "--gamma-init",
    type=float,
    default=None,
    help="Initial γ (both sides) for --mode learnable (paper: 0.5).",
)
@_settings("scale", "seed", "task", "force", "hard_negatives")
@click.option(
    "--mine-hard-negatives",
    is_flag=True,
    help="Mine hard negatives with the starting model (BEIR training data).",
)
@click.option(
    "--val-fraction",
    type=float,
    default=0.0,
    show_default=True,
    help="Hold out this fraction of training queries; keep the best checkpoint by their NDCG@10.",
)
@_settings("max_steps")
@click.option("--pooling", type=click.Choice(["mean", "cls", "last"]), default=None)
@click.option("--max-query-length", type=int, default=None)
@click.option("--max-doc-length", type=int, default=None)
@click.option("--query-prefix", default=None)
@click.option("--doc-prefix", default=None)
@click.option(
    "--norm-head",
    type=click.Choice(["none", "linear", "mlp"]),
    default=None,
    help="Document norm head d̂·exp(g(d̂)), zero at init (starts as cosine); needs a mode "
    "keeping document magnitude (qnorm, dot, learnable).",
)
@click.option("--norm-head-hidden", type=int, default=None, help="Hidden width of the MLP head.")
@click.option(
    "--norm-head-bound",
    type=float,
    default=None,
    help="Bound the head's log-magnitude to ±B (B·tanh(g/B)); 0 = unbounded.",
)
@_settings("head_lr")
@click.option(
    "--freeze-encoder",
    is_flag=True,
    help="Train only the norm head (and learnable γ); the transformer stays as loaded.",
)
@click.option(
    "--calibrate-scale",
    is_flag=True,
    help="Divide raw vectors by the training corpus's mean document norm (measured first).",
)
@_settings("precision", "mini_batch_size")
@device_option("Train on a CUDA GPU with torch (cuda) or on the CPU.")
@click.option("--json", "as_json", is_flag=True, help="Print the final summary as JSON.")
def train_command(
    model: str,
    train_spec: str,
    mode: str,
    out: str,
    eval_specs: tuple[str, ...],
    gamma_init: float | None,
    mine_hard_negatives: bool,
    val_fraction: float,
    pooling: str | None,
    max_query_length: int | None,
    max_doc_length: int | None,
    query_prefix: str | None,
    doc_prefix: str | None,
    norm_head: str | None,
    norm_head_hidden: int | None,
    norm_head_bound: float | None,
    freeze_encoder: bool,
    calibrate_scale: bool,
    device: str,
    as_json: bool,
    **settings: Any,
) -> None:
    """Fine-tune MODEL with InfoNCE under --mode and save it to --out.

    Under ``torchrun --nproc-per-node N -m magretrieve train ...`` it trains with
    DistributedDataParallel (gloo on CPU, NCCL on GPUs): each rank takes --batch-size pairs and
    the loss sees all N·batch in-batch negatives; rank 0 writes --out.
    """
    cfg = TrainConfig(**settings)  # a bad setting is one line, before anything loads
    from dataclasses import replace
    from pathlib import Path

    from magretrieve.cli._common import print_json, print_table, require_torch
    from magretrieve.core.errors import ConfigError
    from magretrieve.data.readers import load_beir, read_training_data

    require_torch("magretrieve train")
    from magretrieve.train import distributed, mining, trainer

    # under torchrun (WORLD_SIZE > 1): join the process group, one device per rank
    rank, world_size, rank_device = distributed.init_distributed()
    if rank_device is not None:  # NCCL: this rank's GPU, whatever --device says
        device = rank_device
    if world_size > 1 and freeze_encoder:
        raise ConfigError(
            "--freeze-encoder trains the head on cached vectors in one process (seconds); "
            "run it without torchrun"
        )
    if not cfg.force:  # fail before loading anything (train() itself warns once when forced)
        trainer.check_task(mode, cfg.task, cfg.force)
    out_path = Path(out)
    if out_path.exists() and any(out_path.iterdir()) and not cfg.force:
        raise ConfigError(f"{out_path}: exists and is not empty (pass --force to overwrite)")
    training = read_training_data(train_spec)
    pairs, dataset = training.pairs, training.dataset
    reports = [load_beir(s) for s in eval_specs]

    from magretrieve.train.encoder import Encoder

    gamma = (
        {"gamma_q": gamma_init, "gamma_d": gamma_init}
        if mode == "learnable" and gamma_init is not None
        else {}
    )
    encoder = Encoder.load(
        model,
        mode,
        pooling=pooling,
        max_query_length=max_query_length,
        max_document_length=max_doc_length,
        query_prefix=query_prefix,
        document_prefix=doc_prefix,
        norm_head=norm_head,
        norm_head_hidden=norm_head_hidden,
        norm_head_bound=norm_head_bound,
        device=device,
        **gamma,
    )
    if freeze_encoder:
        if encoder.norm_head is None and mode != "learnable":
            raise ConfigError(
                "--freeze-encoder leaves nothing to train; add --norm-head linear|mlp "
                "(or use --mode learnable)"
            )
        cfg = replace(cfg, trainable=["norm_head", "gamma_logits"])
        encoder.config.head = replace(encoder.config.head, frozen_encoder=True)
    if calibrate_scale:
        from magretrieve.train.calibration import calibrate

        documents = (
            [d.full_text for d in dataset.corpus.values()]
            if dataset is not None
            else [p.positive for p in pairs] + [n for p in pairs for n in p.negatives]
        )
        c = calibrate(encoder, documents, progress=rank == 0)
        if rank == 0:
            click.echo(f"norm calibration: raw vectors divided by c = {c:.4f}")
    pairs, validation = trainer.split_validation(pairs, dataset, val_fraction, cfg.seed)
    if mine_hard_negatives:
        if dataset is None:
            raise ConfigError("--mine-hard-negatives needs BEIR training data (DIR:split)")
        cfg = replace(cfg, hard_negatives=max(cfg.hard_negatives, 1))
        pairs = mining.mine_hard_negatives(encoder, dataset, pairs, cfg.hard_negatives)
    if freeze_encoder and encoder.norm_head is not None and mode != "learnable":
        # Frozen encoder: encode every text once and train the head on the cached vectors.
        if cfg.precision != "fp32":
            click.echo(
                f"warning: --precision {cfg.precision} has no effect with --freeze-encoder (the head "
                "trains on cached float32 vectors)",
                err=True,
            )
        if validation is not None:
            click.echo("note: --val-fraction is not used with a frozen encoder (fixed epochs)")
        result = trainer.train_frozen(encoder, pairs, cfg, report=reports, out_dir=out_path)
    else:
        result = trainer.train(
            encoder, pairs, cfg, validation=validation, report=reports, out_dir=out_path
        )
    if world_size > 1:
        distributed.finish_distributed()
    if rank != 0:  # rank 0 wrote the run folder and prints the summary
        return
    log = result.log
    summary = {
        "out": str(out_path),
        "mode": encoder.config.mode,
        "gamma_q": log["final_gamma_q"],
        "gamma_d": log["final_gamma_d"],
        "steps": log["total_steps"],
        "seconds": log["seconds"],
        "final_loss": log["steps"][-1]["loss"] if log["steps"] else None,
        "best_step": result.best_step,
        "evaluations": result.evaluations[-1] if result.evaluations else None,
    }
    if as_json:
        print_json(summary)
        return
    click.echo(
        f"saved {out_path}  (mode {summary['mode']}, γq {summary['gamma_q']:.3f}, γd {summary['gamma_d']:.3f}, "
        f"{summary['steps']} steps in {summary['seconds']:.0f}s, final loss {summary['final_loss']:.4f})"
    )
    if result.evaluations:
        last = result.evaluations[-1]
        rows = [
            (name, v["ndcg_at_10"], v["recall_at_100"], v["mrr_at_10"], v["cohens_d"])
            for name, v in last.items()
            if isinstance(v, dict)
        ]
        print_table(["data", "NDCG@10", "R@100", "MRR@10", "Cohen's d ‖d‖"], rows)
