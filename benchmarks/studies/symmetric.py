"""Symmetric-task check: what one-sided normalization does to STS.

Trains the encoder on STS-B train pairs (gold score ≥ 4 as positives) with the symmetric
InfoNCE loss (both directions) under cosine and dot, and under qnorm/dnorm *forced* (the
trainer refuses them on a symmetric task without force), then reports Spearman with the gold
scores on STS-B test in both argument orders, s(a,b) and s(b,a), and their mean gap.

    python benchmarks/study.py symmetric --model all-MiniLM-L6-v2 --data ../shared/data/stsb \
        --modes cosine,dot,qnorm,dnorm --out benchmarks/results
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
from _common import recorded_command

from magretrieve.data.readers import TrainingPair, load_sentence_pairs


@click.command()
@click.option("--model", required=True)
@click.option(
    "--data",
    required=True,
    type=click.Path(file_okay=False),
    help="STS folder with train/test.jsonl",
)
@click.option("--modes", default="cosine,dot,qnorm,dnorm")
@click.option("--epochs", type=int, default=1)
@click.option("--batch-size", type=int, default=32)
@click.option("--lr", type=float, default=2e-5)
@click.option("--seed", type=int, default=42)
@click.option(
    "--min-score", type=float, default=4.0, help="Train pairs with gold ≥ this are positives."
)
@click.option("--out", required=True, type=click.Path(file_okay=False))
@click.option("--threads", type=int, default=2)
def main(model, data, modes, epochs, batch_size, lr, seed, min_score, out, threads):
    """Train under each mode on STS-B train, evaluate Spearman on STS-B test in both orders."""
    import torch

    from magretrieve.evaluation.retrieval import evaluate_sts
    from magretrieve.train.encoder import Encoder
    from magretrieve.train.trainer import TrainConfig, train

    torch.set_num_threads(threads)
    folder = Path(data)
    train_pairs = [
        TrainingPair(p.a, p.b)
        for p in load_sentence_pairs(folder / "train.jsonl")
        if p.score >= min_score
    ]
    test = load_sentence_pairs(folder / "test.jsonl")
    rows = []
    zero = Encoder.load(model, "cosine")
    res = evaluate_sts(zero, test, name="stsb:test", progress=False)
    rows.append({"run": "zero-shot cosine", **res.to_dict(), "seconds": 0.0})
    for mode in [m.strip() for m in modes.split(",") if m.strip()]:
        encoder = Encoder.load(model, mode)
        started = time.perf_counter()
        cfg = TrainConfig(
            epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, task="symmetric", force=True
        )
        train(encoder, train_pairs, cfg, progress=True)
        res = evaluate_sts(encoder, test, name="stsb:test", progress=False)
        forced = " (forced)" if mode in ("qnorm", "dnorm") else ""
        rows.append(
            {
                "run": f"fine-tuned {mode}{forced}",
                **res.to_dict(),
                "seconds": time.perf_counter() - started,
            }
        )
        click.echo(f"{mode}: Spearman {res.spearman_ab:.4f} / {res.spearman_ba:.4f}", err=True)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    command = recorded_command()
    lines = [
        "# Symmetric task check: STS-B Spearman by mode, both argument orders",
        "",
        f"Command: `{command}`",
        "",
        f"Training: STS-B train pairs with gold ≥ {min_score} as positives ({len(train_pairs)} pairs), symmetric "
        f"InfoNCE (both directions), {epochs} epoch(s), batch {batch_size}, lr {lr}, scale 20, seed {seed}. "
        f"Test: STS-B test ({len(test)} pairs). s(a,b) = query side a, document side b.",
        "",
        "| run | Spearman s(a,b) | Spearman s(b,a) | mean abs(s(a,b) − s(b,a)) | max | train + eval s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['spearman_ab']:.4f} | {r['spearman_ba']:.4f} | {r['mean_asymmetry']:.4f} | "
            f"{r['max_asymmetry']:.4f} | {r['seconds']:.0f} |"
        )
    table = "\n".join(lines) + "\n"
    (out_dir / "symmetric.md").write_text(table)
    (out_dir / "symmetric.json").write_text(
        json.dumps({"command": command, "rows": rows}, indent=1) + "\n"
    )
    click.echo(table)


if __name__ == "__main__":
    main()
