"""Quality benchmark: every similarity mode trained identically, side by side with the peer baseline.

For one encoder and one training set it fine-tunes each configuration for each seed, evaluates
each with its own similarity on every --eval set (exact search, NDCG@10 by trec_eval), trains
sentence-transformers' MultipleNegativesRankingLoss (cosine) on the same data as the baseline
users would pick today, and writes a markdown table and a PNG bar chart.

Runs are cached as JSON under --work, so an interrupted benchmark resumes where it stopped.
Real-model runs take the CPU lock (--lock) so that heavy jobs on a shared machine run one at a time.

    python benchmarks/quality.py --model all-MiniLM-L6-v2 --train ../shared/data/scifact:train \
        --eval ../shared/data/scifact:test --eval ../shared/data/cranfield:test \
        --configs zero-shot-cosine,zero-shot-qnorm,peer-mnrl,cosine,dot,qnorm,dnorm,learnable \
        --seeds 42,43 --out benchmarks/results
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
from _common import cpu_lock, lock_option, recorded_command
from _quality import (
    MODES,
    BenchConfig,
    evaluate_all,
    run_ours,
    train_settings,
)

from magretrieve.data.readers import load_beir, load_training_data


def default_configs() -> dict[str, BenchConfig]:
    configs = {
        "zero-shot-cosine": BenchConfig(
            "zero-shot-cosine", "cosine", train=False, describe="no training"
        ),
        "zero-shot-qnorm": BenchConfig(
            "zero-shot-qnorm", "qnorm", train=False, describe="no training, raw norms"
        ),
        "peer-mnrl": BenchConfig(
            "peer-mnrl", "cosine", peer=True, describe="sentence-transformers MNRL (cosine)"
        ),
        "learnable-warm": BenchConfig(
            "learnable-warm",
            "learnable",
            encoder_kwargs={"gamma_q": 0.95, "gamma_d": 0.95},
            describe="learnable γ started near cosine (0.95)",
        ),
        "calibrated-qnorm": BenchConfig(
            "calibrated-qnorm",
            "qnorm",
            calibrate=True,
            describe="qnorm, raw vectors ÷ mean training-corpus norm",
        ),
        "cosine-bf16": BenchConfig(
            "cosine-bf16",
            "cosine",
            train_kwargs={"precision": "bf16"},
            describe="cosine, bf16 autocast training (fp32 evaluation)",
        ),
        "cosine+prior": BenchConfig(
            "cosine+prior",
            "cosine",
            reuse="cosine",
            prior=True,
            describe="fine-tuned cosine + corpus prior, β on training queries",
        ),
        "head-joint": BenchConfig(
            "head-joint",
            "qnorm",
            encoder_kwargs={"norm_head": "linear"},
            describe="d̂·exp(g(d̂)), zero-init linear head, trained with the encoder",
        ),
    }
    for mode in MODES:
        configs[mode] = BenchConfig(
            mode, mode, describe="paper recipe" if mode != "cosine" else "baseline"
        )
    return configs


def run_peer(
    cfg: BenchConfig,
    model: str,
    pairs: list,
    seed: int,
    settings: dict[str, Any],
    run_dir: Path,
    evals: list[Any],
) -> dict[str, Any]:
    """sentence-transformers' own trainer with MultipleNegativesRankingLoss, scored by our evaluation."""
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
        losses,
    )
    from sentence_transformers.training_args import BatchSamplers

    from magretrieve.core.model_paths import resolve_model_path
    from magretrieve.train.encoder import Encoder

    st = SentenceTransformer(str(resolve_model_path(model)), device="cpu")
    if "max_document_length" in cfg.encoder_kwargs:
        st.max_seq_length = cfg.encoder_kwargs["max_document_length"]
    data = Dataset.from_dict(
        {"anchor": [p.query for p in pairs], "positive": [p.positive for p in pairs]}
    )
    loss = losses.MultipleNegativesRankingLoss(st, scale=settings["scale"])
    with tempfile.TemporaryDirectory() as tmp:
        args = SentenceTransformerTrainingArguments(
            output_dir=tmp,
            num_train_epochs=settings["epochs"],
            per_device_train_batch_size=settings["batch_size"],
            learning_rate=settings["lr"],
            warmup_ratio=settings["warmup_ratio"],
            lr_scheduler_type="cosine",
            weight_decay=0.01,
            max_grad_norm=1.0,
            seed=seed,
            batch_sampler=BatchSamplers.NO_DUPLICATES,
            save_strategy="no",
            report_to="none",
            logging_steps=10,
            use_cpu=True,
        )
        trainer = SentenceTransformerTrainer(model=st, args=args, train_dataset=data, loss=loss)
        started = time.perf_counter()
        output = trainer.train()
        seconds = time.perf_counter() - started
    st.save(str(run_dir))
    encoder = Encoder.load(run_dir, "cosine", **cfg.encoder_kwargs)
    return {
        "config": "peer-mnrl",
        "mode": "cosine",
        "seed": seed,
        "describe": "sentence-transformers MNRL (cosine)",
        "train": {
            "steps": output.global_step,
            "seconds": seconds,
            "steps_per_second": output.global_step / seconds,
            "final_loss": output.training_loss,
        },
        "eval": evaluate_all(encoder, evals),
    }


def aggregate(records: list[dict[str, Any]], order: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Mean ± spread per configuration and eval set; relative change vs fine-tuned cosine."""
    by_cfg: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_cfg.setdefault(r["config"], []).append(r)
    sets = sorted({s for r in records for s in r["eval"]})
    summary: dict[str, Any] = {}
    for name in order:
        runs = by_cfg.get(name)
        if not runs:
            continue
        row: dict[str, Any] = {
            "seeds": sorted(r["seed"] for r in runs),
            "describe": runs[0]["describe"],
        }
        for s in sets:
            nd = [r["eval"][s]["ndcg_at_10"] for r in runs if s in r["eval"]]
            cd = [r["eval"][s]["cohens_d"] for r in runs if s in r["eval"]]
            row[s] = {
                "ndcg": float(np.mean(nd)),
                "spread": float(np.max(nd) - np.min(nd)) / 2,
                "cohens_d": float(np.nanmean(cd))
                if not all(math.isnan(c) for c in cd)
                else float("nan"),
            }
        sps = [r["train"]["steps_per_second"] for r in runs if "train" in r]
        row["steps_per_second"] = float(np.mean(sps)) if sps else None
        gam = [(r["train"].get("gamma_q"), r["train"].get("gamma_d")) for r in runs if "train" in r]
        if gam and gam[0][0] is not None and runs[0]["mode"] == "learnable":
            row["gammas"] = [
                float(np.mean([g[0] for g in gam])),
                float(np.mean([g[1] for g in gam])),
            ]
        summary[name] = row
    return sets, summary


def markdown(
    sets: list[str], summary: dict[str, Any], command: str, settings: dict[str, Any]
) -> str:
    base = summary.get("cosine")
    lines = [
        "# Quality benchmark: NDCG@10 by similarity mode",
        "",
        f"Command: `{command}`",
        "",
        "Settings: "
        + ", ".join(f"{k} {v}" for k, v in settings.items())
        + ". Each model is scored with its own similarity (exact search). ± is half the range over seeds;"
        " Δ is relative to our fine-tuned cosine; Cohen's d is of raw document norms, relevant vs"
        " non-relevant among each query's top-100. Train steps/s is each run's own wall clock;"
        " runs made at different times shared the CPU with different jobs, so compare speed in"
        " train_speed.md (interleaved, same run), not in this column.",
        "",
    ]
    header = ["configuration", "seeds"]
    for s in sets:
        header += [f"{s} NDCG@10", "Δ vs cosine", "Cohen's d"]
    header += ["train steps/s"]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for name, row in summary.items():
        seeds = ",".join(map(str, row["seeds"])) if row["steps_per_second"] else "– (untrained)"
        cells = [f"{name} ({row['describe']})", seeds]
        if "gammas" in row:
            cells[0] += f" γ→({row['gammas'][0]:.2f}, {row['gammas'][1]:.2f})"
        for s in sets:
            v = row.get(s)
            if v is None:
                cells += ["–", "–", "–"]
                continue
            cells.append(f"{v['ndcg']:.4f} ± {v['spread']:.4f}")
            if base and s in base and name != "cosine" and base[s]["ndcg"] > 0:
                cells.append(f"{100 * (v['ndcg'] / base[s]['ndcg'] - 1):+.1f}%")
            else:
                cells.append("–")
            cells.append("–" if math.isnan(v["cohens_d"]) else f"{v['cohens_d']:+.2f}")
        cells.append(f"{row['steps_per_second']:.3f}" if row["steps_per_second"] else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def bar_chart(sets: list[str], summary: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(summary)
    width = 0.8 / max(1, len(sets))
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(names)), 4.5))
    x = np.arange(len(names))
    for i, s in enumerate(sets):
        vals = [summary[n].get(s, {}).get("ndcg", np.nan) for n in names]
        errs = [summary[n].get(s, {}).get("spread", 0) for n in names]
        bars = ax.bar(x + i * width, vals, width, yerr=errs, capsize=3, label=s)
        for b, v in zip(bars, vals, strict=True):
            if not math.isnan(v):
                ax.text(
                    b.get_x() + b.get_width() / 2,
                    v + 0.005,
                    f"{v:.3f}",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
    if "cosine" in summary:
        for i, s in enumerate(sets):
            if s in summary["cosine"]:
                ax.axhline(summary["cosine"][s]["ndcg"], color=f"C{i}", ls="--", lw=0.8, alpha=0.7)
    ax.set_xticks(x + width * (len(sets) - 1) / 2)
    ax.set_xticklabels(names, rotation=25, ha="right")
    ax.set_ylabel("NDCG@10 (mean over seeds)")
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@click.command()
@click.option("--model", required=True)
@click.option("--train", "train_spec", required=True)
@click.option("--eval", "eval_specs", multiple=True, required=True)
@click.option(
    "--configs",
    default="zero-shot-cosine,zero-shot-qnorm,peer-mnrl,cosine,dot,qnorm,dnorm,learnable",
)
@click.option("--seeds", default="42,43")
@click.option("--epochs", type=int, default=3)
@click.option("--batch-size", type=int, default=32)
@click.option("--lr", type=float, default=2e-5)
@click.option("--scale", type=float, default=20.0)
@click.option("--max-steps", type=int, default=None, help="Cap steps (smoke runs).")
@click.option(
    "--max-doc-length",
    type=int,
    default=None,
    help="Document token limit for training and evaluation (default: the model's).",
)
@click.option(
    "--work",
    type=click.Path(file_okay=False),
    default=".cache/quality",
    show_default=True,
    help="Cache of runs and per-run JSON (relative paths: to the repository root).",
)
@click.option(
    "--out", type=click.Path(file_okay=False), required=True, help="Where the table and chart go."
)
@click.option("--name", default="quality", help="Basename of the table and chart.")
@lock_option
@click.option("--threads", type=int, default=None, help="torch threads.")
def main(
    max_doc_length,
    model,
    train_spec,
    eval_specs,
    configs,
    seeds,
    epochs,
    batch_size,
    lr,
    scale,
    max_steps,
    work,
    out,
    name,
    lock,
    threads,
):
    """Train every configuration × seed, evaluate, and write the comparison table and chart."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    registry = default_configs()
    chosen = [c.strip() for c in configs.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in registry]
    if unknown:
        raise click.BadParameter(f"unknown configs {unknown}; known: {sorted(registry)}")
    seed_list = [int(s) for s in seeds.split(",")]
    work_dir, out_dir = Path(work), Path(out)
    (work_dir / "runs").mkdir(parents=True, exist_ok=True)
    (work_dir / "results").mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    if max_doc_length:  # one document limit for every configuration, training and evaluation alike
        for config in registry.values():
            config.encoder_kwargs["max_document_length"] = max_doc_length
    settings = train_settings(epochs, batch_size, lr, scale, max_steps)
    pairs = load_training_data(train_spec)
    evals = [load_beir(s) for s in eval_specs]
    train_dataset = None
    if any(registry[c].calibrate or registry[c].prior for c in chosen):
        train_dataset = load_beir(train_spec, default_split="train")
    records = []
    # Untrained configurations do not depend on the seed: run them once.
    jobs = [
        (c, s)
        for s in seed_list
        for c in chosen
        if registry[c].train or registry[c].peer or s == seed_list[0]
    ]
    for i, (cname, seed) in enumerate(jobs, 1):
        cfg = registry[cname]
        tag = f"{cname}-s{seed}" if (cfg.train or cfg.peer) else cname
        result_path = work_dir / "results" / f"{tag}.json"
        if result_path.is_file():
            records.append(json.loads(result_path.read_text()))
            click.echo(f"[{i}/{len(jobs)}] {tag}: cached", err=True)
            continue
        click.echo(f"[{i}/{len(jobs)}] {tag}: running", err=True)
        run_dir = work_dir / "runs" / tag
        if run_dir.exists():
            shutil.rmtree(run_dir)
        with cpu_lock(lock):
            if cfg.peer:
                record = run_peer(cfg, model, pairs, seed, settings, run_dir, evals)
            else:
                record = run_ours(cfg, model, pairs, seed, settings, run_dir, evals, train_dataset)
        record["seed"] = seed if (cfg.train or cfg.peer) else None
        record["settings"] = {**settings, **cfg.encoder_kwargs}
        result_path.write_text(json.dumps(record, indent=1) + "\n")
        records.append(record)
    for r in records:
        if r["seed"] is None:
            r["seed"] = 0
    sets, summary = aggregate(records, chosen)
    command = recorded_command()
    table = markdown(
        sets, summary, command, {**settings, "max_doc_length": max_doc_length or "model default"}
    )
    (out_dir / f"{name}.md").write_text(table)
    (out_dir / f"{name}.json").write_text(
        json.dumps({"command": command, "settings": settings, "summary": summary}, indent=1) + "\n"
    )
    bar_chart(
        sets,
        summary,
        out_dir / f"{name}.png",
        f"{Path(str(model)).name} fine-tuned on {train_spec.split('/')[-1]}",
    )
    click.echo(table)


if __name__ == "__main__":
    main()
