"""The search batcher: queued searches of the same ``k`` and filter share one store call, and
each request gets exactly the hits a search of its own returns."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from magretrieve.core.errors import StoreError
from magretrieve.serving.errors import Draining
from magretrieve.serving.retriever import Retriever
from magretrieve.serving.search_batcher import SearchBatcher, search_workers
from magretrieve.stores import open_store
from tests.support.fake_encoder import DIM, FakeEncoder


def _retriever(spec: str) -> Retriever:
    """60 documents of small-integer vectors (every score is exact in float32, whatever the
    order of the sums), payloads a filter can select."""
    r = Retriever(FakeEncoder("qnorm"), open_store(spec, dimension=DIM))
    rng = np.random.default_rng(3)
    vectors = rng.integers(-4, 5, size=(60, DIM)).astype(np.float32)
    payloads = [{"topic": i % 3, "flag": i % 2 == 0} for i in range(60)]
    r.store.add([f"d{i}" for i in range(60)], vectors, payloads)
    return r


def _queries(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-3, 4, size=(n, DIM)).astype(np.float32)


class Recorder:
    """The store call a batcher makes, recorded; the first one waits for ``release``."""

    def __init__(self, retriever: Retriever) -> None:
        self.retriever = retriever
        self.calls: list[tuple[int, int, object]] = []
        self.release = threading.Event()

    def __call__(self, vectors, k, where):
        if not self.calls:
            self.calls.append((len(vectors), k, where))
            assert self.release.wait(10)
        else:
            self.calls.append((len(vectors), k, where))
        return self.retriever.search_vectors(vectors, k=k, where=where)


def _submit(batcher: SearchBatcher, results: dict, name: str, vectors, k, where=None) -> None:
    """Queue one search from a thread of its own (its place in the queue is fixed before
    the next one is queued: it is waiting, running, or answered)."""
    before = batcher.depth
    calls = batcher._search.calls if isinstance(batcher._search, Recorder) else []
    started = len(calls)

    def run() -> None:
        try:
            results[name] = batcher.search_wait(vectors, k, where)
        except Exception as exc:  # kept for the assertion
            results[name] = exc

    threading.Thread(target=run, daemon=True).start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if batcher.depth > before or name in results or len(calls) > started:
            return
        time.sleep(0.002)
    raise AssertionError(f"{name} was never queued")


def _wait_for(condition, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


@pytest.mark.parametrize("spec", ["memory:", "faiss:{tmp}/f", "scann:{tmp}/s"])
def test_searches_merge_only_with_the_same_k_and_filter(tmp_path, spec):
    retriever = _retriever(spec.format(tmp=tmp_path))
    recorder = Recorder(retriever)
    batcher = SearchBatcher(recorder)
    results: dict = {}
    asked = {
        "first": (_queries(1, 0), 5, None),
        "b1": (_queries(1, 1), 5, None),
        "k3": (_queries(1, 2), 3, None),
        "b2": (_queries(2, 3), 5, None),
        "topic1": (_queries(1, 4), 5, {"topic": 1}),
        "topic-true": (_queries(1, 5), 5, {"topic": True}),  # true is not 1: not merged
        "b3-empty-filter": (_queries(1, 6), 5, {}),  # no filter, like b1 and b2
        "topic1-again": (_queries(1, 7), 5, {"topic": 1}),
        "flag": (_queries(1, 8), 4, {"flag": False, "topic": 2}),
    }
    for name, (vectors, k, where) in asked.items():
        _submit(batcher, results, name, vectors, k, where)
        if name == "first":  # running before the rest queue, so a later _submit cannot take
            _wait_for(lambda: len(recorder.calls) == 1)  # its call as its own evidence
    assert batcher.depth == len(asked) - 1  # the first runs (and waits), the rest queue
    recorder.release.set()
    deadline = time.monotonic() + 10
    while len(results) < len(asked) and time.monotonic() < deadline:
        time.sleep(0.01)
    batcher.close()
    assert recorder.calls == [
        (1, 5, None),
        (4, 5, None),  # b1, b2 (two rows), b3-empty-filter: one store call
        (1, 3, None),
        (2, 5, {"topic": 1}),
        (1, 5, {"topic": True}),
        (1, 4, {"flag": False, "topic": 2}),
    ]
    for name, (vectors, k, where) in asked.items():
        alone = retriever.search_vectors(vectors, k=k, where=where)
        assert results[name] == alone, name  # ids, scores, norms, cosines, payloads, ranks
        assert all(len(row) == (0 if name == "topic-true" else k) for row in alone), name
    assert all(h.payload["topic"] == 1 for row in results["topic1"] for h in row)
    retriever.close()


def test_a_bad_request_in_a_merged_batch_gets_its_own_error(tmp_path):
    retriever = _retriever("memory:")
    recorder = Recorder(retriever)
    batcher = SearchBatcher(recorder)
    results: dict = {}
    bad = _queries(1, 9)
    bad[0, 3] = np.nan
    _submit(batcher, results, "first", _queries(1, 0), 5)
    _submit(batcher, results, "good", _queries(1, 1), 5)
    _submit(batcher, results, "nan", bad, 5)
    _submit(batcher, results, "good2", _queries(1, 2), 5)
    recorder.release.set()
    deadline = time.monotonic() + 10
    while len(results) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    batcher.close()
    assert isinstance(results["nan"], StoreError) and "NaN" in str(results["nan"])
    for name, seed in (("good", 1), ("good2", 2)):
        assert results[name] == retriever.search_vectors(_queries(1, seed), k=5)


def test_close_finishes_the_queue_and_refuses_new_searches():
    retriever = _retriever("memory:")
    recorder = Recorder(retriever)
    batcher = SearchBatcher(recorder)
    results: dict = {}
    _submit(batcher, results, "first", _queries(1, 0), 5)
    _submit(batcher, results, "queued", _queries(1, 1), 5)
    closer = threading.Thread(target=batcher.close)
    closer.start()
    time.sleep(0.05)
    with pytest.raises(Draining):
        batcher.search_wait(_queries(1, 2), 5)
    recorder.release.set()
    closer.join(10)
    assert not closer.is_alive()
    _wait_for(lambda: "queued" in results)  # delivered before close returned; stored after
    assert results["queued"] == retriever.search_vectors(_queries(1, 1), k=5)


def test_an_awaited_search_and_the_worker_count():
    retriever = _retriever("memory:")
    batcher = SearchBatcher(lambda v, k, w: retriever.search_vectors(v, k=k, where=w))

    async def both():
        import asyncio

        return await asyncio.gather(
            batcher.search(_queries(1, 0), 5), batcher.search(_queries(1, 1), 5)
        )

    import asyncio

    first, second = asyncio.run(both())
    batcher.close()
    assert first == retriever.search_vectors(_queries(1, 0), k=5)
    assert second == retriever.search_vectors(_queries(1, 1), k=5)
    assert search_workers(retriever.store) >= 1
    assert search_workers(open_store("memory:", dimension=4)) >= 1
    assert search_workers(type("Serial", (), {"thread_safe_search": False})()) == 1
    with pytest.raises(ValueError):
        SearchBatcher(lambda v, k, w: [], workers=0)


def test_a_batch_waits_for_searches_still_being_embedded() -> None:
    """Three requests announce their searches while embedding; the first search queued waits
    for the other two and all three share one store call, each with its own hits."""
    r = _retriever("memory:")
    sizes: list[tuple[int, int]] = []
    batcher = SearchBatcher(
        lambda v, k, w: r.search_vectors(v, k=k, where=w),
        observer=lambda q, n: sizes.append((q, n)),
        linger_ms=5000,
    )
    q = _queries(3, 11)
    results: dict = {}
    announced = [batcher.coming() for _ in range(3)]
    for a in announced:
        a.__enter__()
    try:

        def request(i: int) -> None:
            time.sleep(0.05 * i)  # the embedding of request i ends 50 ms after the one before
            announced[i].__exit__(None, None, None)
            results[i] = batcher.search_wait(q[i : i + 1], 5)

        threads = [threading.Thread(target=request, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert sizes == [(3, 3)]  # one store call for the three
        for i in range(3):
            want = r.search_vectors(q[i : i + 1], k=5)
            assert [h.id for h in results[i][0]] == [h.id for h in want[0]]
    finally:
        batcher.close()


def test_a_lone_search_runs_at_once_and_the_wait_is_bounded() -> None:
    r = _retriever("memory:")
    batcher = SearchBatcher(lambda v, k, w: r.search_vectors(v, k=k, where=w), linger_ms=300)
    q = _queries(1, 12)
    try:
        t0 = time.monotonic()
        batcher.search_wait(q, 5)
        assert time.monotonic() - t0 < 0.15  # nothing announced: no wait
        with batcher.coming():  # announced, but its search never comes
            t0 = time.monotonic()
            batcher.search_wait(q, 5)
            waited = time.monotonic() - t0
        assert 0.25 <= waited < 2.0  # held for the linger bound, not longer
    finally:
        batcher.close()
