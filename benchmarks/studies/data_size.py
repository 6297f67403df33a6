"""Data-size study: does raw qnorm start to pay on a normalization-pretrained encoder with more pairs?

The paper's condition for magnitude to help is "sufficient data". With scifact's 919 supervised
pairs, raw qnorm on all-MiniLM-L6-v2 stays far below cosine (benchmarks/results/quality.md). This
study adds N weak-supervision pairs (magretrieve.data.weak_pairs: title → abstract, a sentence → the
rest of its abstract) mined from the training corpus *texts* and trains every mode identically on
the combined pairs (one epoch over them, so more pairs means more steps), then scores each model
with its own similarity on every --eval set (NDCG@10, Cohen's d of raw document norms).

Leakage: mining reads no qrels, but the scifact corpus is shared by the train and test splits, so
every document judged (any score) in an eval set's qrels is excluded from mining: by id when the
eval set uses the training corpus folder, by identical text otherwise. The excluded ids go into
the JSON output. The N-pair samples are nested (the smaller is a prefix of the larger) and shared
by all modes, so the mode comparison at each N is paired.

Each (N, mode, seed) run is cached as JSON under --work/results (an interrupted study resumes);
runs with N = 0 can take the quality benchmark's result instead (--reuse) when its settings and
step count match. Heavy runs take the CPU lock (--lock).

    python benchmarks/study.py data_size --model all-MiniLM-L6-v2 --train ../shared/data/scifact:train \
        --eval ../shared/data/scifact:test --eval ../shared/data/cranfield:test \
        --sizes 0,2000,6000 --modes cosine,qnorm --seeds 42 --max-doc-length 128 \
        --reuse .cache/quality/results --out benchmarks/results --threads 2
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import numpy as np
from _common import REPO, cpu_lock, lock_option, recorded_command
from _quality import MODES, BenchConfig, run_ours, train_settings

from magretrieve.core.errors import ConfigError
from magretrieve.data.readers import (
    Document,
    RetrievalDataset,
    TrainingPair,
    load_beir,
    parse_data_spec,
)
from magretrieve.data.weak_pairs import KINDS, mine_weak_pairs

RESULTS = REPO / "benchmarks" / "results"


# --------------------------------------------------------------------------- weak pairs


def eval_judged_documents(
    corpus: Mapping[str, Document],
    corpus_folder: Path,
    evals: Sequence[tuple[Path, RetrievalDataset]],
) -> dict[str, list[str]]:
    """Per eval set, the training-corpus ids that set's qrels judge (any score), sorted.

    An eval set read from the training corpus folder matches by id; one from another folder
    matches by identical document text (ids of unrelated corpora collide: "1", "2", ...).
    """
    here = corpus_folder.resolve()
    by_text: dict[str, list[str]] = {}
    for doc_id, doc in corpus.items():
        by_text.setdefault(doc.full_text, []).append(doc_id)
    out: dict[str, list[str]] = {}
    for folder, data in evals:
        judged = {d for docs in data.qrels.values() for d in docs}
        if folder.resolve() == here:
            ids = {d for d in judged if d in corpus}
        else:
            ids = {
                i
                for d in judged
                if d in data.corpus
                for i in by_text.get(data.corpus[d].full_text, [])
            }
        out[f"{data.name}:{data.split}"] = sorted(ids)
    return out


def pair_kind(pair: TrainingPair, corpus: Mapping[str, Document]) -> str:
    """'title' when the query is the positive document's title, else 'sentence'."""
    return "title" if pair.query == corpus[pair.positive_id].title.strip() else "sentence"


def weak_pool(
    corpus: Mapping[str, Document],
    kinds: Sequence[str],
    exclude_ids: Sequence[str],
    seed: int,
) -> list[TrainingPair]:
    """Every weak pair of ``kinds`` from documents outside ``exclude_ids``, in a seeded order.

    The sample of size N is the first N pairs, so samples are nested across N and identical
    for every mode trained with the same seed.
    """
    return mine_weak_pairs(corpus, kinds, exclude_ids=exclude_ids, seed=seed)


def sample_weak_pairs(pool: Sequence[TrainingPair], n: int) -> list[TrainingPair]:
    """The first ``n`` pairs of ``pool``; refuses a size the pool cannot fill."""
    if n < 0:
        raise ConfigError(f"a data size must be 0 or more, got {n}")
    if n > len(pool):
        raise ConfigError(
            f"{n} weak pairs asked for, but the corpus (minus documents judged by the eval sets) "
            f"yields only {len(pool)}; lower --sizes or add --kinds"
        )
    return list(pool[:n])


# --------------------------------------------------------------------------- planning


def planned_steps(
    lengths: Sequence[int], batch_size: int, epochs: int, max_steps: int | None
) -> int:
    """The trainer's step count for pairs whose positives have these token lengths."""
    import random

    from magretrieve.train.trainer import length_bucketed_batches

    steps = epochs * len(length_bucketed_batches(lengths, batch_size, random.Random(0)))
    return min(steps, max_steps) if max_steps else steps


# --------------------------------------------------------------------------- summary


def run_tag(n: int, mode: str, seed: int) -> str:
    return f"n{n}-{mode}-s{seed}"


def _mean_spread(values: list[float]) -> dict[str, float]:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return {"mean": float("nan"), "spread": float("nan")}
    return {"mean": float(np.mean(finite)), "spread": float(np.max(finite) - np.min(finite)) / 2}


def summarize(
    records: list[dict[str, Any]], sizes: list[int], modes: list[str], sets: list[str]
) -> list[dict[str, Any]]:
    """One row per (N, eval set): pairs, steps, per-mode NDCG@10 and Cohen's d, mode − cosine.

    Values are means over seeds (± half the range); the difference is taken per seed first,
    so it is paired on identical training data.
    """
    by_key = {(r["n_weak"], r["mode"], r["seed"]): r for r in records}
    rows = []
    for n in sizes:
        runs = [r for r in records if r["n_weak"] == n]
        if not runs:
            continue
        seeds = sorted({r["seed"] for r in runs})
        for s in sets:
            row: dict[str, Any] = {
                "n_weak": n,
                "pairs": runs[0]["n_pairs"],
                "steps": runs[0]["train"]["steps"],
                "eval": s,
                "seeds": seeds,
                "ndcg": {},
                "cohens_d": {},
                "minus_cosine": {},
            }
            for mode in modes:
                got = [by_key[(n, mode, sd)] for sd in seeds if (n, mode, sd) in by_key]
                row["ndcg"][mode] = _mean_spread([g["eval"][s]["ndcg_at_10"] for g in got])
                row["cohens_d"][mode] = _mean_spread([g["eval"][s]["cohens_d"] for g in got])
                if mode != "cosine" and "cosine" in modes:
                    diffs = [
                        by_key[(n, mode, sd)]["eval"][s]["ndcg_at_10"]
                        - by_key[(n, "cosine", sd)]["eval"][s]["ndcg_at_10"]
                        for sd in seeds
                        if (n, mode, sd) in by_key and (n, "cosine", sd) in by_key
                    ]
                    row["minus_cosine"][mode] = _mean_spread(diffs)
            rows.append(row)
    return rows


def where_it_pays(rows: list[dict[str, Any]], mode: str) -> dict[str, list[int]]:
    """Per eval set, the sizes N at which ``mode`` beats cosine on mean NDCG@10 (maybe none)."""
    out: dict[str, list[int]] = {}
    for row in rows:
        diff = row["minus_cosine"].get(mode, {}).get("mean", float("nan"))
        out.setdefault(row["eval"], [])
        if diff > 0:
            out[row["eval"]].append(row["n_weak"])
    return out


def _cell(v: dict[str, float], signed: bool = False, digits: int = 4) -> str:
    if math.isnan(v["mean"]):
        return "–"
    text = f"{v['mean']:+.{digits}f}" if signed else f"{v['mean']:.{digits}f}"
    return text + (f" ± {v['spread']:.{digits}f}" if v["spread"] else "")


def markdown(
    rows: list[dict[str, Any]],
    modes: list[str],
    command: str,
    settings: dict[str, Any],
    weak: dict[str, Any],
    reused: list[str],
) -> str:
    others = [m for m in modes if m != "cosine" and "cosine" in modes]
    lines = [
        "# Data size: does raw qnorm start to pay with more training pairs?",
        "",
        f"Command: `{command}`",
        "",
        "Settings: "
        + ", ".join(f"{k} {v}" for k, v in settings.items())
        + ". Every run trains one pass over its pairs (more pairs, more steps) and is scored with its"
        " own similarity (exact search). Cohen's d is of raw document norms, relevant vs non-relevant"
        " among each query's top-100. Values are means over seeds (± half the range when > 1 seed);"
        " differences are paired per seed.",
        "",
        f"Training pairs: the {weak['supervised_pairs']} supervised pairs of `{weak['train']}` plus N"
        f" weak pairs (kinds: {', '.join(weak['kinds'])}) mined from the texts of its corpus, no"
        " qrels read. Samples are seeded and nested (a smaller N is a prefix of a larger one) and"
        " shared by every mode.",
        "",
        f"Documents used for mining: {weak['corpus_documents'] - weak['excluded_total']} of"
        f" {weak['corpus_documents']}. Excluded: every document judged (any score) in an eval set's"
        " qrels, so no weak positive is a test-judged document — "
        + "; ".join(f"{k}: {len(v)}" for k, v in weak["excluded"].items())
        + " (by id for the training corpus, by identical text for other corpora; ids in the JSON)."
        f" Pool: {weak['pool_size']} pairs ("
        + ", ".join(f"{k} {v}" for k, v in weak["pool_kinds"].items())
        + ").",
        "",
    ]
    header = ["weak pairs N", "pairs", "steps", "eval set"]
    header += [f"{m} NDCG@10" for m in modes]
    header += [f"{m} − cosine" for m in others]
    header += [f"Cohen's d {m}" for m in modes]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for row in rows:
        cells = [str(row["n_weak"]), str(row["pairs"]), str(row["steps"]), row["eval"]]
        cells += [_cell(row["ndcg"][m]) for m in modes]
        cells += [_cell(row["minus_cosine"][m], signed=True) for m in others]
        cells += [_cell(row["cohens_d"][m], signed=True, digits=2) for m in modes]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for mode in others:
        pays = where_it_pays(rows, mode)
        verdict = "; ".join(
            f"{s}: " + (f"N = {', '.join(map(str, ns))}" if ns else "no size tried")
            for s, ns in pays.items()
        )
        lines.append(f"Sizes at which {mode} beats cosine (mean NDCG@10, computed): {verdict}.")
    if reused:
        lines += [
            "",
            "Reused from the quality benchmark (same settings and steps): "
            + ", ".join(reused)
            + ".",
        ]
    return "\n".join(lines) + "\n"


def line_chart(rows: list[dict[str, Any]], modes: list[str], path: Path, title: str) -> None:
    """NDCG@10 against the number of training pairs: colour per eval set, line style per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = list(dict.fromkeys(r["eval"] for r in rows))
    styles, markers = ["-", "--", ":", "-."], ["o", "s", "^", "D"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, s in enumerate(sets):
        mine = [r for r in rows if r["eval"] == s]
        x = [r["pairs"] for r in mine]
        for j, m in enumerate(modes):
            y = [r["ndcg"][m]["mean"] for r in mine]
            err = [r["ndcg"][m]["spread"] for r in mine]
            ax.errorbar(
                x,
                y,
                yerr=err,
                color=f"C{i}",
                ls=styles[j % len(styles)],
                marker=markers[j % len(markers)],
                capsize=3,
                label=f"{m} · {s}",
            )
    ax.set_xlabel("training pairs (supervised + weak)")
    ax.set_ylabel("NDCG@10")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# --------------------------------------------------------------------------- runs


def reusable(
    path: Path, settings: dict[str, Any], steps: int, sets: list[str]
) -> tuple[dict[str, Any] | None, str]:
    """The quality benchmark's record at ``path`` if it was trained exactly as N = 0 is here."""
    if not path.is_file():
        return None, f"{path} does not exist"
    record = json.loads(path.read_text())
    if record.get("settings") != settings:
        return None, f"{path}: settings {record.get('settings')} differ from {settings}"
    if record.get("train", {}).get("steps") != steps:
        return None, f"{path}: {record.get('train', {}).get('steps')} steps, expected {steps}"
    missing = [s for s in sets if s not in record.get("eval", {})]
    if missing:
        return None, f"{path}: no evaluation on {missing}"
    return record, ""


def _ints(text: str, what: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(f"{what} must be comma-separated integers, got {text!r}") from None


@click.command()
@click.option("--model", default="all-MiniLM-L6-v2", show_default=True)
@click.option("--train", "train_spec", default="../shared/data/scifact:train", show_default=True)
@click.option(
    "--eval",
    "eval_specs",
    multiple=True,
    default=("../shared/data/scifact:test", "../shared/data/cranfield:test"),
    show_default=True,
)
@click.option(
    "--sizes",
    default="0,2000,6000",
    show_default=True,
    help="Weak pairs added (0: supervised only).",
)
@click.option("--modes", default="cosine,qnorm", show_default=True)
@click.option("--seeds", default="42", show_default=True)
@click.option("--kinds", default=",".join(KINDS), show_default=True, help="Weak pair kinds.")
@click.option("--epochs", type=int, default=1, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--lr", type=float, default=2e-5, show_default=True)
@click.option("--scale", type=float, default=20.0, show_default=True)
@click.option("--max-doc-length", type=int, default=128, show_default=True)
@click.option("--max-steps", type=int, default=None, help="Cap steps (smoke runs).")
@click.option(
    "--reuse",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Quality-benchmark results folder (e.g. .cache/quality/results): N = 0 runs take "
    "<mode>-s<seed>.json from it when its settings and step count match.",
)
@click.option(
    "--work",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".cache/data_size"),
    show_default=True,
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=RESULTS)
@click.option("--name", default="data_size", show_default=True)
@lock_option
@click.option("--threads", type=int, default=None, help="torch threads.")
@click.option("--plan", is_flag=True, help="Print pairs and steps per size, then stop.")
def main(
    model,
    train_spec,
    eval_specs,
    sizes,
    modes,
    seeds,
    kinds,
    epochs,
    batch_size,
    lr,
    scale,
    max_doc_length,
    max_steps,
    reuse,
    work,
    out,
    name,
    lock,
    threads,
    plan,
):
    """Train each mode on supervised + N weak pairs for each N and seed; table, JSON and chart."""
    import torch
    from tqdm.auto import tqdm

    from magretrieve.core.errors import MagRetrieveError
    from magretrieve.train.encoder import Encoder

    if threads:
        torch.set_num_threads(threads)
    size_list, seed_list = _ints(sizes, "--sizes"), _ints(seeds, "--seeds")
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    kind_list = [k.strip() for k in kinds.split(",") if k.strip()]
    unknown = [m for m in mode_list if m not in MODES]
    if unknown:
        raise click.BadParameter(f"unknown modes {unknown}; choose from {', '.join(MODES)}")
    train_folder, _ = parse_data_spec(train_spec, default_split="train")
    try:
        train_data = load_beir(train_spec, default_split="train")
        evals = [(parse_data_spec(s)[0], load_beir(s)) for s in eval_specs]
        supervised = train_data.training_pairs()
        excluded = eval_judged_documents(train_data.corpus, train_folder, evals)
        excluded_all = sorted({i for ids in excluded.values() for i in ids})
        pools = {s: weak_pool(train_data.corpus, kind_list, excluded_all, s) for s in seed_list}
        samples = {
            (n, s): sample_weak_pairs(pools[s], n)
            for n in sorted(set(size_list))
            for s in seed_list
        }
        probe = Encoder.load(model, "cosine", max_document_length=max_doc_length)
    except MagRetrieveError as exc:
        raise click.ClickException(str(exc)) from None
    sets = [f"{d.name}:{d.split}" for _, d in evals]
    first_pool = pools[seed_list[0]]
    weak_info = {
        "train": train_spec,
        "kinds": kind_list,
        "supervised_pairs": len(supervised),
        "corpus_documents": len(train_data.corpus),
        "excluded_total": len(excluded_all),
        "excluded": excluded,
        "pool_size": len(first_pool),
        "pool_kinds": {
            k: sum(pair_kind(p, train_data.corpus) == k for p in first_pool) for k in kind_list
        },
    }

    sup_lengths = probe.token_lengths([p.positive for p in supervised], "document")
    steps: dict[tuple[int, int], int] = {}
    for (n, s), weak in samples.items():
        weak_lengths = probe.token_lengths([p.positive for p in weak], "document") if weak else []
        lengths = sup_lengths + weak_lengths
        steps[(n, s)] = planned_steps(lengths, batch_size, epochs, max_steps)
    del probe
    for n in size_list:
        click.echo(
            f"N = {n}: {len(supervised) + n} pairs, {steps[(n, seed_list[0])]} steps per run",
            err=True,
        )
    click.echo(
        f"mining from {len(train_data.corpus) - len(excluded_all)} of {len(train_data.corpus)} "
        f"documents (excluded as eval-judged: {', '.join(f'{k} {len(v)}' for k, v in excluded.items())}); "
        f"pool {weak_info['pool_size']} pairs ({weak_info['pool_kinds']})",
        err=True,
    )
    if plan:
        if reuse is not None and 0 in size_list:
            for mode in mode_list:
                for seed in seed_list:
                    record, why = reusable(
                        reuse / f"{mode}-s{seed}.json",
                        {
                            **train_settings(epochs, batch_size, lr, scale, max_steps),
                            "max_document_length": max_doc_length,
                        },
                        steps[(0, seed)],
                        [f"{d.name}:{d.split}" for _, d in evals],
                    )
                    click.echo(
                        f"N = 0 {mode} s{seed}: "
                        + ("reusable" if record else f"not reusable ({why})"),
                        err=True,
                    )
        return

    settings = train_settings(epochs, batch_size, lr, scale, max_steps)
    run_settings = {**settings, "max_document_length": max_doc_length}
    (work / "results").mkdir(parents=True, exist_ok=True)
    (work / "runs").mkdir(parents=True, exist_ok=True)
    (work / "weak").mkdir(parents=True, exist_ok=True)
    for s, pool in pools.items():  # the exact pairs drawn: N = n uses the first n
        (work / "weak" / f"s{s}.json").write_text(
            json.dumps(
                {
                    "excluded": excluded,
                    "pool": [
                        {
                            "kind": pair_kind(p, train_data.corpus),
                            "positive_id": p.positive_id,
                            "query": p.query,
                        }
                        for p in pool
                    ],
                },
                indent=0,
            )
            + "\n"
        )

    jobs = [(n, m, s) for n in size_list for s in seed_list for m in mode_list]
    records = []
    bar = tqdm(jobs, desc="data-size runs", unit="run")
    for n, mode, seed in bar:
        tag = run_tag(n, mode, seed)
        bar.set_postfix_str(tag)
        study = {
            "train": train_spec,
            "kinds": kind_list,
            "excluded_documents": len(excluded_all),
            "n_weak": n,
        }
        result_path = work / "results" / f"{tag}.json"
        if result_path.is_file():
            record = json.loads(result_path.read_text())
            if record.get("settings") != run_settings or record.get("study") != study:
                raise click.ClickException(
                    f"{result_path} was made with other settings ({record.get('settings')}, "
                    f"{record.get('study')}); use another --work or delete it"
                )
            tqdm.write(f"{tag}: cached")
            records.append(record)
            continue
        record = None
        if n == 0 and reuse is not None:
            record, why = reusable(
                reuse / f"{mode}-s{seed}.json", run_settings, steps[(0, seed)], sets
            )
            if record is not None:
                record = {**record, "eval": {k: record["eval"][k] for k in sets}}
                record["reused_from"] = str(reuse / f"{mode}-s{seed}.json")
                tqdm.write(f"{tag}: reused {record['reused_from']}")
            else:
                tqdm.write(f"{tag}: not reused ({why})")
        if record is None:
            tqdm.write(f"{tag}: running ({len(supervised) + n} pairs, {steps[(n, seed)]} steps)")
            run_dir = work / "runs" / tag
            if run_dir.exists():
                shutil.rmtree(run_dir)
            cfg = BenchConfig(mode, mode, encoder_kwargs={"max_document_length": max_doc_length})
            pairs = supervised + samples[(n, seed)]
            with cpu_lock(lock):
                record = run_ours(cfg, model, pairs, seed, settings, run_dir, [d for _, d in evals])
        record.update(
            {
                "n_weak": n,
                "n_pairs": len(supervised) + n,
                "mode": mode,
                "seed": seed,
                "weak_kinds": {
                    k: sum(pair_kind(p, train_data.corpus) == k for p in samples[(n, seed)])
                    for k in kind_list
                },
                "settings": run_settings,
                "study": study,
            }
        )
        result_path.write_text(json.dumps(record, indent=1) + "\n")
        records.append(record)
    bar.close()
    reused = [
        f"{run_tag(r['n_weak'], r['mode'], r['seed'])} ← {r['reused_from']}"
        for r in records
        if r.get("reused_from")
    ]

    rows = summarize(records, size_list, mode_list, sets)
    command = recorded_command()
    shown = {**settings, "max_doc_length": max_doc_length, "seeds": ",".join(map(str, seed_list))}
    table = markdown(rows, mode_list, command, shown, weak_info, reused)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(table)
    (out / f"{name}.json").write_text(
        json.dumps(
            {
                "command": command,
                "model": str(model),
                "settings": run_settings,
                "weak_pairs": weak_info,
                "reused": reused,
                "rows": rows,
            },
            indent=1,
        )
        + "\n"
    )
    line_chart(
        rows,
        mode_list,
        out / f"{name}.png",
        f"{Path(str(model)).name}: NDCG@10 vs training pairs ({train_spec.split('/')[-1]} + weak)",
    )
    click.echo(table)


if __name__ == "__main__":
    main()
