"""Plug-in path: recall@10 of ``cos·m(d)`` ranked over a cosine prefetch, by prefetch size.

An existing Cosine collection keeps unit vectors ``d̂``; ``magretrieve annotate`` writes
``m(d)`` into each point and search re-ranks the top-``P`` cosine candidates by ``cos·m``
(Qdrant ``FormulaQuery``; pgvector SQL over a ``<=>`` prefetch). A document outside the cosine
top-``P`` is never scored, so recall against the exact ``cos·m(d)`` ranking depends on ``P``
and on how widely ``m`` varies. This measures it on real data, for three magnitudes:

- the corpus prior at the recommended strength (β 0.03) and a strong one (β 0.3);
- the raw pooled norm of all-MiniLM-L6-v2 (the magnitude a magnitude-keeping export keeps).

Data: benchmarks/_store_data.py (≥ 50k passages of scifact + cranfield, their 1,334 queries,
all-MiniLM-L6-v2; ``d̂`` is the unit direction). Recall for every ``P`` is computed for all
queries in numpy (an exact cosine prefetch); the same ranking is then run through the real
stores (an annotated Cosine collection in embedded Qdrant, and a pgvector table with an HNSW
``vector_cosine_ops`` index on a PostgreSQL started here) for the prior β 0.03 on
``--store-queries`` queries, reporting recall and single-query q/s.

    python benchmarks/study.py plugin_prefetch        # writes benchmarks/results/plugin_prefetch.md
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np
from _common import REPO, cpu_lock, machine_summary, markdown_table, recorded_command
from _store_data import load_vectors

from magretrieve.core.topk import top_k

K = 10
PREFETCH = (10, 20, 50, 100, 200, 500, 1000)
RESULTS = REPO / "benchmarks" / "results" / "plugin_prefetch.md"


def prefetch_recall(
    cos: np.ndarray, m: np.ndarray, sizes: tuple[int, ...], k: int = K
) -> dict[int, float]:
    """Recall@k of "top-P by cosine, re-ranked by cos·m" against the exact cos·m top-k."""
    exact = top_k(cos * m[None, :], k)[0]
    out = {}
    for p in sizes:
        cand = top_k(cos, min(p, cos.shape[1]))[0]
        rescored = np.take_along_axis(cos, cand, axis=1) * m[cand]
        got = np.take_along_axis(cand, top_k(rescored, min(k, cand.shape[1]))[0], axis=1)
        out[p] = float(np.mean([len(set(g) & set(e)) / k for g, e in zip(got, exact, strict=True)]))
    return out


def prior_magnitudes(hubs: np.ndarray, beta: float, k: int = 10) -> np.ndarray:
    """The hub prior's m(d) = exp(−β·z) from hub scores (as fitted by annotate)."""
    z = (np.asarray(hubs, np.float64) - float(hubs.mean())) / float(hubs.std())
    return np.exp(-beta * z)


def through_stores(
    units: np.ndarray, queries: np.ndarray, m_prior: np.ndarray, sizes, beta: float, tmp: Path
) -> list[list[str]]:
    """Annotated Qdrant (embedded) and pgvector (HNSW cosine) at each prefetch size."""
    import pgserver
    import psycopg
    from pgvector.psycopg import register_vector
    from qdrant_client import QdrantClient, models

    from magretrieve.priors import HubPrior
    from magretrieve.priors.annotate import annotate_store
    from magretrieve.stores import open_store

    n = len(units)
    exact = top_k((queries @ units.T) * m_prior[None, :], K)[0]
    client = QdrantClient(path=str(tmp / "qdrant"))
    client.create_collection(
        "docs", vectors_config=models.VectorParams(size=units.shape[1], distance="Cosine")
    )
    for s in range(0, n, 2048):
        client.upsert(
            "docs",
            points=models.Batch(
                ids=list(range(s, min(s + 2048, n))), vectors=units[s : s + 2048].tolist()
            ),
        )
    client.close()
    server = pgserver.get_server(tmp / "pg", cleanup_mode="delete")
    try:
        with psycopg.connect(server.get_uri(), autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            register_vector(conn)
            conn.execute(
                f"CREATE TABLE docs (id bigint PRIMARY KEY, embedding vector({units.shape[1]}))"
            )
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO docs VALUES (%s, %s)", [(i, units[i]) for i in range(n)]
                )
            t0 = time.perf_counter()
            conn.execute("CREATE INDEX ON docs USING hnsw (embedding vector_cosine_ops)")
            print(f"pgvector HNSW cosine index in {time.perf_counter() - t0:.0f}s", flush=True)
        specs = {
            "Qdrant embedded (exact prefetch)": f"qdrant-local:{tmp / 'qdrant'}/docs",
            "pgvector HNSW vector_cosine_ops": f"pgvector:{server.get_uri()}#docs",
        }
        rows = []
        for label, spec in specs.items():
            annotate_store(spec, prior=HubPrior(beta, 10), progress=False)
            for p in sizes:
                with open_store(spec, prefetch=p) as store:
                    store.search(queries[:5], K, with_vectors=False)  # warm
                    t0 = time.perf_counter()
                    got = [store.search(q[None, :], K, with_vectors=False)[0] for q in queries]
                    qps = len(queries) / (time.perf_counter() - t0)
                rec = np.mean(
                    [
                        len({int(h.id) for h in g} & set(e.tolist())) / K
                        for g, e in zip(got, exact, strict=True)
                    ]
                )
                rows.append([label, p, f"{rec:.4f}", f"{qps:.0f}"])
                print(rows[-1], flush=True)
        return rows
    finally:
        server.cleanup()


@click.command(help=__doc__.splitlines()[0])
@click.option("--docs", type=int, default=0, help="first N passages only (0 = all)")
@click.option("--store-queries", type=int, default=100)
@click.option("--no-stores", is_flag=True, help="numpy only")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS)
@click.option("--lock", default="default", help="CPU lock file ('' = none)")
def main(**options: Any) -> None:
    args = SimpleNamespace(**options)

    with cpu_lock(args.lock):
        _, _, docs, queries = load_vectors(lock=False)
        if args.docs:
            docs = docs[: args.docs]
        norms = np.linalg.norm(docs, axis=1)
        units = (docs / norms[:, None]).astype(np.float32)
        queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
        cos = queries @ units.T
        from magretrieve.priors.hub import hub_scores

        hubs = hub_scores(units, 10)
        magnitudes = {
            "corpus prior β 0.03 (recommended)": prior_magnitudes(hubs, 0.03),
            "corpus prior β 0.3": prior_magnitudes(hubs, 0.3),
            "raw MiniLM norm (magnitude-keeping export)": norms.astype(np.float64),
        }
        table = []
        for label, m in magnitudes.items():
            rec = prefetch_recall(cos, m, PREFETCH)
            spread = np.percentile(m, 95) / np.percentile(m, 5)
            table.append([label, f"{spread:.3f}", *(f"{rec[p]:.4f}" for p in PREFETCH)])
            print(table[-1], flush=True)
        store_rows = []
        if not args.no_stores:
            tmp = Path(tempfile.mkdtemp(prefix="mr-plugin-"))
            try:
                store_rows = through_stores(
                    units,
                    queries[: args.store_queries],
                    magnitudes["corpus prior β 0.03 (recommended)"],
                    PREFETCH,
                    0.03,
                    tmp,
                )
            finally:
                shutil.rmtree(tmp, ignore_errors=True)

    lines = [
        "# Plug-in path: recall@10 of cos·m(d) over a cosine prefetch, by prefetch size",
        "",
        f"Command: `{recorded_command()}`",
        "",
        f"- data: {len(units):,} passages, {len(queries):,} queries, all-MiniLM-L6-v2 "
        "directions d̂ (benchmarks/_store_data.py); exact = top-10 of cos·m(d) over all passages",
        f"- machine: {machine_summary()}",
        "- spread = m(d) 95th / 5th percentile",
        "",
        "Recall@10 against exact cos·m(d), exact cosine prefetch of P candidates (numpy, all queries):",
        "",
        markdown_table(["m(d)", "spread", *(f"P={p}" for p in PREFETCH)], table),
        "",
    ]
    if store_rows:
        lines += [
            f"Through the stores (corpus prior β 0.03, first {args.store_queries} queries, "
            "one query per call):",
            "",
            markdown_table(["store", "prefetch", "recall@10", "q/s single"], store_rows),
            "",
        ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
