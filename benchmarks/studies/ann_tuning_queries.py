"""Which queries made from a store's own vectors predict ANN recall on real queries?

A store tuning ``--target-recall`` has no queries, only its vectors. This study builds FAISS
HNSW (M=32, efConstruction 80, inner product) over N synthetic magnitude-keeping vectors (the
mixture of ``benchmarks/mips_scale.py``, fitted to the MiniLM qnorm passages) and measures
recall@10 against exact inner product at each efSearch for: 1,000 real encoded queries
(``real``); 400 stored directions, each vector its own answer (``dir``, the old sample); the same
directions with the source vector held out of both answers (``held-out``); and those moved off
by isotropic noise to cosine c with the source, source held out (``held-out cos c``, the
store's sample at c = 0.9). A sample predicts well when it reaches the store's tuning bar
(0.995 for a 0.99 target) at an efSearch where ``real`` is at least the target.

    python benchmarks/study.py ann_tuning_queries --vectors 200000 --out benchmarks/results
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import numpy as np
from _common import cpu_lock, lock_option, machine_summary, markdown_table, recorded_command

K = 10
EF = (16, 32, 64, 128, 192, 256, 384, 512, 768, 1024)


def _held_out(rows: np.ndarray, source: np.ndarray | None) -> np.ndarray:
    """Rows without the query's source vector, cut to K (padded with -1)."""
    if source is None:
        return rows[:, :K]
    out = np.full((len(rows), K), -1, dtype=np.int64)
    for i, (row, own) in enumerate(zip(rows, source, strict=True)):
        kept = [r for r in row if r != own][:K]
        out[i, : len(kept)] = kept
    return out


@click.command(help=__doc__.splitlines()[0])
@click.option("--vectors", type=int, default=200_000, show_default=True)
@click.option(
    "--cosines",
    default="0.9,0.7,0.5",
    show_default=True,
    help="Cosines to the source of the noisy samples, comma-separated.",
)
@click.option("--out", type=click.Path(path_type=Path), default=Path("benchmarks/results"))
@click.option("--name", default="ann_tuning_queries", show_default=True, help="Results file stem.")
@lock_option
def main(vectors: int, cosines: str, out: Path, name: str, lock: str) -> None:
    import faiss
    from _mips_data import Mixture, exact_topk, recall
    from _store_data import load_vectors

    faiss.omp_set_num_threads(2)
    command = recorded_command()
    with cpu_lock(lock or None):
        start = time.perf_counter()
        _, _, docs, queries = load_vectors(lock=False)
        order = np.random.default_rng(7).permutation(len(queries))
        real = np.ascontiguousarray(queries[order[:1000]], dtype=np.float32)
        x = Mixture.fit(docs.astype(np.float32), 256).sample(vectors, seed=vectors)
        units = x / np.linalg.norm(x, axis=1, keepdims=True)
        rng = np.random.default_rng(0)
        pick = rng.choice(vectors, 400, replace=False)
        u = units[pick]
        g = rng.standard_normal(u.shape).astype(np.float32)
        g -= (g * u).sum(axis=1, keepdims=True) * u
        g /= np.linalg.norm(g, axis=1, keepdims=True)
        samples: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
            "real": (real, None),
            "dir": (u, None),
            "held-out": (u, pick),
        }
        for c in (float(v) for v in cosines.split(",")):
            samples[f"held-out cos {c}"] = ((c * u + np.sqrt(1 - c * c) * g), pick)
        samples = {
            k: (np.ascontiguousarray(q, dtype=np.float32), s) for k, (q, s) in samples.items()
        }
        truth = {k: _held_out(exact_topk(q, x, K + 1), s) for k, (q, s) in samples.items()}
        index = faiss.IndexHNSWFlat(x.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        index.add(x)
        table = []
        for ef in EF:
            index.hnsw.efSearch = ef
            row = [str(ef)]
            for sample, (q, s) in samples.items():
                found = _held_out(index.search(q, K + 1)[1], s)
                row.append(f"{recall(found, truth[sample]):.4f}")
            table.append(row)
        seconds = time.perf_counter() - start
    out.mkdir(parents=True, exist_ok=True)
    text = (
        "# Which self-made queries predict ANN recall on real queries\n\n"
        f"Command: `{command}`\n\nMachine: {machine_summary()}; 2 threads; {seconds / 60:.1f} min.\n"
        f"FAISS HNSW32 (efConstruction 80, inner product) over {vectors:,} synthetic "
        "magnitude-keeping vectors (the mips_scale mixture); recall@10 against exact inner "
        "product.\n\n" + markdown_table(["efSearch", *samples], table) + "\n"
    )
    (out / f"{name}.md").write_text(text)
    (out / f"{name}.json").write_text(
        json.dumps({"command": command, "vectors": vectors, "table": table}, indent=2) + "\n"
    )
    click.echo(text)
