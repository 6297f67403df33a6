"""Document priors on top of cosine, side by side, plus PACE's training curriculum.

For zero-shot cosine and for fine-tuned cosine (each seed, magretrieve's trainer at the settings
of benchmarks/quality.py) it chooses every prior of :mod:`magretrieve.priors` — hub, CSLS with a
query bank and with a corpus bank, static inverted softmax, mean-direction removal, the
combinations, and ``auto`` (what ``fit-prior`` picks) — on the TRAINING queries only, then
scores NDCG@10 on each --eval set with the prior served as a store serves it (corpus statistics
refitted on that set's corpus, the bank = all training queries). QB-Norm's dynamic inverted
softmax (not servable by one static index) is measured with the static form's parameters.
Hubness is the skewness of the k-occurrence N₁₀ (how often each document is in a query's top
10) over the eval queries, before and after. PACE (cosine first, then qnorm/dot from that
checkpoint at a 10x lower learning rate) is scored with its own similarity.

Models and vectors are cached under cache_dir("priors") (each model encodes each text set
once); heavy steps take the CPU lock.

    python benchmarks/priors.py --train ../shared/data/scifact:train \
        --eval ../shared/data/scifact:test --eval ../shared/data/cranfield:test --seeds 42,43
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import click
import numpy as np
from _common import REPO, cache_dir, cpu_lock, markdown_table, portable_path, recorded_command
from _priors_vectors import VectorCache, encode_all, model_dir, split_texts, train_model
from _quality import train_settings

from magretrieve.core.topk import top_k
from magretrieve.data.readers import load_beir, load_training_data
from magretrieve.priors import InvertedSoftmaxPrior, unit
from magretrieve.priors.select import choose_prior, ndcg_at_10, served_scores

#: Rows for every cosine model: (row name, --method given to choose_prior).
METHODS = [
    ("cosine (no prior)", "none"),
    ("hub", "hub"),
    ("csls, query bank", "csls-queries"),
    ("csls, corpus bank", "csls-corpus"),
    ("inverted softmax (static)", "inverted-softmax"),
    ("center (mean removal)", "center"),
    ("hub + inverted softmax", "hub+inverted-softmax"),
    ("center + inverted softmax", "center+inverted-softmax"),
    ("hub + csls (query bank)", "hub+csls-queries"),
    ("auto (fit-prior default)", "auto"),
]
DIS_ROW = "QB-Norm dynamic inv. softmax (not servable)"
#: Suffix of the rows where a method's best training candidate is forced on (cosine excluded).
FORCED = " [forced]"
K_OCCURRENCE = 10
#: Rows without a forced variant (cosine itself; auto is the fit-prior default as it is).
NOT_FORCED = ("none", "auto")


def skewness(scores: np.ndarray, k: int = K_OCCURRENCE) -> float:
    """Skewness of N_k: how many queries have each document in their top k."""
    top, _ = top_k(scores, k)
    counts = np.bincount(top.ravel(), minlength=scores.shape[1]).astype(np.float64)
    sd = counts.std()
    return float(((counts - counts.mean()) ** 3).mean() / sd**3) if sd > 0 else 0.0


def dynamic_inverted_softmax(
    prior: InvertedSoftmaxPrior, queries: np.ndarray, docs: np.ndarray, bank: np.ndarray
) -> np.ndarray:
    """QB-Norm's DIS: the inverted softmax only for queries whose top-1 cosine hit is in the
    activation set (documents that are some bank query's top-1); cosine for the others."""
    cos = queries @ docs.T
    active = np.zeros(len(docs), dtype=bool)
    active[np.argmax(bank @ docs.T, axis=1)] = True
    normalized = served_scores(prior.with_bank(bank), queries, docs)
    use = active[np.argmax(cos, axis=1)]
    return np.where(use[:, None], normalized, cos)


def evaluate_cosine_model(
    cache: VectorCache, train: Any, evals: list[Any], methods: list[tuple[str, str]]
) -> dict[str, Any]:
    """Every prior chosen on the training split, scored on each eval split."""
    _, t_docs, t_qids, t_queries = split_texts(train)
    d_train = unit(cache.raw(t_docs, "document", train.name))
    q_train = unit(cache.raw(t_queries, "query", f"{train.name}-{train.split}"))
    t_doc_ids = list(train.corpus)
    eval_vectors = {}
    for ds in evals:
        doc_ids, docs, qids, queries = split_texts(ds)
        eval_vectors[id(ds)] = (
            ds,
            unit(cache.raw(queries, "query", f"{ds.name}-{ds.split}")),
            unit(cache.raw(docs, "document", ds.name)),
            qids,
            doc_ids,
            cache.truncated(queries, "query", f"{ds.name}-{ds.split}"),
        )
    rows: dict[str, Any] = {}
    memo: dict[str, float] = {}  # one training set: each candidate is scored once
    jobs = [(row, method, True) for row, method in methods]
    jobs += [(row + FORCED, method, False) for row, method in methods if method not in NOT_FORCED]
    for row, method, include_none in jobs:
        sel = choose_prior(
            q_train,
            d_train,
            t_qids,
            t_doc_ids,
            train.qrels,
            method=method,
            chosen_on="train",
            include_none=include_none,
            memo=memo,
        )
        record: dict[str, Any] = {
            "method": method,
            "forced": not include_none,
            "chosen": sel.prior.label(),
            "training_ndcg": sel.training_ndcg,
            "training_cosine": sel.grid["none (cosine)"],
            "eval": {},
        }
        for ds, q, d, qids, doc_ids, truncated in eval_vectors.values():
            scores = served_scores(sel.prior, q, d)
            record["eval"][f"{ds.name}:{ds.split}"] = {
                "ndcg": ndcg_at_10(scores, qids, doc_ids, ds.qrels),
                "skewness": skewness(scores),
                "truncated_queries": truncated,
            }
        rows[row] = record
        if row == "inverted softmax (static)" + FORCED:
            dis: dict[str, Any] = {
                "method": "dynamic-inverted-softmax",
                "chosen": f"DIS with {sel.prior.label()}",
                "forced": True,
                "training_ndcg": None,
                "training_cosine": sel.grid["none (cosine)"],
                "eval": {},
            }
            for ds, q, d, qids, doc_ids, truncated in eval_vectors.values():
                scores = dynamic_inverted_softmax(sel.prior, q, d, q_train)
                dis["eval"][f"{ds.name}:{ds.split}"] = {
                    "ndcg": ndcg_at_10(scores, qids, doc_ids, ds.qrels),
                    "skewness": skewness(scores),
                    "truncated_queries": truncated,
                }
            rows[DIS_ROW] = dis
    return rows


def evaluate_own_similarity(cache: VectorCache, evals: list[Any]) -> dict[str, Any]:
    """A magnitude-keeping model (PACE) scored with its own similarity."""
    from magretrieve.core import similarity

    info = cache.similarity()
    sim = similarity.resolve(info["mode"])
    record: dict[str, Any] = {"method": info["mode"], "chosen": "own similarity", "eval": {}}
    for ds in evals:
        doc_ids, docs, qids, queries = split_texts(ds)
        q = similarity.query_vectors(cache.raw(queries, "query", f"{ds.name}-{ds.split}"), sim)
        d = similarity.document_vectors(cache.raw(docs, "document", ds.name), sim)
        scores = q @ d.T
        record["eval"][f"{ds.name}:{ds.split}"] = {
            "ndcg": ndcg_at_10(scores, qids, doc_ids, ds.qrels),
            "skewness": skewness(scores),
            "truncated_queries": cache.truncated(queries, "query", f"{ds.name}-{ds.split}"),
        }
    return record


def summarize(results: dict[str, dict[str, Any]], sets: list[str]) -> list[dict[str, Any]]:
    """Mean ± half-range over seeds per (model family, row); Δ vs fine-tuned cosine."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for tag, rows in results.items():
        family = "zero-shot" if tag == "zero-shot" else tag.rsplit("-s", 1)[0]
        for row, rec in rows.items():
            groups.setdefault((family, row), []).append({**rec, "tag": tag})
    base = groups.get(("cosine", "cosine (no prior)"), [])
    base_mean = (
        {s: float(np.mean([r["eval"][s]["ndcg"] for r in base])) for s in sets} if base else {}
    )
    out = []
    for (family, row), recs in groups.items():
        entry: dict[str, Any] = {
            "model": family,
            "prior": row,
            "seeds": sorted(r["tag"] for r in recs),
            "chosen": sorted({r["chosen"] for r in recs}),
        }
        for s in sets:
            nd = [r["eval"][s]["ndcg"] for r in recs]
            sk = [r["eval"][s]["skewness"] for r in recs]
            mean = float(np.mean(nd))
            entry[s] = {
                "ndcg": mean,
                "spread": float(np.max(nd) - np.min(nd)) / 2,
                "delta_vs_finetuned_cosine": (mean / base_mean[s] - 1) if base_mean else None,
                "skewness": float(np.mean(sk)),
                "truncated_queries": int(max(r["eval"][s]["truncated_queries"] for r in recs)),
            }
        out.append(entry)
    return out


def measured_best(summary: list[dict[str, Any]], ind: str, ood: str) -> dict[str, Any]:
    """The servable prior on fine-tuned cosine with the best out-of-domain NDCG@10 among those
    not worse in domain; "none" when no prior beats plain cosine out of domain that way."""
    rows = {e["prior"]: e for e in summary if e["model"] == "cosine"}
    base = rows.get("cosine (no prior)")
    if base is None:
        return {}
    best_row, best = "cosine (no prior)", base
    for name, e in rows.items():
        if name in ("cosine (no prior)", DIS_ROW) or name.endswith(FORCED):
            continue  # only what fit-prior can produce (cosine always a candidate) is advice
        if e[ind]["ndcg"] >= base[ind]["ndcg"] and e[ood]["ndcg"] > best[ood]["ndcg"]:
            best_row, best = name, e
    method = dict(METHODS)[best_row]
    return {
        "row": best_row,
        "method": method,
        "ndcg": {s: best[s]["ndcg"] for s in (ind, ood)},
        "cosine": {s: base[s]["ndcg"] for s in (ind, ood)},
        "gain": {s: best[s]["ndcg"] / base[s]["ndcg"] - 1 for s in (ind, ood)},
    }


def write_evidence(
    summary: list[dict[str, Any]],
    sets: list[str],
    seeds: list[int],
    model: str,
    quality: Path,
    path: Path,
    source: str,
) -> dict[str, Any]:
    """What diagnose quotes (magretrieve/diagnose/evidence.json): written from these results."""
    ind, ood = sets[0], sets[-1]
    best = measured_best(summary, ind, ood)
    evidence: dict[str, Any] = {
        "written_by": "benchmarks/priors.py",
        "encoder": model,
        "in_domain": ind,
        "out_of_domain": ood,
        "seeds": seeds,
        "cosine": (best or {}).get("cosine", {}),
        "best_prior": {**best, "source": source} if best else {},
        "goal_met": bool(best)
        and best["method"] != "none"
        and best["gain"][ood] >= 0.02
        and best["gain"][ind] >= 0,
    }
    if quality.is_file():
        q = json.loads(quality.read_text()).get("summary", {})
        if all(s in q.get("qnorm", {}) and s in q.get("cosine", {}) for s in (ind, ood)):
            evidence["qnorm"] = {s: q["qnorm"][s]["ndcg"] for s in (ind, ood)}
            evidence["cosine"] = {s: q["cosine"][s]["ndcg"] for s in (ind, ood)}
            evidence["quality_source"] = portable_path(quality.with_suffix(".md"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(evidence, indent=1) + "\n")
    return evidence


def _table(summary: list[dict[str, Any]], sets: list[str]) -> str:
    headers = ["model", "prior"]
    for s in sets:
        headers += [f"{s} NDCG@10", "Δ vs fine-tuned cosine", "N₁₀ skew"]
    rows = []
    for e in summary:
        cells = [e["model"], e["prior"]]
        for s in sets:
            v = e[s]
            delta = v["delta_vs_finetuned_cosine"]
            is_base = (e["model"], e["prior"]) == ("cosine", "cosine (no prior)")
            cells += [
                f"{v['ndcg']:.4f} ± {v['spread']:.4f}",
                "–" if delta is None or is_base else f"{100 * delta:+.1f}%",
                f"{v['skewness']:.2f}",
            ]
        rows.append(cells)
    return markdown_table(headers, rows)


def markdown(summary: list[dict[str, Any]], sets: list[str], command: str, note: str) -> str:
    chosen_rows = [e for e in summary if not e["prior"].endswith(FORCED) and e["prior"] != DIS_ROW]
    forced_rows = [e for e in summary if e["prior"].endswith(FORCED) or e["prior"] == DIS_ROW]
    chosen = [[e["model"], e["prior"], "; ".join(e["chosen"])] for e in summary]
    return "\n".join(
        [
            "# Document priors on top of cosine",
            "",
            f"Command: `{command}`",
            "",
            note,
            "",
            "## Chosen on the training queries, plain cosine always a candidate (what fit-prior does)",
            "",
            _table(chosen_rows, sets),
            "",
            "## Each method forced on (its best candidate on the training queries, cosine excluded)",
            "",
            _table(forced_rows, sets),
            "",
            "## What each row chose on the training queries (per seed)",
            "",
            markdown_table(["model", "prior", "chosen"], chosen),
            "",
        ]
    )


def bar_chart(summary: list[dict[str, Any]], sets: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(sets), figsize=(7 * len(sets), 6), squeeze=False)
    for ax, s in zip(axes[0], sets, strict=True):
        names = [f"{e['model']}: {e['prior']}" for e in summary]
        vals = [e[s]["ndcg"] for e in summary]
        errs = [e[s]["spread"] for e in summary]
        colors = [
            "C0" if e["model"] == "cosine" else "C1" if e["model"] == "zero-shot" else "C2"
            for e in summary
        ]
        y = np.arange(len(names))
        ax.barh(y, vals, xerr=errs, color=colors, capsize=2)
        base = [e for e in summary if (e["model"], e["prior"]) == ("cosine", "cosine (no prior)")]
        if base:
            ax.axvline(base[0][s]["ndcg"], color="k", ls="--", lw=0.8)
            ax.axvline(base[0][s]["ndcg"] * 1.02, color="r", ls=":", lw=0.8)
        ax.set_yticks(y)
        ax.set_yticklabels(names, fontsize=7)
        ax.invert_yaxis()
        lo = min(vals)
        ax.set_xlim(max(0.0, lo - 0.05), max(vals) + 0.02)
        ax.set_title(f"{s} NDCG@10 (dashed: fine-tuned cosine; dotted: +2%)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@click.command()
@click.option("--model", default="all-MiniLM-L6-v2", show_default=True)
@click.option("--train", "train_spec", required=True, help="BEIR DIR:train (training queries).")
@click.option("--eval", "eval_specs", multiple=True, required=True)
@click.option("--seeds", default="42,43", show_default=True)
@click.option(
    "--pace",
    default="qnorm-s42,qnorm-s43,dot-s42",
    show_default=True,
    help="PACE models MODE-sSEED (cosine checkpoint of that seed, lr/10); '' for none.",
)
@click.option(
    "--zero-shot/--no-zero-shot", default=True, show_default=True, help="Include zero-shot cosine."
)
@click.option("--epochs", type=int, default=1, show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--lr", type=float, default=2e-5, show_default=True)
@click.option("--max-doc-length", type=int, default=128, show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default="benchmarks/results")
@click.option("--name", default="priors")
@click.option("--lock", default="default", help="CPU lock file ('' disables).")
@click.option("--threads", type=int, default=2, show_default=True)
@click.option(
    "--quality",
    type=click.Path(dir_okay=False),
    default=str(REPO / "benchmarks" / "results" / "quality.json"),
    help="quality.json whose cosine/qnorm figures diagnose quotes.",
)
@click.option(
    "--evidence",
    type=click.Path(dir_okay=False),
    default=str(REPO / "magretrieve" / "diagnose" / "evidence.json"),
    help="Where to write the figures diagnose quotes (shipped in the package).",
)
def main(
    model,
    train_spec,
    eval_specs,
    seeds,
    pace,
    zero_shot,
    epochs,
    batch_size,
    lr,
    max_doc_length,
    out,
    name,
    lock,
    threads,
    quality,
    evidence,
):
    """Choose every prior on training queries; score it in and out of domain; write the table."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    from magretrieve.core.model_paths import resolve_model_path

    base = str(resolve_model_path(model))
    work = cache_dir("priors")
    settings = train_settings(epochs, batch_size, lr, 20.0)
    pairs = load_training_data(train_spec)
    train = load_beir(train_spec, default_split="train")
    evals = [load_beir(s) for s in eval_specs]
    seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    cosine_tags = ["zero-shot"] * zero_shot + [f"cosine-s{s}" for s in seed_list]
    pace_tags = [f"pace-{p.strip()}" for p in pace.split(",") if p.strip()]
    for tag in [*cosine_tags, *pace_tags]:
        with cpu_lock(lock):
            if tag != "zero-shot":
                seed = int(tag.rsplit("-s", 1)[1])
                if tag.startswith("pace-"):
                    train_model(
                        base,
                        f"cosine-s{seed}",
                        work,
                        pairs,
                        settings,
                        seed,
                        max_doc_length,
                        threads,
                    )
                train_model(base, tag, work, pairs, settings, seed, max_doc_length, threads)
            source = base if tag == "zero-shot" else model_dir(work, tag)
            encode_all(VectorCache(work, tag, source, max_doc_length), [train, *evals])
    results: dict[str, dict[str, Any]] = {}
    done = work / "results"
    done.mkdir(parents=True, exist_ok=True)
    signature = json.dumps([METHODS, [f"{d.name}:{d.split}" for d in evals]])
    for tag in cosine_tags:
        cached = done / f"{tag}.json"
        if cached.is_file() and json.loads(cached.read_text()).get("signature") == signature:
            results[tag] = json.loads(cached.read_text())["rows"]
            continue
        cache = VectorCache(
            work, tag, base if tag == "zero-shot" else model_dir(work, tag), max_doc_length
        )
        with cpu_lock(lock):
            results[tag] = evaluate_cosine_model(cache, train, evals, METHODS)
        cached.write_text(json.dumps({"signature": signature, "rows": results[tag]}))
        click.echo(f"{tag}: done", err=True)
    for tag in pace_tags:
        cache = VectorCache(work, tag, model_dir(work, tag), max_doc_length)
        results[tag] = {
            f"PACE: {tag.split('-')[1]} from cosine, lr/10": evaluate_own_similarity(cache, evals)
        }
    sets = [f"{d.name}:{d.split}" for d in evals]
    summary = summarize(results, sets)
    command = recorded_command()
    note = (
        f"Settings: {Path(base).name if model == base else model}, fine-tuned on "
        f"{train.name}:{train.split} for {epochs} epoch(s), batch {batch_size}, lr {lr:g}, "
        f"{max_doc_length}-token documents, queries at the model's limit; seeds {seeds}. Every "
        "prior's parameters are chosen by NDCG@10 of the training queries (query banks "
        "cross-fitted in 5 folds; plain cosine always a candidate), then served as a store "
        "serves it ([m·v ; b] against [q̂ ; 1], corpus statistics refitted on each eval corpus, "
        "the bank = all training queries). ± is half the range over seeds; Δ is relative to "
        "fine-tuned cosine without a prior; N₁₀ skew is the skewness of how often each document "
        "is in a query's top 10 (hubness; lower is flatter). The dynamic inverted softmax "
        "depends on each query's first result, so one static index cannot serve it; it is "
        "measured with the static form's parameters. PACE rows are scored with their own "
        "similarity (no prior)."
    )
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.md").write_text(markdown(summary, sets, command, note))
    (out_dir / f"{name}.json").write_text(
        json.dumps(
            {"command": command, "settings": settings, "summary": summary, "runs": results},
            indent=1,
            default=lambda x: None if isinstance(x, float) and math.isnan(x) else x,
        )
        + "\n"
    )
    bar_chart(summary, sets, out_dir / f"{name}.png")
    write_evidence(
        summary,
        sets,
        seed_list,
        Path(model).name,
        Path(quality),
        Path(evidence),
        portable_path(out_dir / f"{name}.md"),
    )
    click.echo((out_dir / f"{name}.md").read_text())


if __name__ == "__main__":
    main()
