"""Training speed: our trainer vs sentence-transformers MNRL, fp32 and bf16, side by side in one run.

Four configurations train the same model on the same pairs with the same batch size, learning
rate, logit scale and token limit:

  (a) ours fp32       magretrieve.train.trainer.train, mode cosine (MNRL's objective)
  (b) ST fp32         SentenceTransformerTrainer + MultipleNegativesRankingLoss
  (c) ours bf16       TrainConfig(precision="bf16"): bf16 autocast forward, fp32 weights/loss
  (d) ST bf16         the same with bf16=True in its training arguments

They run interleaved in rounds (a, b, c, d, a, b, c, d, ...) so that noise from other jobs on
the machine hits every configuration alike. Each run trains --warmup-steps + --steps steps and
times only the last --steps (wall time at the end of each optimizer step: our trainer's step
records, a TrainerCallback for sentence-transformers), so loading and setup are not counted.
The table gives the median steps/s over rounds, the ratio to ST fp32, and how many tokens
each batch really holds vs how many the padded batch computes (our length-bucketed batches
vs ST's random ones).

    python benchmarks/train_speed.py --model all-MiniLM-L6-v2 \
        --train ../shared/data/scifact:train
"""

from __future__ import annotations

import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from _common import cpu_lock, lock_option, recorded_command

from magretrieve.data.readers import load_training_data

#: (key, row label, trainer, precision) in the order each round runs them.
CONFIGS = (
    ("ours-fp32", "ours fp32", "ours", "fp32"),
    ("st-fp32", "sentence-transformers fp32", "st", "fp32"),
    ("ours-bf16", "ours bf16", "ours", "bf16"),
    ("st-bf16", "sentence-transformers bf16", "st", "bf16"),
)
BASELINE = "st-fp32"


def timed_rate(ends: list[float], warmup: int, start: float = 0.0) -> float:
    """Steps per second over the steps after ``warmup``.

    ``ends[i]`` is the wall time at the end of step ``i + 1``; ``start`` the time training
    began (the reference when ``warmup`` is 0).
    """
    if len(ends) <= warmup:
        raise ValueError(f"{len(ends)} step times leave none to time after {warmup} warm-up steps")
    reference = ends[warmup - 1] if warmup else start
    seconds = ends[-1] - reference
    return (len(ends) - warmup) / seconds if seconds > 0 else float("nan")


def padding_stats(tokens: list[int], padded: list[int]) -> dict[str, float]:
    """Mean real and padded tokens per batch, and the share of computed tokens that is padding."""
    real, total = statistics.fmean(tokens), statistics.fmean(padded)
    return {"tokens": real, "padded_tokens": total, "waste": 1 - real / total if total else 0.0}


def cpu_info() -> dict[str, Any]:
    """CPU model and whether it has bf16 matrix units (what decides bf16's payoff)."""
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"model": model, "bf16_units": sorted(flags & {"amx_bf16", "avx512_bf16", "amx_tile"})}


def run_ours(
    model: str, pairs: list, precision: str, settings: dict[str, Any], total: int
) -> dict[str, Any]:
    from magretrieve.train.encoder import Encoder
    from magretrieve.train.trainer import TrainConfig, train

    length = settings["max_doc_length"]  # one limit for both sides, like ST's max_seq_length
    encoder = Encoder.load(
        model, "cosine", device="cpu", max_query_length=length, max_document_length=length
    )
    cfg = TrainConfig(
        epochs=10**6,  # max_steps ends the run, however small the data
        max_steps=total,
        batch_size=settings["batch_size"],
        lr=settings["lr"],
        scale=settings["scale"],
        seed=settings["seed"],
        precision=precision,
        log_every=1,
    )
    steps = train(encoder, pairs, cfg, progress=False).log["steps"]
    return {
        "ends": [s["elapsed"] for s in steps],
        "start": 0.0,
        "tokens": [s["tokens"] for s in steps],
        "padded_tokens": [s["padded_tokens"] for s in steps],
    }


class _CountingCollator:
    """Wraps ST's data collator to count real (attention mask) and padded tokens per batch."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.tokens, self.padded = inner, [], []

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.inner(features)
        self.tokens.append(
            sum(int(v.sum()) for k, v in batch.items() if k.endswith("_attention_mask"))
        )
        self.padded.append(sum(v.numel() for k, v in batch.items() if k.endswith("_input_ids")))
        return batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run_st(
    model: str, pairs: list, precision: str, settings: dict[str, Any], total: int
) -> dict[str, Any]:
    """sentence-transformers' own trainer and MNRL loss, with the same batch, lr, scale, length."""
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer

    try:  # sentence-transformers >= 6 moved these; the old paths warn
        from sentence_transformers.sentence_transformer import losses
        from sentence_transformers.sentence_transformer.training_args import (
            BatchSamplers,
            SentenceTransformerTrainingArguments,
        )
    except ImportError:
        from sentence_transformers import SentenceTransformerTrainingArguments, losses
        from sentence_transformers.training_args import BatchSamplers
    from transformers import TrainerCallback

    from magretrieve.core.model_paths import resolve_model_path

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.start, self.ends = 0.0, []

        def on_train_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    st = SentenceTransformer(str(resolve_model_path(model)), device="cpu")
    st.max_seq_length = settings["max_doc_length"]
    data = Dataset.from_dict(
        {"anchor": [p.query for p in pairs], "positive": [p.positive for p in pairs]}
    )
    loss = losses.MultipleNegativesRankingLoss(st, scale=settings["scale"])
    clock = StepClock()
    with tempfile.TemporaryDirectory() as tmp:
        args = SentenceTransformerTrainingArguments(
            output_dir=tmp,
            max_steps=total,
            per_device_train_batch_size=settings["batch_size"],
            learning_rate=settings["lr"],
            warmup_steps=int(0.1 * total),  # what our trainer's warmup_ratio 0.1 gives
            lr_scheduler_type="cosine",
            weight_decay=0.01,
            max_grad_norm=1.0,
            seed=settings["seed"],
            batch_sampler=BatchSamplers.NO_DUPLICATES,
            save_strategy="no",
            report_to="none",
            logging_strategy="no",
            disable_tqdm=True,
            use_cpu=True,
            bf16=precision == "bf16",
        )
        trainer = SentenceTransformerTrainer(
            model=st, args=args, train_dataset=data, loss=loss, callbacks=[clock]
        )
        counter = _CountingCollator(trainer.data_collator)
        trainer.data_collator = counter
        trainer.train()
    return {
        "ends": clock.ends,
        "start": clock.start,
        # the loader may collate a batch ahead: keep the batches the steps trained on
        "tokens": counter.tokens[: len(clock.ends)],
        "padded_tokens": counter.padded[: len(clock.ends)],
    }


def summarize(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per configuration: median steps/s over rounds, ratio vs ST fp32, padding, or the error."""
    summary: dict[str, dict[str, Any]] = {}
    for key, label, _, precision in CONFIGS:
        runs = [r for r in records if r["config"] == key]
        if not runs:
            continue
        ok = [r for r in runs if "error" not in r]
        row: dict[str, Any] = {"label": label, "precision": precision}
        if not ok:
            row["error"] = runs[0]["error"]
        else:
            row["rates"] = [r["steps_per_second"] for r in ok]
            row["median"] = statistics.median(row["rates"])
            row.update(
                padding_stats(
                    [t for r in ok for t in r["tokens"]],
                    [t for r in ok for t in r["padded_tokens"]],
                )
            )
        summary[key] = row
    base = summary.get(BASELINE, {}).get("median")
    for row in summary.values():
        if "median" in row and base:
            row["vs_st_fp32"] = row["median"] / base
    return summary


def markdown(summary: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    s = meta["settings"]
    lines = [
        "# Training speed: our trainer vs sentence-transformers (MNRL), fp32 and bf16",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"CPU: {meta['cpu']['model']} (bf16 units: {', '.join(meta['cpu']['bf16_units']) or 'none'}),"
        f" {meta['threads']} torch threads; torch {meta['versions']['torch']},"
        f" transformers {meta['versions']['transformers']},"
        f" sentence-transformers {meta['versions']['sentence_transformers']}.",
        "",
        f"Settings: model {s['model']}, training data {s['train']}, batch {s['batch_size']},"
        f" lr {s['lr']}, scale {s['scale']}, max tokens {s['max_doc_length']} (queries and"
        f" documents), {s['steps']} timed steps after {s['warmup_steps']} warm-up steps,"
        f" {s['rounds']} interleaved rounds. Ours trains mode cosine (MNRL's objective) on"
        " length-bucketed batches; ST uses its NO_DUPLICATES sampler. Tokens per batch count"
        " queries and documents; waste is the share of computed (padded) tokens that is padding.",
        "",
        "| configuration | steps/s (median) | per round | vs ST fp32 | real tokens/batch"
        " | padded tokens/batch | padding waste |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in summary.values():
        if "error" in row:
            lines.append(f"| {row['label']} | error: {row['error']} | – | – | – | – | – |")
            continue
        ratio = f"{row['vs_st_fp32']:.2f}x" if "vs_st_fp32" in row else "–"
        rounds = ", ".join(f"{r:.3f}" for r in row["rates"])
        lines.append(
            f"| {row['label']} | {row['median']:.3f} | {rounds} | {ratio} | {row['tokens']:.0f}"
            f" | {row['padded_tokens']:.0f} | {100 * row['waste']:.1f}% |"
        )
    return "\n".join(lines) + "\n"


def _error_text(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, for a table cell
    return (text[:197] + "...") if len(text) > 200 else text.replace("|", "/")


@click.command()
@click.option("--model", default="all-MiniLM-L6-v2", show_default=True)
@click.option("--train", "train_spec", default="../shared/data/scifact:train", show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--lr", type=float, default=2e-5, show_default=True)
@click.option("--scale", type=float, default=20.0, show_default=True)
@click.option("--max-doc-length", type=int, default=256, show_default=True)
@click.option("--steps", type=click.IntRange(min=1), default=12, show_default=True)
@click.option(
    "--warmup-steps",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Steps run before timing starts.",
)
@click.option("--rounds", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--seed", type=int, default=42, show_default=True)
@click.option(
    "--out", type=click.Path(file_okay=False), default="benchmarks/results", show_default=True
)
@click.option("--name", default="train_speed", show_default=True)
@lock_option
@click.option("--threads", type=int, default=None, help="torch threads.")
def main(
    model,
    train_spec,
    batch_size,
    lr,
    scale,
    max_doc_length,
    steps,
    warmup_steps,
    rounds,
    seed,
    out,
    name,
    lock,
    threads,
):
    """Time ours vs sentence-transformers, fp32 and bf16, interleaved; write the table."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    def installed(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    if threads:
        torch.set_num_threads(threads)
    settings = {
        "model": model,
        "train": train_spec,
        "batch_size": batch_size,
        "lr": lr,
        "scale": scale,
        "max_doc_length": max_doc_length,
        "steps": steps,
        "warmup_steps": warmup_steps,
        "rounds": rounds,
        "seed": seed,
    }
    pairs = load_training_data(train_spec)
    total = warmup_steps + steps
    records: list[dict[str, Any]] = []
    runners = {"ours": run_ours, "st": run_st}
    with cpu_lock(lock):
        for rnd in range(rounds):
            for key, label, trainer, precision in CONFIGS:
                click.echo(f"round {rnd + 1}/{rounds}: {label}", err=True)
                record: dict[str, Any] = {"config": key, "round": rnd}
                try:
                    timing = runners[trainer](model, pairs, precision, settings, total)
                except Exception as exc:  # an ST failure is a result (e.g. bf16 on CPU)
                    if trainer == "ours":
                        raise
                    record["error"] = _error_text(exc)
                    click.echo(f"  {label}: {record['error']}", err=True)
                else:
                    if len(timing["ends"]) != total:
                        raise click.ClickException(
                            f"{label} ran {len(timing['ends'])} steps, expected {total}"
                            " (fewer training pairs than one batch?)"
                        )
                    record["steps_per_second"] = timed_rate(
                        timing["ends"], warmup_steps, timing["start"]
                    )
                    record["tokens"], record["padded_tokens"] = (
                        timing["tokens"],
                        timing["padded_tokens"],
                    )
                    click.echo(f"  {record['steps_per_second']:.3f} steps/s", err=True)
                records.append(record)
    meta = {
        "command": recorded_command(),
        "settings": settings,
        "cpu": cpu_info(),
        "threads": torch.get_num_threads(),
        "versions": {
            "torch": torch.__version__,
            "transformers": installed("transformers"),
            "sentence_transformers": installed("sentence-transformers"),
        },
    }
    summary = summarize(records)
    table = markdown(summary, meta)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.md").write_text(table)
    (out_dir / f"{name}.json").write_text(
        json.dumps({**meta, "summary": summary, "runs": records}, indent=1) + "\n"
    )
    click.echo(table)


if __name__ == "__main__":
    main()
