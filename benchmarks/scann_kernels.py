"""ScaNN's SSE4 kernels against its AVX2 kernels, side by side in one run, on one store.

ScaNN chooses its kernels from its own CPU check; where that check misses AVX2 the store
switches them on (``magretrieve/stores/_scann_kernels.py``; ``MAGRETRIEVE_SCANN_AVX2=0``
keeps ScaNN's choice). This measures what the switch buys: one built ``scann:`` store
(clustered directions, log-normal norms; cached), searched by held-out perturbed points in
batches of 1, 4, 16 and 64 rows, one process per setting, the settings alternated
(``--rounds``) so drift hits both. Reported: queries/s on one thread, CPU ms per query,
recall@10 against exact inner product, and the share of queries whose hits equal the other
setting's.

    python benchmarks/scann_kernels.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import numpy as np
from _common import (
    REPO,
    cache_dir,
    cpu_lock,
    lock_option,
    machine_summary,
    markdown_table,
    recorded_command,
)

SETTINGS = {"ScaNN's own check": "0", "switched on": "1"}
BATCHES = (1, 4, 16, 64)
K = 10


def make_data(n: int, dim: int, queries: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Clustered unit directions times log-normal norms; queries are stored points moved to
    cosine ~0.7 (held out from the store)."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((256, dim)).astype(np.float32)
    total = n + queries
    x = centers[rng.integers(0, 256, total)] + 0.8 * rng.standard_normal((total, dim)).astype(
        np.float32
    )
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x *= rng.lognormal(0.0, 0.25, (total, 1)).astype(np.float32)
    q = x[n:] + 0.9 * np.linalg.norm(x[n:], axis=1, keepdims=True) * rng.standard_normal(
        (queries, dim)
    ).astype(np.float32) / np.sqrt(dim)
    return x[:n], q.astype(np.float32)


def build(folder: Path, vecs: np.ndarray) -> None:
    from tqdm import tqdm

    from magretrieve.stores import open_store

    store = open_store(f"scann:{folder}", dimension=vecs.shape[1], target_recall=0.99)
    ids = [str(i) for i in range(len(vecs))]
    for s in tqdm(range(0, len(vecs), 50_000), desc="add", unit="block"):
        store.add(ids[s : s + 50_000], vecs[s : s + 50_000])
    store.optimize()
    store.persist()
    store.close()


PROBE = """
import json, sys, time
import numpy as np
from magretrieve.stores import open_store
store = open_store("scann:" + sys.argv[1], dimension=int(sys.argv[3]))
q = np.load(sys.argv[2])
out = {"kernels": store.describe()["parameters"]["kernels"], "cells": {}}
for bs in json.loads(sys.argv[4]):
    store.search(q[:bs], 10, with_vectors=False)
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < float(sys.argv[5]):
        for s in range(0, len(q) - bs + 1, bs):
            store.search(q[s:s + bs], 10, with_vectors=False)
            n += bs
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out["cells"][str(bs)] = {"qps": n / wall, "cpu_ms": cpu * 1000 / n}
out["ids"] = [[int(h.id) for h in row] for row in store.search(q, 10, with_vectors=False)]
print(json.dumps(out))
"""


def probe(folder: Path, queries: Path, dim: int, flag: str, seconds: float) -> dict[str, Any]:
    env = {**os.environ, "MAGRETRIEVE_SCANN_AVX2": flag, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", PROBE, str(folder), str(queries), str(dim),
           json.dumps(BATCHES), str(seconds)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"probe failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


@click.command()
@click.option("--n", default=300_000, show_default=True, help="Stored vectors.")
@click.option("--dim", default=384, show_default=True)
@click.option("--queries", "nq", default=1000, show_default=True)
@click.option("--seconds", default=5.0, show_default=True, help="Per batch size and round.")
@click.option("--rounds", default=2, show_default=True, help="Each setting runs this often.")
@click.option(
    "--out", default=None, help="Results stem (default benchmarks/results/scann_kernels)."
)
@lock_option
def main(
    n: int, dim: int, nq: int, seconds: float, rounds: int, out: str | None, lock: str
) -> None:
    """ScaNN search speed with its own kernel choice against AVX2 switched on."""
    root = cache_dir("scann_kernels") / f"n{n}-d{dim}"
    folder, qfile = root / "store", root / "queries.npy"
    with cpu_lock(lock or None):
        vecs, q = make_data(n, dim, nq)
        if not (folder / "scann_store.json").is_file():
            root.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            build(folder, vecs)
            print(f"built {n:,} in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        np.save(qfile, q)
        scores = q @ vecs.T
        top = np.argpartition(-scores, K, axis=1)[:, :K]
        exact = np.take_along_axis(top, np.argsort(-np.take_along_axis(scores, top, 1), 1), 1)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETTINGS}
        for r in range(rounds):
            order = list(SETTINGS) if r % 2 == 0 else list(reversed(SETTINGS))
            for name in order:
                runs[name].append(probe(folder, qfile, dim, SETTINGS[name], seconds))
                print(f"round {r + 1} {name}: {runs[name][-1]['kernels']}", file=sys.stderr)
    rows = []
    ids = {name: np.array(rs[-1]["ids"]) for name, rs in runs.items()}
    names = list(SETTINGS)
    same = float(np.mean((ids[names[0]] == ids[names[1]]).all(axis=1)))
    for name, rs in runs.items():
        recall = float(
            np.mean([len(set(a) & set(b)) / K for a, b in zip(ids[name], exact, strict=True)])
        )
        for bs in BATCHES:
            qps = float(np.median([x["cells"][str(bs)]["qps"] for x in rs]))
            cpu = float(np.median([x["cells"][str(bs)]["cpu_ms"] for x in rs]))
            base = float(np.median([x["cells"][str(bs)]["qps"] for x in runs[names[0]]]))
            rows.append([name, rs[-1]["kernels"], bs, f"{qps:.0f}", f"{cpu:.2f}",
                         f"{qps / base:.2f}x", f"{recall:.4f}"])  # fmt: skip
    stem = Path(out) if out else REPO / "benchmarks" / "results" / "scann_kernels"
    text = [
        "# ScaNN kernels: its own CPU check against AVX2 switched on",
        "",
        f"Command: `{recorded_command()}`",
        "",
        f"Machine: {machine_summary()}",
        "",
        f"Store: `scann:` with `target_recall=0.99`, {n:,} vectors of {dim} dimensions "
        f"(256 clusters, log-normal norms); {nq:,} held-out queries (stored-like points moved "
        f"to cosine ~0.7). One thread; median of {rounds} alternated rounds of {seconds:g} s "
        "per batch size.",
        "",
        markdown_table(
            [
                "kernels asked",
                "ScaNN ran",
                "batch",
                "q/s",
                "CPU ms/query",
                "x own check",
                "recall@10",
            ],
            rows,
        ),  # fmt: skip
        "",
        f"Queries whose 10 hits are the same under both settings: {same:.1%}.",
        "",
    ]
    stem.with_suffix(".md").write_text("\n".join(text))
    stem.with_suffix(".json").write_text(
        json.dumps(
            {
                "command": recorded_command(),
                "machine": machine_summary(),
                "n": n,
                "dim": dim,
                "rows": rows,
                "same_hits": same,
            },
            indent=2,
        )
        + "\n"  # fmt: skip
    )
    print("\n".join(text))


if __name__ == "__main__":
    main()
