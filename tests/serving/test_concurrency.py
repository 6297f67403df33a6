"""Thread safety of the serving path: the real ONNX encoder + an exact store + Retriever.

What is guaranteed (see docs/errors.md, "Thread safety"):

- ``Retriever.search``/``search_batch`` may be called from any number of threads; each
  result equals the serial result exactly (same ids, bit-identical scores, with
  ``threads=1`` onnxruntime sessions; with more intra-op threads scores may differ in the
  last float bits from run to run, as in any multi-threaded reduction).
- Adding (or deleting) through the same Retriever while others search is safe: a write
  batch is applied under an exclusive lock, so every search sees the store *before or after*
  each batch, never half of one, and never an older state than a search that finished before
  it started.
- Query and document encoding may run at the same time (each side has its own tokenizer,
  configured once; before this fix a document encode could truncate a concurrent query at
  the document length).

What is not guaranteed: which side of a concurrent batch a search sees; consistency when the
*store object* is written directly (``retriever.store.add``) while searching, bypassing the
Retriever's lock; writes to one store folder from two processes (FAISS/memory keep no
inter-process lock; embedded Qdrant refuses a second process).
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from magretrieve.serving.retriever import Retriever
from tests.support.exports import tiny_export_dir

WORDS = (
    "statin statins mortality heart risk cancer cell cells protein gene brain blood drug trial "
    "patients reduce increase effect study wing flow pressure air speed boundary layer plane"
).split()


@pytest.fixture(scope="module")
def export(tmp_path_factory, tiny_model_dir) -> Path:
    return tiny_export_dir(tmp_path_factory, tiny_model_dir)


def texts(n: int, seed: int, low: int = 2, high: int = 12) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(low, high)))) for _ in range(n)]


def docs(n: int, seed: int = 0) -> list[dict]:
    return [
        {"_id": f"d{i}", "title": f"t{i}", "text": t}
        for i, t in enumerate(texts(n, seed, 3, 150))  # some beyond max_document_length
    ]


def key(hits) -> list[tuple[str, float]]:
    return [(h.id, h.score) for h in hits]


def run_threads(n: int, target) -> list[BaseException]:
    errors: list[BaseException] = []

    def wrapped(t: int) -> None:
        try:
            target(t)
        except BaseException as exc:  # pragma: no cover - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return errors


def test_8_threads_x_1000_queries_equal_the_serial_results(export, tmp_path):
    r = Retriever.load(export, store=f"faiss:{tmp_path / 'ix'}", threads=1)
    r.add_documents(docs(300))
    # 1,000 queries, a tenth longer than max_query_length (64 tokens): truncation in play
    queries = texts(900, 1) + texts(100, 2, 70, 120)
    serial = [key(r.search(q, k=5)) for q in queries]
    got: dict[tuple[int, int], list] = {}

    def worker(t: int) -> None:
        order = list(range(len(queries)))
        random.Random(t).shuffle(order)  # threads interleave different queries
        for n, i in enumerate(order):
            hits = r.search(queries[i], k=5) if n % 3 else r.search_batch([queries[i]], k=5)[0]
            got[(t, i)] = key(hits)

    assert not run_threads(8, worker)
    assert len(got) == 8 * 1000
    mismatches = [(t, i) for (t, i), hits in got.items() if hits != serial[i]]
    assert not mismatches, f"{len(mismatches)} results differ from serial, e.g. {mismatches[:3]}"
    r.close()


def test_concurrent_query_and_document_encoding_match_serial(export):
    """Each side truncates at its own length even while the other side encodes."""
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    enc = OnnxEncoder.load(export, threads=1)
    long_queries = texts(60, 3, 70, 140)  # > 64 query tokens, some > 128 document tokens
    long_docs = texts(60, 4, 100, 200)
    want_q = [enc.encode_queries([q])[0] for q in long_queries]
    want_d = [enc.encode_documents([d])[0] for d in long_docs]
    diffs: list[str] = []

    def worker(t: int) -> None:
        for _ in range(3):
            for i in range(60):
                if t % 2:
                    if not np.array_equal(enc.encode_queries([long_queries[i]])[0], want_q[i]):
                        diffs.append(f"query {i}")
                elif not np.array_equal(enc.encode_documents([long_docs[i]])[0], want_d[i]):
                    diffs.append(f"document {i}")

    assert not run_threads(6, worker)
    assert not diffs, diffs[:5]


@pytest.mark.parametrize("backend", ["faiss", "memory"])
def test_search_while_adding_sees_whole_batches_in_order(export, tmp_path, backend):
    """Every concurrent result equals the serial result after some number of whole batches,
    and that number never goes back within one searching thread."""
    corpus = docs(200, seed=5)
    batches = [corpus[i : i + 20] for i in range(0, 200, 20)]
    queries = texts(20, 6) + texts(5, 7, 70, 100)

    # serial reference on the same kind of store: the results after 1, 2, ..., 10 batches
    ref_spec = f"faiss:{tmp_path / 'ref'}" if backend == "faiss" else "memory:"
    ref = Retriever.load(export, store=ref_spec, threads=1)
    expected: list[list[list]] = []
    for batch in batches:
        ref.add_documents(batch)
        expected.append([key(ref.search(q, k=5)) for q in queries])

    spec = f"faiss:{tmp_path / 'ix'}" if backend == "faiss" else "memory:"
    r = Retriever.load(export, store=spec, threads=1)
    r.add_documents(batches[0])
    done = threading.Event()
    seen: dict[int, list[tuple[int, list]]] = {}

    def searcher(t: int) -> None:
        log = seen.setdefault(t, [])
        i = t
        while not done.is_set() or len(log) < 50:
            q = i % len(queries)
            log.append((q, key(r.search(queries[q], k=5))))
            i += 1

    def writer() -> None:
        for batch in batches[1:]:
            time.sleep(0.005)  # let searches run between batches
            r.add_documents(batch)
        done.set()

    errors: list[BaseException] = []

    def guarded(fn, *args) -> None:
        try:
            fn(*args)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
            done.set()

    threads = [threading.Thread(target=guarded, args=(searcher, t)) for t in range(4)]
    threads.append(threading.Thread(target=guarded, args=(writer,)))
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert r.store.count() == 200
    states_seen: set[int] = set()
    for t, log in seen.items():
        low = 0
        for q, hits in log:
            consistent = [j for j in range(len(batches)) if expected[j][q] == hits]
            assert consistent, f"thread {t}: query {q} matches no whole-batch state"
            later = [j for j in consistent if j >= low]
            assert later, f"thread {t}: went back from state {low} to {consistent}"
            low = min(later)
            states_seen.add(low)
    assert len(states_seen) >= 2  # the searches really overlapped the writes
    r.close()
