"""Stores side by side on ≥ 50k real passages: recall@10 vs exact, q/s, indexing docs/s.

Passages: sentences of the scifact + cranfield abstracts (≥ 4 words), ~54k; queries: both
sets' queries (1,334). Vectors: all-MiniLM-L6-v2 in ``qnorm`` (documents keep their raw
pooled magnitude, queries are unit-norm), computed once and cached in .cache/stores
(see benchmarks/_store_data.py). Every store is fed the same vectors through the
magretrieve adapters, so the numbers compare stores, not encoders.

    nice -n 10 python benchmarks/stores.py            # writes benchmarks/results/stores.md
    nice -n 10 python benchmarks/stores.py --only milvus-server,chroma,lancedb --append \
        --out benchmarks/results/stores_databases.md  # adds a second table to that file

``--only`` picks store kinds (the exact memory store always runs as the reference row):
faiss, qdrant-memory, qdrant-edge, pgvector (starts PostgreSQL through pgserver), milvus
(Milvus Lite), milvus-server (starts a Milvus standalone server, ``milvus-server``), chroma
(embedded) and lancedb (embedded; exact scan and IVF_HNSW_SQ).

q/s "single" = one query per call (the serving case, FAISS with one OpenMP thread unless
noted); "batch" = all queries in one call. Times are wall clock on a shared 2-core machine;
compare ratios within the table, not across machines.
"""

from __future__ import annotations

import contextlib
import platform
import shutil
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np
from _common import recorded_command
from _servers import milvus_server
from _store_data import load_vectors, passages

from magretrieve.core.topk import exact_search
from magretrieve.stores import _faiss_index, open_store

K = 10
RESULTS = Path(__file__).resolve().parent / "results" / "stores.md"


def recall(got: list[list[str]], exact: list[set[str]]) -> float:
    return float(np.mean([len(set(g) & e) / K for g, e in zip(got, exact, strict=True)]))


def timed_add(store, ids, docs, batch: int = 1024) -> float:
    t0 = time.perf_counter()
    for s in range(0, len(ids), batch):
        store.add(ids[s : s + batch], docs[s : s + batch])
    store.optimize()
    store.persist()
    return time.perf_counter() - t0


def measure(store, queries, exact_sets, n_single: int) -> dict:
    t0 = time.perf_counter()
    res = store.search(queries, K, with_vectors=False)
    batch_s = time.perf_counter() - t0
    got = [[h.id for h in row] for row in res]
    single = queries[:n_single]
    store.search(single[:5], K, with_vectors=False)  # warm
    t0 = time.perf_counter()
    for row in single:
        store.search(row[None, :], K, with_vectors=False)
    single_s = time.perf_counter() - t0
    return {
        "recall": recall(got, exact_sets),
        "qps_single": n_single / single_s,
        "qps_batch": len(queries) / batch_s,
    }


def encoder_rate(n: int = 512) -> float:
    """Passages/s of the torch encoder on a sample (for end-to-end indexing docs/s)."""
    from magretrieve.train.encoder import Encoder

    _, texts = passages()
    rng = np.random.default_rng(0)
    sample = [texts[i] for i in rng.choice(len(texts), size=n, replace=False)]
    enc = Encoder.load("all-MiniLM-L6-v2", mode="qnorm")
    enc.encode_documents(sample[:32])
    t0 = time.perf_counter()
    enc.encode_documents(sample, batch_size=128)
    return n / (time.perf_counter() - t0)


def end_to_end_rate(export_dir: Path, n: int, tmp: Path) -> dict:
    """``magretrieve index`` path (ONNX encoder + FAISS HNSW via Retriever) on n passages."""
    from magretrieve.data.readers import Document
    from magretrieve.serving.indexing import index_documents
    from magretrieve.serving.retriever import Retriever

    ids, texts = passages()
    docs = [Document(i, t) for i, t in zip(ids[:n], texts[:n], strict=True)]
    out = {}
    for kind, spec in (
        ("faiss hnsw", f"faiss:{tmp / 'e2e-faiss'}"),
        ("qdrant-edge", f"qdrant-edge:{tmp / 'e2e-edge'}"),
    ):
        opts = {"index_type": "hnsw"} if kind == "faiss hnsw" else {}
        with Retriever.load(export_dir, store=spec, **opts) as r:
            report = index_documents(r, docs, batch_size=64, progress=False)
        out[kind] = report.docs_per_second
    return out


def row_lines(rows: list[dict]) -> list[str]:
    """The markdown table of ``rows`` (the first row is the exact reference)."""
    exact_single = rows[0]["qps_single"]
    lines = [
        "| store | setting | recall@10 | q/s single | × exact | q/s batch | index docs/s (store only) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['store']} | {r['setting']} | {r['recall']:.4f} | {r['qps_single']:.0f} | "
            f"{r['qps_single'] / exact_single:.1f} | {r['qps_batch']:.0f} | {r['docs_per_s']:.0f} |"
        )
    return lines


def write_appended(args: SimpleNamespace, rows: list[dict], n: int, n_queries: int) -> None:
    """Add this run to ``args.out`` as its own section: own command, own exact reference row."""
    from importlib.metadata import PackageNotFoundError, version

    def ver(pkg: str) -> str:
        try:
            return version(pkg)
        except PackageNotFoundError:
            return "?"

    lines = [
        "",
        "## Second run: more database stores",
        "",
        f"Command: `{recorded_command(prefix='nice -n 10 python')}` (single-query timing over "
        f"{args.single} queries)",
        "",
        "The table above came from an earlier run; this one has its own exact reference row, "
        "timed in the same run as the stores below it. Compare ratios (× exact) within a table, "
        "not across the two.",
        "",
        f"- same data and vectors as above: {n:,} passages, {n_queries:,} queries; shared "
        "2-core machine, wall-clock",
        f"- Milvus standalone: the `milvus` {ver('milvus')} package's `milvus-server`, started "
        f"by the benchmark on 127.0.0.1, reached through pymilvus {ver('pymilvus')}; "
        f"Chroma {ver('chromadb')} embedded (PersistentClient, always HNSW); "
        f"LanceDB {ver('lancedb')} embedded (the IVF_HNSW_SQ index is built by optimize() "
        "after loading; build time included in docs/s)",
        "",
        *row_lines(rows),
        "",
    ]
    text = args.out.read_text() if args.out.is_file() else ""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text.rstrip("\n") + "\n" + "\n".join(lines))
    print("\n".join(lines))


@click.command(help=__doc__.splitlines()[0])
@click.option("--single", type=int, default=300, help="queries timed one at a time")
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS)
@click.option("--quick", is_flag=True, help="fewer configurations (smoke run)")
@click.option(
    "--export",
    type=click.Path(path_type=Path),
    default=None,
    help="an all-MiniLM-L6-v2 qnorm export: also time `magretrieve index` end to end",
)
@click.option("--e2e-docs", type=int, default=2000)
@click.option(
    "--only",
    default="",
    help="comma-separated store kinds to run (e.g. pgvector,milvus), next to the exact "
    "memory store as the reference row",
)
@click.option(
    "--append",
    is_flag=True,
    help="add this run as a second table to --out (keeping what is there) instead of "
    "rewriting it; no encoder timing",
)
@click.option(
    "--no-servers",
    is_flag=True,
    help="skip pgvector (starts PostgreSQL through pgserver) and Milvus Lite",
)
def main(**options: Any) -> None:
    args = SimpleNamespace(**options)

    import faiss

    ids, _, docs, queries = load_vectors()
    n, dim = docs.shape
    print(f"{n} passages, {len(queries)} queries, dim {dim}", flush=True)
    t0 = time.perf_counter()
    exact_idx, _ = exact_search(queries, docs, K)
    exact_sets = [{ids[j] for j in row} for row in exact_idx]
    print(f"exact top-{K} in {time.perf_counter() - t0:.1f}s", flush=True)
    norms = np.linalg.norm(docs, axis=1)

    configs: list[tuple[str, str, dict, dict]] = [
        ("numpy exact (memory store)", "memory:", {}, {}),
        ("FAISS flat IP", "faiss", {"index_type": "flat"}, {}),
        ("FAISS flat IP, 2 threads/query", "faiss", {"index_type": "flat"}, {"threads": 2}),
        (
            "FAISS HNSW M=16 efC=100 ef=64",
            "faiss",
            {"index_type": "hnsw", "hnsw_m": 16, "ef_construction": 100, "ef_search": 64},
            {"sweep": [32, 64, 128, 256]},
        ),
        (
            "FAISS HNSW M=32 efC=200",
            "faiss",
            {"index_type": "hnsw", "hnsw_m": 32, "ef_construction": 200, "ef_search": 64},
            {"sweep": [32, 64, 128, 256]},
        ),
        (
            "FAISS IVF nlist=1024",
            "faiss",
            {"index_type": "ivf", "nlist": 1024, "nprobe": 16},
            {"nprobe": [8, 16, 32, 64]},
        ),
        ("Qdrant local (embedded, exact)", "qdrant-memory:bench", {}, {}),
        (
            "Qdrant Edge HNSW M=16 efC=100",
            "qdrant-edge",
            {"hnsw_m": 16, "ef_construction": 100},
            {"edge_ef": [64, 128, 256]},
        ),
        (
            "Qdrant Edge HNSW M=16 + int8 (rescore, oversampling 2)",
            "qdrant-edge",
            {"hnsw_m": 16, "ef_construction": 100, "quantization": "int8", "ef_search": 128},
            {"scaling": True},
        ),
        (
            "pgvector HNSW M=16 efC=64 (vector_ip_ops, PostgreSQL server)",
            "pgvector",
            {"index_type": "hnsw", "hnsw_m": 16, "ef_construction": 64},
            {"pg_ef": [40, 100, 200]},
        ),
        ("Milvus Lite FLAT, metric IP (embedded)", "milvus", {}, {}),
        ("Milvus standalone 2.3.5 FLAT, metric IP (server)", "milvus-server", {}, {}),
        (
            "Chroma HNSW M=16 efC=100 ef=100, space ip (embedded)",
            "chroma",
            {"hnsw_m": 16, "ef_construction": 100, "ef_search": 100},
            {},
        ),
        ("LanceDB exact scan, distance dot (embedded)", "lancedb", {}, {}),
        (
            "LanceDB IVF_HNSW_SQ nlist=64 M=16 efC=100, distance dot (embedded)",
            "lancedb",
            {
                "index_type": "ivf_hnsw_sq",
                "nlist": 64,
                "hnsw_m": 16,
                "ef_construction": 100,
                "force": True,
            },
            {"lance": [(8, 64), (16, 128)]},
        ),
    ]
    known = {c[1].split(":")[0] for c in configs}
    if args.no_servers:
        configs = [c for c in configs if c[1] not in ("pgvector", "milvus", "milvus-server")]
    if args.only:
        keep = set(args.only.split(","))
        if keep - known:
            raise click.BadParameter(
                f"unknown store kind(s) {', '.join(sorted(keep - known))}; "
                f"known: {', '.join(sorted(known))}",
                param_hint="--only",
            )
        configs = [c for c in configs if c[1] == "memory:" or c[1].split(":")[0] in keep]
    if args.quick:
        configs = [c for c in configs if "M=32" not in c[0] and "int8" not in c[0]]
    tmp = Path(tempfile.mkdtemp(prefix="mr-bench-stores-"))
    rows = []
    pg_server = None
    servers = contextlib.ExitStack()
    milvus_url = None
    try:
        for name, kind, opts, extra in configs:
            spec = kind
            if kind == "faiss":
                spec = f"faiss:{tmp / str(len(rows))}"
            elif kind == "qdrant-edge":
                spec = f"qdrant-edge:{tmp / ('e' + str(len(rows)))}"
            elif kind == "pgvector":
                import pgserver  # a real PostgreSQL + pgvector, started here, on a unix socket

                pg_server = pg_server or pgserver.get_server(tmp / "pg", cleanup_mode="delete")
                spec = f"pgvector:{pg_server.get_uri()}#bench{len(rows)}"
            elif kind == "milvus":
                spec = f"milvus:{tmp / 'milvus.db'}/bench{len(rows)}"
            elif kind == "milvus-server":
                milvus_url = milvus_url or servers.enter_context(milvus_server(tmp / "milvus"))
                spec = f"milvus:{milvus_url}/bench{len(rows)}"
            elif kind in ("chroma", "lancedb"):
                spec = f"{kind}:{tmp / kind}/bench{len(rows)}"
            store = open_store(spec, dimension=dim, **opts)
            build_s = timed_add(store, ids, docs)
            print(f"{name}: built in {build_s:.1f}s", flush=True)
            base = {"store": name, "build_s": build_s, "docs_per_s": n / build_s}
            if kind == "faiss" and "threads" in extra:
                store.single_query_threads = extra["threads"]
            if "sweep" in extra:
                for ef in extra["sweep"]:
                    store.set_search_parameters(ef_search=ef)
                    rows.append(
                        {
                            **base,
                            "setting": f"efSearch={ef}",
                            **measure(store, queries, exact_sets, args.single),
                        }
                    )
                    print(rows[-1], flush=True)
            elif "nprobe" in extra:
                for p in extra["nprobe"]:
                    store.set_search_parameters(nprobe=p)
                    rows.append(
                        {
                            **base,
                            "setting": f"nprobe={p}",
                            **measure(store, queries, exact_sets, args.single),
                        }
                    )
                    print(rows[-1], flush=True)
            elif "pg_ef" in extra:
                for ef in extra["pg_ef"]:
                    store.ef_search = ef
                    rows.append(
                        {
                            **base,
                            "setting": f"hnsw.ef_search={ef}",
                            **measure(store, queries, exact_sets, args.single),
                        }
                    )
                    print(rows[-1], flush=True)
            elif "lance" in extra:
                for nprobe, ef in extra["lance"]:
                    store.nprobe, store.ef_search = nprobe, ef
                    rows.append(
                        {
                            **base,
                            "setting": f"nprobes={nprobe}, ef={ef}",
                            **measure(store, queries, exact_sets, args.single),
                        }
                    )
                    print(rows[-1], flush=True)
            elif "edge_ef" in extra:
                indexed = store.describe()["parameters"]["indexed_vectors"]
                for ef in extra["edge_ef"]:
                    store.ef_search = ef
                    rows.append(
                        {
                            **base,
                            "setting": f"hnsw_ef={ef} ({indexed:,} vectors in HNSW)",
                            **measure(store, queries, exact_sets, args.single),
                        }
                    )
                    print(rows[-1], flush=True)
            elif "scaling" in extra:
                for scaling in (False, True):
                    store.query_scaling = scaling
                    label = "queries scaled to mean doc_norm" if scaling else "raw unit queries"
                    rows.append(
                        {
                            **base,
                            "setting": f"hnsw_ef=128, {label}",
                            **measure(store, queries, exact_sets, args.single),
                        }
                    )
                    print(rows[-1], flush=True)
            else:
                rows.append(
                    {**base, "setting": "", **measure(store, queries, exact_sets, args.single)}
                )
                print(rows[-1], flush=True)
            store.close()
            if kind in ("faiss", "qdrant-edge"):
                shutil.rmtree(spec.split(":", 1)[1], ignore_errors=True)
    finally:
        servers.close()
        if pg_server is not None:
            pg_server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)

    if args.append:
        write_appended(args, rows, n, len(queries))
        return

    enc_rate = encoder_rate()
    print(f"encoder: {enc_rate:.1f} passages/s", flush=True)
    e2e = {}
    if args.export is not None:
        e2e_tmp = Path(tempfile.mkdtemp(prefix="mr-bench-e2e-"))
        try:
            e2e = end_to_end_rate(args.export, args.e2e_docs, e2e_tmp)
        finally:
            shutil.rmtree(e2e_tmp, ignore_errors=True)
        print(f"end to end: {e2e}", flush=True)
    lines = [
        "# Stores benchmark: recall@10 vs exact, queries/s, indexing docs/s",
        "",
        f"Command: `{recorded_command(prefix='nice -n 10 python')}` (single-query timing over "
        f"{args.single} queries)",
        "",
        f"- data: {n:,} passages (sentences ≥ 4 words of scifact + cranfield abstracts), "
        f"{len(queries):,} queries (scifact + cranfield), dim {dim}",
        "- vectors: all-MiniLM-L6-v2, mode qnorm (documents keep their raw pooled magnitude: "
        f"doc_norm mean {norms.mean():.2f}, min {norms.min():.2f}, max {norms.max():.2f}; "
        "queries unit-norm), searched by inner product",
        f"- machine: {platform.machine()}, {_faiss_index.default_threads()} OpenMP threads for "
        "batches (1 per single query unless noted), shared "
        "with other jobs (wall-clock; compare ratios within this table)",
        f"- faiss {faiss.__version__}; qdrant-client embedded mode is brute force; Qdrant Edge "
        "builds HNSW (optimize() after loading); pgvector: PostgreSQL 16 + pgvector started "
        "by the benchmark (pgserver), unix socket, one query per SQL statement; Milvus Lite "
        "(milvus-lite) runs embedded through pymilvus",
        "",
        *row_lines(rows),
    ]
    lines += [
        "",
        f"Indexing is bounded by encoding: the torch encoder ran at {enc_rate:.0f} passages/s "
        "here (sample of 512 passages), below every store's insert rate.",
    ]
    for kind, rate in e2e.items():
        lines.append(
            f"End to end (`index_documents`: ONNX export of all-MiniLM-L6-v2 qnorm + {kind}, "
            f"first {args.e2e_docs} passages, batch 64, checkpoints on): {rate:.0f} docs/s."
        )
    lines.append("")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
