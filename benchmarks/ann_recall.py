"""ANN recall measured: FAISS HNSW / IVF / IVF-PQ and Qdrant Edge HNSW against exact search.

Data:

- ``minilm``: ~54k real passages (sentences of the scifact + cranfield abstracts, see
  benchmarks/_store_data.py) in all-MiniLM-L6-v2 ``qnorm`` (documents keep their pooled
  magnitude), with the two sets' 1,334 real queries;
- ``norm-cv-0.05`` / ``0.3`` / ``1.0``: synthetic clustered directions whose norms are
  log-normal with that coefficient of variation, queried *near low-norm documents* (the
  directions of the 10 % smallest documents plus noise), where inner-product ANN is known to
  miss (milvus-io/milvus#51821, pgvector/pgvector#923, nmslib/hnswlib#74).

Protocol per data set and index: every store is built through ``open_store`` with
``target_recall`` (what ``--target-recall`` passes), so ``optimize()`` tunes efSearch / nprobe /
hnsw_ef on stored directions; then ``measure_recall(queries=tuning half)`` re-tunes on real
queries. Recall@10 against exact inner-product search and q/s are measured on the other,
held-out half of the queries, through ``store.search`` for the ANN stores and for the exact
baseline (a FAISS flat store) alike. "batch" = all held-out queries in one call, "single" =
one call per query (the serving case). The goal is recall@10 ≥ 0.99 at ≥ 10× exact q/s.

    python benchmarks/ann_recall.py                 # writes benchmarks/results/ann_recall.{md,json}
    python benchmarks/ann_recall.py --quick         # small synthetic smoke run (no MiniLM)
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np
from _common import cpu_lock, machine_summary, markdown_table, recorded_command

from magretrieve.core.topk import exact_search

K = 10
RESULTS = Path(__file__).resolve().parent / "results"


# ----------------------------------------------------------------------------- data


def synthetic(
    n: int, dim: int, cv: float, nq: int, seed: int = 0
) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Clustered unit directions × log-normal norms with coefficient of variation ``cv``;
    queries are noisy directions of the 10 % lowest-norm documents."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(max(8, n // 250), dim))
    directions = centers[rng.integers(0, len(centers), n)] + 0.7 * rng.normal(size=(n, dim))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    sigma = math.sqrt(math.log(1.0 + cv * cv))
    norms = rng.lognormal(-sigma * sigma / 2, sigma, size=(n, 1))  # mean 1
    docs = (directions * norms).astype(np.float32)
    low = np.argsort(norms[:, 0])[: max(nq, n // 10)]
    pick = rng.choice(low, size=nq, replace=False)
    queries = directions[pick] + 0.35 * rng.normal(size=(nq, dim)) / math.sqrt(dim) * 4
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return [f"s{i}" for i in range(n)], docs, queries.astype(np.float32)


def minilm() -> tuple[list[str], np.ndarray, np.ndarray]:
    from _store_data import load_vectors

    ids, _, docs, queries = load_vectors(lock=False)  # the caller holds the CPU lock
    return ids, np.ascontiguousarray(docs, dtype=np.float32), queries.astype(np.float32)


# ----------------------------------------------------------------------------- measuring


def exact_ids(queries: np.ndarray, docs: np.ndarray, ids: list[str]) -> list[list[str]]:
    """The ids of the exact top-K inner products of each query, best first."""
    rows, _ = exact_search(queries, docs, K)
    return [[ids[j] for j in row] for row in rows]


def recall(found: list[list[str]], truth: list[list[str]]) -> float:
    return float(np.mean([len(set(f) & set(t)) / K for f, t in zip(found, truth, strict=True)]))


def speed(store, queries: np.ndarray, single: int) -> tuple[float, float, list[list[str]]]:
    """(batch q/s, single-query q/s, ids found) through the store API."""
    t0 = time.perf_counter()
    found = [[h.id for h in row] for row in store.search(queries, K, with_vectors=False)]
    batch = len(queries) / (time.perf_counter() - t0)
    sub = queries[:single]
    t0 = time.perf_counter()
    for q in sub:
        store.search(q[None, :], K, with_vectors=False)
    one = len(sub) / (time.perf_counter() - t0)
    return batch, one, found


def configs(n: int, dim: int) -> list[tuple[str, str, dict]]:
    nlist = max(16, int(4 * math.sqrt(n)))
    m = max(4, dim // 8)
    while dim % m:
        m -= 1
    return [
        ("FAISS HNSW32", "faiss", {"index_type": "hnsw", "hnsw_m": 32, "ef_construction": 200}),
        ("FAISS IVF", "faiss", {"index_type": f"IVF{nlist},Flat"}),
        ("FAISS IVF-PQ", "faiss", {"index_type": f"IVF{nlist},PQ{m}x8"}),
        ("Qdrant Edge HNSW16", "qdrant-edge", {"hnsw_m": 16, "ef_construction": 100}),
    ]


def knob(store) -> str:
    rec = store.describe()["parameters"].get("recall") or {}
    for name in ("ef_search", "nprobe", "hnsw_ef"):
        if name in rec:
            return f"{name}={rec[name]}"
    return ""


def run_dataset(name, ids, docs, queries, target, tmp, single, only=None) -> list[dict]:
    from magretrieve.stores import open_store

    rng = np.random.default_rng(1)
    order = rng.permutation(len(queries))
    tune, held = queries[order[: len(order) // 2]], queries[order[len(order) // 2 :]]
    truth = exact_ids(held, docs, ids)
    flat = open_store(f"faiss:{tmp / (name + '-flat')}", dimension=docs.shape[1])
    for s in range(0, len(ids), 8192):
        flat.add(ids[s : s + 8192], docs[s : s + 8192])
    exact_batch, exact_single, found = speed(flat, held, single)
    assert recall(found, truth) > 0.999  # the baseline is exact
    flat.close()
    rows = []
    for label, kind, opts in configs(len(ids), docs.shape[1]):
        if only and kind not in only:
            continue
        spec = f"{kind}:{tmp / (name + '-' + label.replace(' ', '_'))}"
        t0 = time.perf_counter()
        store = open_store(spec, dimension=docs.shape[1], target_recall=target, **opts)
        for s in range(0, len(ids), 8192):
            store.add(ids[s : s + 8192], docs[s : s + 8192])
        store.optimize()  # builds, then tunes on stored directions
        build_s = time.perf_counter() - t0
        stored_dir = store.describe()["parameters"].get("recall") or {}
        setting_dir = knob(store)
        _, _, found = speed(store, held, 1)
        recall_dir = recall(found, truth)
        store.measure_recall(queries=tune, target_recall=target)  # re-tuned on real queries
        batch, one, found = speed(store, held, single)
        value = recall(found, truth)
        rows.append(
            {
                "data": name,
                "index": label,
                "n": len(ids),
                "dim": int(docs.shape[1]),
                "build_s": round(build_s, 1),
                "tuned_on_stored_directions": setting_dir,
                "recall_stored_direction_sample": stored_dir.get(f"recall_at_{K}"),
                "recall_heldout_after_stored_tuning": round(recall_dir, 4),
                "tuned_on_queries": knob(store),
                "recall_heldout": round(value, 4),
                "qps_batch": round(batch, 1),
                "exact_qps_batch": round(exact_batch, 1),
                "speedup_batch": round(batch / exact_batch, 2),
                "qps_single": round(one, 1),
                "exact_qps_single": round(exact_single, 1),
                "speedup_single": round(one / exact_single, 2),
                "goal_met": bool(value >= target and one / exact_single >= 10),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
        store.close()
        shutil.rmtree(Path(spec.split(":", 1)[1]), ignore_errors=True)
    return rows


# ----------------------------------------------------------------------------- report


def report(rows: list[dict], args: Any, seconds: float) -> str:
    headers = [
        "data",
        "index",
        "setting (stored dirs → queries)",
        "recall@10 held-out, stored-dir tuning",
        "recall@10 held-out, query tuning",
        "batch q/s (× exact)",
        "single q/s (× exact)",
        "goal",
    ]
    table = [
        [
            r["data"],
            r["index"],
            f"{r['tuned_on_stored_directions']} → {r['tuned_on_queries']}",
            f"{r['recall_heldout_after_stored_tuning']:.3f}",
            f"**{r['recall_heldout']:.3f}**",
            f"{r['qps_batch']:.0f} ({r['speedup_batch']:.1f}×)",
            f"{r['qps_single']:.0f} ({r['speedup_single']:.1f}×)",
            "met" if r["goal_met"] else "**not met**",
        ]
        for r in rows
    ]
    missed = [f"{r['data']} / {r['index']}" for r in rows if not r["goal_met"]]
    return "\n".join(
        [
            f"# ANN recall vs exact search (recall@10, --target-recall {args.target_recall})",
            "",
            f"Command: `{recorded_command()}`",
            "",
            f"Machine: {machine_summary()}, {os.environ.get('OMP_NUM_THREADS', 'default')} "
            f"OpenMP threads; run took {seconds / 60:.1f} min. Goal per row: recall@10 ≥ "
            f"{args.target_recall} on held-out queries at ≥ 10× the exact store's single-query "
            "q/s.",
            "",
            markdown_table(headers, table),
            "",
            "Settings: efSearch (FAISS HNSW), nprobe (FAISS IVF, IVF-PQ), hnsw_ef (Qdrant Edge), "
            "chosen by the store: first on directions of its own stored vectors (what "
            "`magretrieve index --target-recall` does), then on the tuning half of the real "
            "queries (`store.measure_recall(queries=..., target_recall=...)`). Both recall "
            "columns are measured on the other half. Exact = FAISS flat store through the same "
            "`store.search` API.",
            "",
            "Goal not met: " + (", ".join(missed) if missed else "none") + ".",
            "",
        ]
    )


@click.command(help=__doc__.split("\n")[0])
@click.option("--target-recall", type=float, default=0.99)
@click.option("--synthetic-n", type=int, default=50_000)
@click.option("--synthetic-dim", type=int, default=128)
@click.option("--queries", type=int, default=1000, help="synthetic queries")
@click.option("--single", type=int, default=200, help="queries timed one at a time")
@click.option("--data", default="0.05,0.3,1.0,minilm")
@click.option("--stores", default="faiss,qdrant-edge")
@click.option("--quick", is_flag=True, help="tiny synthetic run, no MiniLM")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS)
@click.option("--no-lock", is_flag=True, help="do not take the shared CPU lock")
def main(**options: Any) -> int:
    args = SimpleNamespace(**options)
    if args.quick:
        args.synthetic_n, args.synthetic_dim, args.queries, args.single = 3000, 16, 200, 20
        args.data = "0.3"
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="mr-ann-recall-"))
    rows: list[dict] = []
    try:
        with cpu_lock(None if args.no_lock else "default"):
            start = time.perf_counter()  # the run, not the wait for the lock
            for item in args.data.split(","):
                if item == "minilm":
                    ids, docs, queries = minilm()
                    name = "MiniLM qnorm passages"
                else:
                    cv = float(item)
                    ids, docs, queries = synthetic(
                        args.synthetic_n, args.synthetic_dim, cv, args.queries
                    )
                    name = f"synthetic norm CV {cv}"
                rows += run_dataset(
                    name, ids, docs, queries, args.target_recall, tmp, args.single,
                    only=set(args.stores.split(",")),
                )  # fmt: skip
                write(rows, args, start)  # after every data set: a long run keeps its rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(write(rows, args, start))
    return 0


def write(rows: list[dict], args: Any, start: float) -> str:
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "ann_recall_quick" if args.quick else "ann_recall"
    text = report(rows, args, time.perf_counter() - start)
    (args.out / f"{stem}.md").write_text(text)
    (args.out / f"{stem}.json").write_text(
        json.dumps({"command": recorded_command(), "rows": rows}, indent=1) + "\n"
    )
    return text


if __name__ == "__main__":
    main()
