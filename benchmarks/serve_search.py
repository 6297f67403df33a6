"""``/search`` over HTTP at a million vectors: text in, hits out, with the recall of the hits.

What a user of ``magretrieve serve EXPORT --store SPEC`` waits for, measured end to end:

* **Vectors.** ``--sizes`` (default 1,000,000) magnitude-keeping vectors made as
  ``benchmarks/mips_scale.py`` makes them: a ``--clusters``-component mixture
  (``_mips_data.Mixture``, seed 0) fitted on the 53,910 MiniLM qnorm passages of
  ``_store_data`` (scifact + cranfield sentences, documents keep their pooled magnitude),
  sampled with ``seed = n``. The passages are encoded by the torch encoder; the run checks that
  the served export (the MiniLM qnorm ONNX export ``serve_load.ensure_export`` makes) puts the
  same texts at the same place (cosine and norm ratio of query and document vectors, recorded
  as ``query_space``), so its query vectors search these documents as the real ones.
* **Stores** (``--stores``): ``scann:``, ``faiss:`` HNSW (M=32, efConstruction=80) and
  ``qdrant-edge:``, each opened with ``target_recall=0.99``, filled with tqdm progress,
  optimized (it tunes its search knob on its own default sample: no real query) and stamped
  with the export's model metadata. Built stores are cached under
  ``.cache/serve_search/stores-N/`` and reused by later runs.
* **Queries.** Held-out real query **texts**: the first ``--queries`` (1,000) of the scifact +
  cranfield queries in ``mips_scale``'s order (``default_rng(7)`` permutation), the set
  ``mips_scale`` holds out from every choice. The stores tuned on their own synthetic sample, so
  no query text was seen by any store; the mixture is fitted on passages only.
* **Load cells**: batch-1 ``POST /search`` (``k=10``) at ``--clients`` closed-loop clients
  (serve_load's raw-asyncio keep-alive load generator on the same cores), ``--warmup`` then
  ``--seconds`` per cell: q/s, p50/p95/p99, errors, **recall@10 of the served hits against exact
  inner product** (``magretrieve.core.topk.exact_search`` over every vector, the query encoded
  by the same export), the server's RSS after each cell and its own live recall watch
  (``/info``).
* **Ceiling**: the same texts through an in-process ``Retriever`` on the same store and export
  with as many queries in hand as the goal cell has requests in flight (its client count, 32):
  the fastest of ``Retriever.search`` one text per call, that many threads calling it at once
  (an application embedding the library), and ``search_batch`` of that many texts at a time.
  ``search_batch`` of the whole list at once is measured beside it and reported with its ratio
  (``vs_all_at_once``), not judged: no server with 32 requests in flight holds 1,000 queries,
  and ScaNN's batched search costs less per query the more queries one call carries. Measured
  before and after the load cells.
* **Writes**: on a copy of the store, ``POST /documents`` at ``--write-clients`` clients, 64
  scifact documents a request, ``--write-requests`` requests each, while ``--write-search-clients``
  clients search; documents/s against in-process ``index_corpus`` of the same documents into the
  same copy (its final ``optimize()`` skipped: the server never optimizes on a write, and a
  ScaNN optimize rebuilds the whole searcher), search p99 during the writes, and every
  acknowledged id fetched from the store after the server stopped.

The CPU lock (``--lock``) is held per store and phase, not across the run: once for its build
(with the vectors and exact truth before the first store of a size), once for its ceiling, load
cells and writes together. Results merge into ``results/serve_search.json`` per
(store, size), so ``--stores`` / ``--sizes`` runs add up.

    python benchmarks/serve_search.py --sizes 1000000 --stores scann
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import click
import numpy as np
from _common import (
    REPO,
    cache_dir,
    cpu_lock,
    data_dir,
    lock_option,
    machine_summary,
    markdown_table,
    recorded_command,
)
from _mips_data import K, Mixture
from serve_load import KEY, MODEL, Connection, Tally, closed_loop, ensure_export, ours, run_loop
from tqdm.auto import tqdm

TARGET = 0.99
#: store name -> (spec scheme, options at open)
STORES = {
    "scann": ("scann", {}),
    "faiss-hnsw": ("faiss", {"index_type": "hnsw", "hnsw_m": 32, "ef_construction": 80}),
    "qdrant-edge": ("qdrant-edge", {}),
}
DOCS_PER_WRITE = 64
GOAL_CEILING = 0.8
GOAL_RECALL = 0.985
GOAL_TAIL = 3.0
GOAL_RSS = 2.0
ADD_CHUNK = 8192


def say(msg: str) -> None:
    click.echo(f"[{time.strftime('%H:%M:%S')}] {msg}", err=True)


# ----------------------------------------------------------------------------- data


def query_texts(source: str, data: Path, held_out: int) -> list[str]:
    """The held-out query texts (see the module docstring)."""
    if source == "store-data":
        from _store_data import queries

        texts = queries()
        order = np.random.default_rng(7).permutation(len(texts))
        return [texts[i] for i in order[:held_out]]
    from magretrieve.data.readers import load_beir

    return list(load_beir(data).queries.values())[:held_out]


def passages(source: str, data: Path, export: Path, threads: int) -> tuple[list[str], np.ndarray]:
    """(texts, document vectors) the mixture is fitted on: ``store-data`` is mips_scale's
    cached torch-encoded passages; ``export`` encodes the ``--data`` corpus with the export
    (small runs, other models)."""
    if source == "store-data":
        from _store_data import load_vectors

        _, texts, docs, _ = load_vectors(lock=False)
        return texts, docs.astype(np.float32)
    from magretrieve.data.readers import load_beir
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    texts = [d.full_text for d in load_beir(data).corpus.values()]
    enc = OnnxEncoder.load(export, threads=threads)
    return texts, np.asarray(enc.encode_documents(texts), dtype=np.float32)


def make_vectors(n: int, clusters: int, docs: np.ndarray, folder: Path) -> np.ndarray:
    """The n mixture vectors, cached as .npy (made once per size)."""
    path = folder / f"vectors-{n}.npy"
    if path.is_file():
        return np.load(path)
    t0 = time.perf_counter()
    vecs = Mixture.fit(docs, clusters).sample(n, seed=n)
    np.save(folder / f"vectors-{n}.tmp.npy", vecs)
    (folder / f"vectors-{n}.tmp.npy").replace(path)
    say(f"sampled {n:,} vectors in {time.perf_counter() - t0:.0f} s")
    return vecs


def query_space(
    export: Path, threads: int, texts: list[str], docs: np.ndarray, qtexts: list[str], source: str
) -> dict[str, Any]:
    """Does the served export put the mixture's passages (and the queries) where the encoder
    that made them did? Cosine and norm ratio over a sample."""
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    enc = OnnxEncoder.load(export, threads=threads)
    pick = np.unique(np.linspace(0, len(texts) - 1, min(256, len(texts))).astype(int))
    mine = np.asarray(enc.encode_documents([texts[i] for i in pick]), dtype=np.float32)
    theirs = docs[pick]
    nm, nt = np.linalg.norm(mine, axis=1), np.linalg.norm(theirs, axis=1)
    out: dict[str, Any] = {
        "documents_compared": len(pick),
        "document_cosine_mean": round(float(np.mean((mine * theirs).sum(1) / (nm * nt))), 5),
        "document_norm_ratio_mean": round(float(np.mean(nm / nt)), 5),
        "mixture_norm_mean": round(float(nt.mean()), 3),
    }
    qv = np.asarray(enc.encode_queries(qtexts[:256]), dtype=np.float32)
    out["query_norm_mean"] = round(float(np.linalg.norm(qv, axis=1).mean()), 5)
    if source == "store-data":
        from _store_data import load_vectors, queries

        _, _, _, torch_q = load_vectors(lock=False)
        index = {t: i for i, t in enumerate(queries())}
        ref = torch_q[[index[t] for t in qtexts[:256]]]
        cos = (qv * ref).sum(1) / (np.linalg.norm(qv, axis=1) * np.linalg.norm(ref, axis=1))
        out["query_cosine_mean"] = round(float(cos.mean()), 5)
    return out


def truth_rows(export: Path, threads: int, texts: list[str], vecs: np.ndarray) -> np.ndarray:
    """Exact inner-product top-10 rows of each held-out text, its query encoded by the export."""
    from magretrieve.core.topk import exact_search
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    enc = OnnxEncoder.load(export, threads=threads)
    q = np.asarray(enc.encode_queries(texts), dtype=np.float32)
    rows, _ = exact_search(q, vecs, K)
    return rows


# ----------------------------------------------------------------------------- stores


def spec_of(kind: str, folder: Path) -> str:
    return f"{STORES[kind][0]}:{folder}"


def build_store(kind: str, vecs: np.ndarray, folder: Path, export: Path) -> dict[str, Any]:
    """Open with target_recall 0.99, add with progress, optimize, stamp the model; cached."""
    from magretrieve.serving.onnx_encoder import OnnxEncoder
    from magretrieve.serving.retriever import manifest_metadata
    from magretrieve.stores import open_store

    done = folder.with_suffix(".json")
    if done.is_file() and folder.is_dir():
        info = json.loads(done.read_text())
        info["cached"] = True
        return info
    shutil.rmtree(folder, ignore_errors=True)
    n = len(vecs)
    ids = [str(i) for i in range(n)]
    manifest = OnnxEncoder.load(export, threads=1).manifest
    t0 = time.perf_counter()
    store = open_store(
        spec_of(kind, folder), dimension=vecs.shape[1], target_recall=TARGET, **STORES[kind][1]
    )
    store.write_metadata(manifest_metadata(manifest))
    with tqdm(total=n, desc=f"{kind} {n:,} add", unit="vec", mininterval=10) as bar:
        for s in range(0, n, ADD_CHUNK):
            store.add(ids[s : s + ADD_CHUNK], vecs[s : s + ADD_CHUNK])
            bar.update(min(ADD_CHUNK, n - s))
    added = time.perf_counter() - t0
    say(f"{kind}: added in {added:.0f} s; optimizing (index build and recall tuning)")
    store.optimize()
    store.persist()
    built = time.perf_counter() - t0
    params = store.describe()["parameters"]
    store.close()
    info = {
        "add_s": round(added, 1),
        "build_s": round(built, 1),
        "recall": params.get("recall"),
        "options": STORES[kind][1],
        "disk_bytes": sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file()),
    }
    done.write_text(json.dumps(info, indent=2, default=str) + "\n")
    info["cached"] = False
    say(f"{kind}: built in {built:.0f} s; {tuned(info['recall'])}")
    return info


KNOBS = ("ef_search", "hnsw_ef", "nprobe", "leaves_to_search", "reorder")


def tuned(recall: dict[str, Any] | None) -> str:
    r = recall or {}
    knobs = ", ".join(f"{k}={r[k]}" for k in KNOBS if k in r)
    return f"{knobs}; self-measured recall@10 {r.get(f'recall_at_{K}')}, tuned on {r.get('query_kind')}"


# ----------------------------------------------------------------------------- measuring


def recall_of(found: dict[int, list[int]], truth: np.ndarray) -> float:
    """Mean recall@10 over the answers ``{query index: hit rows}``."""
    if not found:
        return float("nan")
    return float(
        np.mean([len(set(rows[:K]) & set(truth[i, :K].tolist())) / K for i, rows in found.items()])
    )


def ceiling(
    export: Path,
    spec: str,
    threads: int,
    texts: list[str],
    truth: np.ndarray,
    seconds: float,
    concurrency: int,
) -> dict[str, Any]:
    """In-process rates over the same texts with ``concurrency`` queries in hand: one
    ``Retriever.search`` per call, ``concurrency`` threads calling it at once (what an
    application embedding the library with that many requests in flight gets), and
    ``search_batch`` of ``concurrency`` texts at a time. The ceiling (``qps``) is the fastest
    of the three; ``search_batch`` of every text at once (``qps_batched``) is measured beside
    it, not part of it (see the module docstring)."""
    from magretrieve.serving.retriever import Retriever

    with Retriever.load(export, spec, threads=threads, create=False) as r:
        r.search(texts[0])
        n, t0 = 0, time.perf_counter()
        found: dict[int, list[int]] = {}
        while time.perf_counter() - t0 < seconds:
            i = n % len(texts)
            found[i] = [int(h.id) for h in r.search(texts[i], k=K)]
            n += 1
        one = n / (time.perf_counter() - t0)
        calls = [0] * concurrency
        found_threads: dict[int, list[int]] = {}

        def caller(c: int, stop: float) -> None:
            while time.perf_counter() < stop:
                i = (c * 7919 + calls[c]) % len(texts)
                found_threads[i] = [int(h.id) for h in r.search(texts[i], k=K)]
                calls[c] += 1

        t0 = time.perf_counter()
        workers = [
            threading.Thread(target=caller, args=(c, t0 + seconds)) for c in range(concurrency)
        ]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        concurrent = sum(calls) / (time.perf_counter() - t0)
        chunks, found_chunks = batched_rate(r, texts, concurrency, seconds)
        batch, found_batched = batched_rate(r, texts, len(texts), seconds)
        rec = recall_of(found_batched, truth)
        params = r.describe()["store"]["parameters"]
    out = {
        "qps": max(one, concurrent, chunks),
        "qps_one_at_a_time": one,
        "qps_concurrent": concurrent,
        "concurrency": concurrency,
        "qps_chunks": chunks,
        "qps_batched": batch,
        "recall": round(rec, 4),
        "recall_one_at_a_time": round(recall_of(found, truth), 4),
        "recall_concurrent": round(recall_of(found_threads, truth), 4),
        "recall_chunks": round(recall_of(found_chunks, truth), 4),
        "store_recall": params.get("recall"),
    }
    say(
        f"  ceiling: one per call {one:.1f} q/s, {concurrency} threads {concurrent:.1f} q/s, "
        f"batches of {concurrency} {chunks:.1f} q/s; all at once {batch:.1f} q/s, recall {rec:.4f}"
    )
    return out


def batched_rate(
    r: Any, texts: list[str], size: int, seconds: float
) -> tuple[float, dict[int, list[int]]]:
    """``Retriever.search_batch`` of ``size`` texts at a time, cycling through ``texts`` for
    ``seconds`` (at least one call): its q/s and the ids it found per text."""
    found: dict[int, list[int]] = {}
    done, t0 = 0, time.perf_counter()
    while done == 0 or time.perf_counter() - t0 < seconds:
        rows = [(done + j) % len(texts) for j in range(size)]
        for i, hs in zip(rows, r.search_batch([texts[i] for i in rows], k=K), strict=True):
            found[i] = [int(h.id) for h in hs]
        done += size
    return done / (time.perf_counter() - t0), found


def bracketed(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The ceiling measured before and after the load cells: the mean of each rate, both
    measurements kept (``before`` / ``after``)."""
    out = dict(before)
    for key in ("qps", "qps_one_at_a_time", "qps_concurrent", "qps_chunks", "qps_batched"):
        out[key] = (before[key] + after[key]) / 2
    out["before"], out["after"] = before, after
    return out


def search_request(texts: list[str]):  # type: ignore[no-untyped-def]
    def make(c: int, n: int) -> tuple[str, bytes, int]:
        i = (c * 7919 + n) % len(texts)
        return "/search", json.dumps({"query": texts[i], "k": K}).encode(), 1

    return make


def collect(texts: list[str], found: dict[int, list[int]]):  # type: ignore[no-untyped-def]
    def on_answer(c: int, n: int, data: bytes) -> None:
        found[(c * 7919 + n) % len(texts)] = [int(h["id"]) for h in json.loads(data)["hits"]]

    return on_answer


def info_of(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/info", timeout=30) as r:
        return json.loads(r.read())


def cell_summary(tally: Tally, seconds: float, found: dict[int, list[int]], truth: np.ndarray) -> dict[str, Any]:  # fmt: skip
    s = tally.summary(seconds)
    s["qps"] = s.pop("texts_per_s")
    s["recall"] = round(recall_of(found, truth), 4)
    s["answers_checked"] = len(found)
    return s


def serve_cells(
    export: Path,
    spec: str,
    threads: int,
    texts: list[str],
    truth: np.ndarray,
    clients: list[int],
    warmup: float,
    seconds: float,
    recall_sample: float | None,
    work: Path,
) -> dict[str, Any]:
    extra = ["--store", spec]
    if recall_sample is not None:
        extra += ["--recall-sample", str(recall_sample)]
    t0 = time.perf_counter()
    server = ours(export, threads, work, *extra)
    out: dict[str, Any] = {"startup_s": round(time.perf_counter() - t0, 1)}
    try:
        out["rss_idle_mb"] = server.rss_bytes() / 2**20
        rss = [out["rss_idle_mb"]]
        for c in clients:
            found: dict[int, list[int]] = {}
            tally = run_loop(
                server.port, c, search_request(texts), warmup, seconds, {}, collect(texts, found)
            )
            s = cell_summary(tally, seconds, found, truth)
            s["rss_mb"] = server.rss_bytes() / 2**20
            rss.append(s["rss_mb"])
            out[f"search@{c}"] = s
            say(
                f"  search@{c}: {s['qps']:.1f} q/s, p50 {s['p50_ms']:.1f} p95 {s['p95_ms']:.1f} "
                f"p99 {s['p99_ms']:.1f} ms, errors {s['errors']}, recall {s['recall']:.4f}, "
                f"RSS {s['rss_mb']:.0f} MB"
            )
        out["rss_max_mb"] = max(rss)
        out["rss_split_mb"] = rss_split(server.proc.pid)
        out["recall_watch"] = info_of(server.port).get("recall_watch")
    finally:
        out["exit_code"] = server.stop()
    return out


def rss_split(pid: int) -> dict[str, float]:
    """The server's resident memory by kind (Linux ``/proc/PID/status``): anonymous, file-backed
    (memory-mapped files the kernel can drop and re-read) and shared memory, in MB."""
    out: dict[str, float] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem"):
                out[name] = int(value.split()[0]) / 1024
    except OSError:
        pass
    return out


async def _searches_until(
    port: int,
    clients: int,
    make: Any,
    stop: asyncio.Event,
    on_answer: Any,
    headers: dict[str, str],
) -> Tally:
    tally = Tally()

    async def client(c: int) -> None:
        conn = Connection("127.0.0.1", port, headers)
        n = 0
        while not stop.is_set():
            path, body, _ = make(c, n)
            sent = time.perf_counter()
            try:
                status, data = await conn.post(path, body)
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                status, data = -1, b""
                await conn.close()
            tally.statuses[status] = tally.statuses.get(status, 0) + 1
            if status == 200:
                tally.latencies.append(time.perf_counter() - sent)
                tally.texts += 1
                on_answer(c, n, data)
            else:
                tally.errors += 1
                tally.server_errors += int(status >= 500)
            n += 1
        await conn.close()

    await asyncio.gather(*(client(c) for c in range(clients)))
    return tally


def write_docs(data: Path, count: int) -> list[dict[str, Any]]:
    from magretrieve.data.readers import load_beir

    corpus = list(load_beir(data).corpus.values())
    return [
        {"title": corpus[i % len(corpus)].title, "text": corpus[i % len(corpus)].text}
        for i in range(count)
    ]


def writes(
    export: Path,
    kind: str,
    folder: Path,
    threads: int,
    data: Path,
    texts: list[str],
    truth: np.ndarray,
    clients: int,
    requests: int,
    search_clients: int,
    work: Path,
) -> dict[str, Any]:
    """In-process index_corpus, then POST /documents under search load, into a store copy."""
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever
    from magretrieve.stores import open_store

    copy = work / f"{kind}-writes"
    t0 = time.perf_counter()
    shutil.copytree(folder, copy)
    out: dict[str, Any] = {"copy_s": round(time.perf_counter() - t0, 1)}
    spec = spec_of(kind, copy)
    total = clients * requests * DOCS_PER_WRITE
    bodies = write_docs(data, total)
    corpus = work / "write-corpus.jsonl"
    with corpus.open("w") as fh:
        for i, d in enumerate(bodies):
            fh.write(json.dumps({"_id": f"inproc-{i}", **d}) + "\n")
    with Retriever.load(export, spec, threads=threads, create=False, for_writing=True) as r:
        r.store.optimize = lambda: None  # type: ignore[method-assign]  # see the module docstring
        report = index_corpus(r, corpus, batch_size=DOCS_PER_WRITE, progress=False)
    out["in_process"] = {
        "documents": report.added,
        "seconds": round(report.seconds, 2),
        "docs_per_s": report.docs_per_second,
    }
    say(f"  in-process index_corpus: {report.docs_per_second:.1f} docs/s ({report.added} docs)")

    server = ours(export, threads, work, "--store", spec, key=KEY)
    acknowledged: list[str] = []
    found: dict[int, list[int]] = {}
    headers = {"Authorization": f"Bearer {KEY}"}

    def make_write(c: int, n: int) -> tuple[str, bytes, int]:
        first = (c * requests + n) * DOCS_PER_WRITE
        docs = [
            {"_id": f"http-{c}-{n}-{j}", **bodies[first + j], "n": n} for j in range(DOCS_PER_WRITE)
        ]
        return "/documents", json.dumps({"documents": docs}).encode(), DOCS_PER_WRITE

    def on_write(c: int, n: int, data: bytes) -> None:
        acknowledged.extend(json.loads(data)["ids"])

    async def both() -> tuple[Tally, Tally]:
        stop = asyncio.Event()
        searching = asyncio.ensure_future(
            _searches_until(
                server.port,
                search_clients,
                search_request(texts),
                stop,
                collect(texts, found),
                headers,
            )
        )
        written = await closed_loop(
            server.port, clients, make_write, 0, 0, headers, on_write, per_client=requests
        )
        stop.set()
        return written, await searching

    try:
        started = time.perf_counter()
        written, searched = asyncio.run(both())
        elapsed = time.perf_counter() - started
        out["rss_mb"] = server.rss_bytes() / 2**20
    finally:
        out["exit_code"] = server.stop()
    w = written.summary(written.elapsed)
    out["http"] = {
        "documents": w["texts"],
        "seconds": round(written.elapsed, 2),
        "docs_per_s": w["texts_per_s"],
        "p50_ms": w["p50_ms"],
        "p99_ms": w["p99_ms"],
        "errors": w["errors"],
        "statuses": w["statuses"],
    }
    s = searched.summary(elapsed)
    out["search_during_writes"] = {
        "clients": search_clients,
        "qps": s["texts_per_s"],
        "p50_ms": s["p50_ms"],
        "p95_ms": s["p95_ms"],
        "p99_ms": s["p99_ms"],
        "errors": s["errors"],
        "recall": round(recall_of(found, truth), 4),
    }
    store = open_store(spec)
    try:
        records = store.get(acknowledged)
        count = store.count()
        inproc = store.get([f"inproc-{i}" for i in range(report.added)])
    finally:
        store.close()
    out["acknowledged"] = len(acknowledged)
    out["missing_after"] = sum(rec is None for rec in records)
    out["in_process_missing_after"] = sum(rec is None for rec in inproc)
    out["count_after"] = count
    shutil.rmtree(copy, ignore_errors=True)
    say(
        f"  POST /documents x{clients}: {w['texts_per_s']:.1f} docs/s, errors {w['errors']}; "
        f"searches meanwhile p99 {s['p99_ms']:.0f} ms; {len(acknowledged)} acknowledged, "
        f"{out['missing_after']} missing"
    )
    return out


# ----------------------------------------------------------------------------- goals, results


def model_bytes(export: Path) -> int:
    return sum(p.stat().st_size for p in export.rglob("*.onnx"))


def goal_clients(clients: list[int]) -> int:
    """The load cell the goals judge: 32 clients, else the largest run."""
    return 32 if 32 in clients else max(clients)


def goals(run: dict[str, Any], clients: list[int]) -> dict[str, Any]:
    at = goal_clients(clients)
    tail_at = 8 if 8 in clients else clients[0]
    cells = run["serve"]
    cell = cells[f"search@{at}"]
    g: dict[str, Any] = {
        "clients": at,
        "vs_ceiling": cell["qps"] / run["ceiling"]["qps"],
        # not a goal: against an application calling Retriever.search from as many threads
        "vs_same_concurrency": (
            cell["qps"] / run["ceiling"]["qps_concurrent"]
            if "qps_concurrent" in run["ceiling"]
            else None
        ),
        # not a goal: against search_batch of every query text at once
        "vs_all_at_once": (
            cell["qps"] / run["ceiling"]["qps_batched"] if "qps_batched" in run["ceiling"] else None
        ),
        "recall": cell["recall"],
        "p99_over_p50": cells[f"search@{tail_at}"]["p99_ms"] / cells[f"search@{tail_at}"]["p50_ms"],
        "errors": sum(v["errors"] for k, v in cells.items() if k.startswith("search@")),
        "rss_max_mb": cells["rss_max_mb"],
        "rss_budget_mb": (GOAL_RSS * run["raw_bytes"] + run["model_bytes"]) / 2**20,
    }
    met = {
        f"≥ {GOAL_CEILING}× the in-process ceiling at {at} clients": g["vs_ceiling"]
        >= GOAL_CEILING,
        f"served recall@10 ≥ {GOAL_RECALL} at {at} clients": g["recall"] >= GOAL_RECALL,
        f"p99 ≤ {GOAL_TAIL}× p50 at {tail_at} clients": g["p99_over_p50"] <= GOAL_TAIL,
        "zero errors": g["errors"] == 0,
        f"RSS ≤ {GOAL_RSS:g}× the raw vectors plus the model": g["rss_max_mb"]
        <= g["rss_budget_mb"],
    }
    if "writes" in run:
        w = run["writes"]
        g["errors"] += w["http"]["errors"] + w["search_during_writes"]["errors"]
        met["zero errors"] = g["errors"] == 0
        met["every acknowledged write found afterwards"] = w["missing_after"] == 0
    g["met"] = met
    return g


def _f(x: Any, digits: int = 1) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def write_results(result: dict[str, Any], stem: Path) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    runs = result["runs"]
    lines = [
        "# serve_search: `/search` over HTTP at a million vectors, with recall",
        "",
        f"Command(s): {', '.join(f'`{c}`' for c in result['commands'])}",
        "",
        f"Machine: {result['machine']}; versions: "
        + ", ".join(f"{k} {v}" for k, v in result["versions"].items())
        + ". One run per row.",
        "",
        f"Data: {result['data']}",
        "",
        f"Queries: {result['queries']}",
        "",
        f"Query space: {result['query_space_note']}",
        "",
        "Each store was opened with `target_recall=0.99` and tuned itself on its own default "
        "sample (no real query); the served recall@10 is that of the hits `/search` returned, "
        "against exact inner product over every stored vector. The load generator runs on the "
        "same cores as the server.",
        "",
    ]
    for key in sorted(runs, key=lambda k: (runs[k]["n"], list(STORES).index(runs[k]["store"]))):
        r = runs[key]
        b = r["build"]
        c = r["ceiling"]
        lines += [
            f"## `{STORES[r['store']][0]}:` {r['store']} at {r['n']:,} vectors",
            "",
            f"- build: {b['build_s']:.0f} s ({b['add_s']:.0f} s adding), {b['disk_bytes'] / 2**30:.2f} GiB on disk; "
            f"tuned: {tuned(b['recall'])}",
            f"- ceiling (in-process `Retriever`, the fastest way with {c['concurrency']} queries "
            f"in hand): **{c['qps']:.1f} q/s** (`search` one text per call "
            f"{c['qps_one_at_a_time']:.1f}, {c['concurrency']} threads calling it at once "
            f"{c['qps_concurrent']:.1f}, `search_batch` of {c['concurrency']} texts at a time "
            f"{c['qps_chunks']:.1f}; not in it: `search_batch` of all {r['queries']:,} at once "
            f"{c['qps_batched']:.1f}"
            + (
                f"; the mean of {c['before']['qps']:.1f} before the cells and "
                f"{c['after']['qps']:.1f} after them"
                if "before" in c
                else ""
            )
            + f"); its recall@10 {c['recall']}",
            f"- server: ready in {r['serve']['startup_s']} s, RSS idle {r['serve']['rss_idle_mb']:.0f} MB, "
            f"max {r['serve']['rss_max_mb']:.0f} MB"
            + (
                " (after the cells: "
                + ", ".join(f"{k} {v:.0f} MB" for k, v in r["serve"]["rss_split_mb"].items())
                + ")"
                if r["serve"].get("rss_split_mb")
                else ""
            )
            + f" (raw vectors {r['raw_bytes'] / 2**20:.0f} MB, "
            f"model {r['model_bytes'] / 2**20:.0f} MB); its live recall watch: "
            f"{(r['serve'].get('recall_watch') or {}).get(f'recall_at_{K}')} over "
            f"{(r['serve'].get('recall_watch') or {}).get('checked')} checked queries",
            "",
            markdown_table(
                [
                    "clients",
                    "q/s",
                    "× ceiling",
                    "× all at once",
                    "p50 ms",
                    "p95 ms",
                    "p99 ms",
                    "errors",
                    "recall@10",
                    "RSS MB",
                ],
                [
                    [
                        k.split("@")[1],
                        f"{s['qps']:.1f}",
                        f"{s['qps'] / c['qps']:.2f}",
                        f"{s['qps'] / c['qps_batched']:.2f}",
                        _f(s["p50_ms"]),
                        _f(s["p95_ms"]),
                        _f(s["p99_ms"]),
                        s["errors"],
                        f"{s['recall']:.4f}",
                        f"{s['rss_mb']:.0f}",
                    ]
                    for k, s in r["serve"].items()
                    if k.startswith("search@")
                ],
            ),  # fmt: skip
            "",
        ]
        if "writes" in r:
            w = r["writes"]
            sw = w["search_during_writes"]
            lines += [
                f"- writes: `POST /documents` × {r['write_clients']} clients, {DOCS_PER_WRITE} documents "
                f"a request: **{w['http']['docs_per_s']:.1f} docs/s** ({w['http']['documents']} documents in "
                f"{w['http']['seconds']:.0f} s, request p50 {w['http']['p50_ms']:.0f} ms, p99 "
                f"{w['http']['p99_ms']:.0f} ms, errors {w['http']['errors']}) against in-process "
                f"`index_corpus` {w['in_process']['docs_per_s']:.1f} docs/s "
                f"(**{w['http']['docs_per_s'] / w['in_process']['docs_per_s']:.2f}×**)",
                f"- searches meanwhile ({sw['clients']} clients): {sw['qps']:.1f} q/s, p50 "
                f"{_f(sw['p50_ms'])} ms, **p99 {_f(sw['p99_ms'])} ms**, errors {sw['errors']}, recall@10 "
                f"{sw['recall']}" + (f"; server RSS {w['rss_mb']:.0f} MB" if "rss_mb" in w else ""),
                f"- every acknowledged write fetched by id after the server stopped: "
                f"{w['acknowledged'] - w['missing_after']} of {w['acknowledged']} found "
                f"(in-process: {w['in_process']['documents'] - w['in_process_missing_after']} of "
                f"{w['in_process']['documents']}); store count {w['count_after']:,}",
                "",
            ]
        g = r["goals"]
        lines += [
            f"Goals: {g['vs_ceiling']:.2f}× the ceiling and recall@10 {g['recall']:.4f} at "
            f"{g['clients']} clients; p99/p50 {g['p99_over_p50']:.2f} at 8 clients; "
            f"{g['errors']} errors; RSS max {g['rss_max_mb']:.0f} MB of a {g['rss_budget_mb']:.0f} MB budget."
            + (
                f" Beside an application calling `Retriever.search` from {g['clients']} threads "
                f"in-process, the server serves **{g['vs_same_concurrency']:.2f}×** its q/s."
                if g.get("vs_same_concurrency") is not None
                else ""
            )
            + (
                f" Against `search_batch` of all {r['queries']:,} query texts at once (not a goal: "
                f"a server with {g['clients']} requests in flight never holds more than "
                f"{g['clients']}): **{g['vs_all_at_once']:.2f}×**."
                if g.get("vs_all_at_once") is not None
                else ""
            ),
            "",
        ]
        lines += [f"- {'PASS' if ok else 'FAIL'}: {name}" for name, ok in g["met"].items()]
        lines.append("")
    if result.get("notes"):
        lines += ["## Notes", "", result["notes"], ""]
    if result.get("not_run"):
        lines += ["## Not run", "", result["not_run"], ""]
    stem.with_suffix(".md").write_text("\n".join(lines))


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name in ("magretrieve", "onnxruntime", "faiss-cpu", "scann", "qdrant-edge-py", "numpy"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
    return out


@click.command()
@click.option(
    "--sizes", default="1000000", show_default=True, help="Vector counts, comma-separated."
)
@click.option(
    "--stores",
    default=",".join(STORES),
    show_default=True,
    help=f"Stores to run, in order (of: {', '.join(STORES)}).",
)
@click.option(
    "--export",
    "export_dir",
    default=None,
    help="MiniLM qnorm export (default: serve_load's, in the cache).",
)
@click.option(
    "--source",
    type=click.Choice(["store-data", "export"]),
    default="store-data",
    show_default=True,
    help="What the mixture is fitted on: mips_scale's cached MiniLM passages, or the --data "
    "corpus encoded by --export (small runs, other models).",
)
@click.option(
    "--data",
    default=None,
    help="BEIR folder of the written documents (default scifact); with --source export also the passages and queries.",
)
@click.option("--clusters", type=int, default=256, show_default=True, help="Mixture components.")
@click.option(
    "--queries", "held_out", type=int, default=1000, show_default=True, help="Held-out query texts."
)
@click.option("--threads", type=int, default=2, show_default=True)
@click.option("--clients", default="1,8,32,128", show_default=True)
@click.option(
    "--seconds",
    type=float,
    default=15.0,
    show_default=True,
    help="Measured seconds per cell (and per ceiling way).",
)
@click.option("--warmup", type=float, default=3.0, show_default=True)
@click.option(
    "--write-clients",
    type=int,
    default=8,
    show_default=True,
    help="Clients of POST /documents (0: no write phase).",
)
@click.option(
    "--write-requests",
    type=int,
    default=2,
    show_default=True,
    help="64-document requests each write client sends.",
)
@click.option(
    "--write-search-clients",
    type=int,
    default=8,
    show_default=True,
    help="Clients searching during the writes.",
)
@click.option(
    "--recall-sample",
    type=float,
    default=None,
    help="The server's --recall-sample (default: the server's own).",
)
@click.option(
    "--cache",
    "cache",
    default=None,
    help="Folder of the built stores and vectors (default .cache/serve_search).",
)
@click.option(
    "--out",
    default=None,
    help="Results stem (default benchmarks/results/serve_search); runs merge into it.",
)
@lock_option
def main(sizes, stores, export_dir, source, data, clusters, held_out, threads, clients, seconds, warmup,
         write_clients, write_requests, write_search_clients, recall_sample, cache, out, lock):  # type: ignore[no-untyped-def]  # fmt: skip
    """/search over HTTP at scale: q/s, latency, served recall@10, RSS, writes under load."""
    chosen = [s.strip() for s in stores.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(STORES))
    if unknown or not chosen:
        raise click.BadParameter(
            f"choose from {', '.join(STORES)}; got {stores}", param_hint="--stores"
        )
    client_counts = [int(c) for c in clients.split(",") if c.strip()]
    at = goal_clients(client_counts)
    folder = Path(data) if data else data_dir() / "scifact"
    export = Path(export_dir) if export_dir else cache_dir("serve_load") / "export-qnorm"
    root = Path(cache) if cache else cache_dir("serve_search")
    root.mkdir(parents=True, exist_ok=True)
    stem = Path(out) if out else REPO / "benchmarks" / "results" / "serve_search"
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    result: dict[str, Any] = {}
    if stem.with_suffix(".json").is_file():
        result = json.loads(stem.with_suffix(".json").read_text())
    result.setdefault("runs", {})
    result["commands"] = list(dict.fromkeys([*result.get("commands", []), recorded_command()]))
    result["machine"] = machine_summary()
    result["versions"] = versions()
    result["threads"] = threads
    if not (export / "magretrieve.json").is_file():
        with cpu_lock(lock or None):
            ensure_export(export, MODEL, threads)
    texts = query_texts(source, folder, held_out)
    mbytes = model_bytes(export)
    with tempfile.TemporaryDirectory(prefix="serve-search-") as tmp:
        work = Path(tmp)
        for n in [int(s) for s in sizes.split(",") if s.strip()]:
            data_phase: dict[str, Any] = {}

            def data_ready(n: int = n, box: dict[str, Any] = data_phase) -> dict[str, Any]:
                """Vectors, query-space check and exact truth of size n (run inside a lock hold)."""
                if box:
                    return box
                say(f"vectors: {n:,}")
                ptexts, pdocs = passages(source, folder, export, threads)
                box["vecs"] = make_vectors(n, clusters, pdocs, root)
                box["space"] = query_space(export, threads, ptexts, pdocs, texts, source)
                tpath = root / f"truth-{n}-{len(texts)}-{source}.npy"
                if tpath.is_file():
                    box["truth"] = np.load(tpath)
                else:
                    t0 = time.perf_counter()
                    box["truth"] = truth_rows(export, threads, texts, box["vecs"])
                    np.save(tpath, box["truth"])
                    say(f"exact top-10 of {len(texts)} queries in {time.perf_counter() - t0:.0f} s")
                box["norms"] = np.linalg.norm(box["vecs"][:100_000], axis=1)
                return box

            for kind in chosen:
                key = f"{kind}@{n}"
                store_folder = root / f"stores-{n}" / kind
                store_folder.parent.mkdir(parents=True, exist_ok=True)
                # one hold: the data (first store only) and the build; none when both are
                # cached (loading them and the query-space check are seconds of CPU)
                cached = (
                    store_folder.with_suffix(".json").is_file()
                    and (root / f"truth-{n}-{len(texts)}-{source}.npy").is_file()
                    and (root / f"vectors-{n}.npy").is_file()
                )
                with cpu_lock(None if cached else lock or None):
                    box = data_ready()
                    say(f"{kind} at {n:,}: build")
                    build = build_store(kind, box["vecs"], store_folder, export)
                vecs, truth, space, norms = box["vecs"], box["truth"], box["space"], box["norms"]
                describe_data(result, source, folder, clusters, vecs, norms, texts, space)
                spec = spec_of(kind, store_folder)
                run: dict[str, Any] = {
                    "store": kind,
                    "n": n,
                    "queries": len(texts),
                    "build": build,
                    "raw_bytes": int(n * vecs.shape[1] * 4),
                    "model_bytes": mbytes,
                    "clients": client_counts,
                    "seconds": seconds,
                    "warmup": warmup,
                }
                # one hold: the ceiling, every load cell and the writes of this store
                with cpu_lock(lock or None):
                    say(f"{kind} at {n:,}: ceiling and load cells")
                    before = ceiling(export, spec, threads, texts, truth, seconds, at)
                    run["serve"] = serve_cells(
                        export, spec, threads, texts, truth, client_counts, warmup, seconds,
                        recall_sample, work,
                    )  # fmt: skip
                    # measured again after the cells: the machine's speed drifts by several
                    # percent within minutes, so the ratio uses the mean of both
                    run["ceiling"] = bracketed(
                        before, ceiling(export, spec, threads, texts, truth, seconds, at)
                    )
                    if write_clients > 0:
                        say(f"{kind} at {n:,}: writes")
                        run["write_clients"] = write_clients
                        run["writes"] = writes(
                            export, kind, store_folder, threads, folder, texts, truth,
                            write_clients, write_requests, write_search_clients, work,
                        )  # fmt: skip
                run["goals"] = goals(run, client_counts)
                result["runs"][key] = run
                write_results(result, stem)
                say(f"{kind} at {n:,}: done; wrote {stem}.md / .json")
            data_phase.clear()


def describe_data(
    result: dict[str, Any],
    source: str,
    folder: Path,
    clusters: int,
    vecs: np.ndarray,
    norms: np.ndarray,
    texts: list[str],
    space: dict[str, Any],
) -> None:
    """The data, queries and query-space lines of the results."""
    result["data"] = (
        f"synthetic magnitude-keeping vectors from a {clusters}-cluster mixture fitted on "
        + ("53,910 MiniLM qnorm passages (mips_scale's, scifact + cranfield sentences)" if source == "store-data" else f"the {folder.name} corpus encoded by the export")
        + f"; d={vecs.shape[1]}, norm mean {norms.mean():.2f} (CV {norms.std() / norms.mean():.2f})"
    )  # fmt: skip
    result["queries"] = (
        f"{len(texts)} real query texts "
        + ("(scifact + cranfield, mips_scale's held-out 1,000: `default_rng(7)` permutation, first 1,000)" if source == "store-data" else f"of {folder.name}")
        + "; no store tuned on any of them (each tuned on its own synthetic sample); "
        "sent batch-1 as `{\"query\": text, \"k\": 10}`"
    )  # fmt: skip
    result["query_space"] = space
    result["query_space_note"] = (
        f"the served export re-encodes {space['documents_compared']} of the passages the mixture is fitted on "
        f"at mean cosine {space['document_cosine_mean']} and norm ratio {space['document_norm_ratio_mean']} "
        f"to the vectors the mixture was fitted on"
        + (f"; its query vectors sit at mean cosine {space['query_cosine_mean']} to the torch encoder's" if "query_cosine_mean" in space else "")
        + f" (query norm {space['query_norm_mean']}: qnorm queries are unit-norm, documents keep their magnitude)"
    )  # fmt: skip


if __name__ == "__main__":
    main()
