"""The live recall check: sampled searches re-run exactly, a gauge, a warning below target."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from magretrieve.server.metrics import Metrics
from magretrieve.server.recall_watch import MIN_QUERIES, RecallWatch, store_target
from magretrieve.stores import open_store
from tests.support.ann_data import search_indexes_at_every_size


def _data(n: int = 3000, d: int = 32, seed: int = 0) -> tuple[list[str], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    docs = rng.standard_normal((n, d)).astype(np.float32) * rng.lognormal(0, 0.5, (n, 1)).astype(
        np.float32
    )
    queries = rng.standard_normal((80, d)).astype(np.float32)
    return [f"d{i}" for i in range(n)], docs, queries


def _served_recall(store, queries: np.ndarray, docs: np.ndarray, ids: list[str]) -> float:
    hits = store.search(queries, 10)
    exact = np.argsort(-(queries @ docs.T), axis=1)[:, :10]
    return float(
        np.mean(
            [
                len({h.id for h in row} & {ids[j] for j in ex}) / 10
                for row, ex in zip(hits, exact, strict=True)
            ]
        )
    )


def _watch(store, sample: float = 1.0, target: float | None = 0.99) -> tuple[RecallWatch, Metrics]:
    metrics = Metrics()
    retriever = SimpleNamespace(store=store, offset=False)
    return RecallWatch(
        retriever, metrics, sample, target=target, cpu_share=0.5, chunk=1000
    ), metrics


def _wait(watch: RecallWatch, n: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while watch.checked < n and time.monotonic() < end:
        time.sleep(0.02)
    assert watch.checked >= n, (watch.checked, watch.dropped)


def test_a_poor_ann_index_drops_the_gauge_and_warns(tmp_path, caplog, monkeypatch):
    search_indexes_at_every_size(monkeypatch)  # a small store: the index answers
    ids, docs, queries = _data()
    store = open_store(
        f"faiss:{tmp_path / 'h'}", dimension=32, index_type="hnsw", hnsw_m=4,
        ef_construction=8, ef_search=1,
    )  # fmt: skip
    store.add(ids, docs)
    truth = _served_recall(store, queries, docs, ids)
    assert truth < 0.9  # the index is bad on purpose
    watch, metrics = _watch(store)
    with caplog.at_level(logging.WARNING, logger="magretrieve.server.recall_watch"):
        for i in range(0, len(queries), 8):  # as requests arrive, slower than the checks
            watch.offer(queries[i : i + 8], store.search(queries[i : i + 8], 10))
            _wait(watch, i + 8)
    watch.close()
    gauge = metrics.registry.get_sample_value("magretrieve_recall_at_10")
    assert gauge == pytest.approx(truth, abs=1e-6)  # the same number, computed independently
    assert metrics.registry.get_sample_value("magretrieve_recall_checked_queries_total") == 80
    warnings = [r.getMessage() for r in caplog.records if "live queries" in r.getMessage()]
    assert len(warnings) == 1 and "below the store's target 0.990" in warnings[0], warnings
    info = watch.info()
    assert info["recall_at_10"] == pytest.approx(truth, abs=1e-4) and info["queries"] == 80
    store.close()


def test_an_exact_store_reads_one_and_stays_quiet(tmp_path, caplog):
    ids, docs, queries = _data(n=800)
    store = open_store(f"faiss:{tmp_path / 'f'}", dimension=32)
    store.add(ids, docs)
    watch, metrics = _watch(store, target=0.99)
    with caplog.at_level(logging.WARNING, logger="magretrieve.server.recall_watch"):
        watch.offer(queries[: MIN_QUERIES + 5], store.search(queries[: MIN_QUERIES + 5], 10))
        _wait(watch, MIN_QUERIES + 5)
    watch.close()
    assert metrics.registry.get_sample_value("magretrieve_recall_at_10") == 1.0
    assert not [r for r in caplog.records if "live queries" in r.getMessage()]
    store.close()


def test_sampling_share_and_store_target(tmp_path):
    ids, docs, queries = _data(n=500)
    store = open_store(f"faiss:{tmp_path / 'f'}", dimension=32)
    store.add(ids, docs)
    watch, _ = _watch(store, sample=0.0)
    watch.offer(queries, store.search(queries, 10))
    time.sleep(0.2)
    assert watch.checked == 0 and watch.info()["recall_at_10"] is None
    watch.close()
    assert store_target(store) is None
    store.close()
    hnsw = open_store(
        f"faiss:{tmp_path / 'h'}", dimension=32, index_type="hnsw", target_recall=0.97
    )
    assert store_target(hnsw) == 0.97
    hnsw.close()


def _hits(ids: list[str]) -> list[SimpleNamespace]:
    return [SimpleNamespace(id=i) for i in ids]


def test_the_figure_is_the_hand_computed_recall_across_blocks():
    """Docs d1..d30 on a line: the exact top-10 of (1, 0) is d30..d21, of (-1, 0) d1..d10.
    Served lists with 7 and 5 of them, and a k=5 search with 4 of d30..d26, read
    (0.7 + 0.5 + 0.8) / 3; blocks of 7 make the answer cross every block boundary."""
    store = open_store("memory:", dimension=2)
    store.add([f"d{i}" for i in range(1, 31)], [[float(i), 0.0] for i in range(1, 31)])
    metrics = Metrics()
    watch = RecallWatch(
        SimpleNamespace(store=store, offset=False), metrics, 1.0, target=None, chunk=7
    )
    right = _hits([f"d{i}" for i in range(30, 23, -1)] + ["d1", "d2", "d3"])
    left = _hits([f"d{i}" for i in range(1, 6)] + [f"d{i}" for i in range(26, 31)])
    top5 = _hits(["d30", "d29", "d27", "d26", "d5"])
    watch.offer(np.array([[1.0, 0.0], [-1.0, 0.0]], dtype=np.float32), [right, left], k=10)
    watch.offer(np.array([[2.0, 0.0]], dtype=np.float32), [top5], k=5)
    _wait(watch, 3)
    watch.close()
    assert watch.recall == pytest.approx((0.7 + 0.5 + 0.8) / 3)
    assert metrics.registry.get_sample_value("magretrieve_recall_at_10") == pytest.approx(2 / 3)


def test_every_waiting_query_is_answered_in_one_pass():
    """While a pass runs, 40 queries queue up; the next pass answers all of them."""
    store = open_store("memory:", dimension=2)
    store.add([f"d{i}" for i in range(1, 31)], [[float(i), 1.0] for i in range(1, 31)])
    release = threading.Event()

    def held_iter_vectors(block):
        release.wait(10)
        return store.iter_vectors(block)

    held = SimpleNamespace(iter_vectors=held_iter_vectors)
    watch = RecallWatch(
        SimpleNamespace(store=held, offset=False), Metrics(), 1.0, target=0.9, chunk=7
    )
    top = _hits([f"d{i}" for i in range(30, 20, -1)])
    watch.offer(np.ones((1, 2), dtype=np.float32), [top])
    time.sleep(0.3)  # the first pass waits inside the store
    watch.offer(np.ones((40, 2), dtype=np.float32), [top] * 40)
    release.set()
    _wait(watch, 41)
    watch.close()
    assert watch.last_pass is not None and watch.last_pass["queries"] == 40
    assert watch.last_pass["vectors"] == 30 and watch.recall == 1.0


def test_a_failed_pass_is_counted_warned_once_and_the_next_one_runs(caplog):
    store = open_store("memory:", dimension=2)
    store.add([f"d{i}" for i in range(1, 31)], [[float(i), 0.0] for i in range(1, 31)])
    failures = [RuntimeError("store closed"), RuntimeError("store closed")]

    def flaky_iter_vectors(block):
        if failures:
            raise failures.pop()
        return store.iter_vectors(block)

    flaky = SimpleNamespace(iter_vectors=flaky_iter_vectors)
    watch = RecallWatch(SimpleNamespace(store=flaky, offset=False), Metrics(), 1.0, target=0.5)
    top = _hits([f"d{i}" for i in range(30, 20, -1)])
    with caplog.at_level(logging.DEBUG, logger="magretrieve.server.recall_watch"):
        for n in range(1, 4):
            watch.offer(np.array([[1.0, 0.0]], dtype=np.float32), [top])
            deadline = time.monotonic() + 10
            while watch.skipped + watch.checked < n and time.monotonic() < deadline:
                time.sleep(0.01)
    watch.close()
    assert watch.skipped == 2 and watch.checked == 1 and watch.recall == 1.0
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "skipped: store closed" in warned[0].getMessage()
    assert watch.info()["skipped"] == 2


def test_the_cpu_share_bounds_the_pass(monkeypatch):
    """Each block's work buys a rest of busy × (1 − share) / share before the next one: with
    60 ms of work per block and share 0.25, five blocks take at least 4 × 180 ms."""
    from magretrieve.server import recall_watch

    real_add = recall_watch.BlockTopK.add

    def slow_add(self, ids, vectors):  # 60 ms of this thread's CPU time, however loaded
        end = time.thread_time() + 0.06
        while time.thread_time() < end:
            pass
        real_add(self, ids, vectors)

    monkeypatch.setattr(recall_watch.BlockTopK, "add", slow_add)
    store = open_store("memory:", dimension=2)
    store.add([f"d{i}" for i in range(50)], [[float(i), 0.0] for i in range(50)])
    watch = RecallWatch(
        SimpleNamespace(store=store, offset=False), Metrics(), 1.0, cpu_share=0.25, chunk=10
    )
    watch._cores = 1
    watch.offer(np.array([[1.0, 0.0]], dtype=np.float32), [_hits(["d49"])], k=1)
    _wait(watch, 1)
    watch.close()
    assert watch.last_pass["vectors"] == 50
    assert watch.last_pass["seconds"] >= 4 * 0.18 + 5 * 0.06 - 0.01


@pytest.mark.slow
def test_a_pass_over_a_few_hundred_thousand_vectors_reports_within_seconds():
    """300,000 stored vectors of dimension 384 at the default CPU share: 48 sampled queries
    are checked within 30 s, and the figure is the one numpy computes over the whole matrix
    (served lists with 0 to 3 of their top-10 replaced)."""
    rng = np.random.default_rng(7)
    n, d = 300_000, 384
    docs = rng.standard_normal((n, d), dtype=np.float32)
    ids = [f"d{i}" for i in range(n)]
    store = open_store("memory:", dimension=d)
    store.add(ids, docs)
    queries = rng.standard_normal((48, d), dtype=np.float32)
    exact = np.argsort(-(queries @ docs.T), axis=1)[:, :10]
    served = []
    for row, top in enumerate(exact):
        wrong = row % 4  # the last `wrong` hits replaced by documents outside the top-10
        served.append(_hits([ids[j] for j in top[: 10 - wrong]] + ["d-x"] * wrong))
    expected = float(np.mean([1 - (row % 4) / 10 for row in range(48)]))
    watch = RecallWatch(SimpleNamespace(store=store, offset=False), Metrics(), 1.0)
    started = time.monotonic()
    watch.offer(queries, served)
    _wait(watch, 48, timeout=30)
    took = time.monotonic() - started
    watch.close()
    assert watch.recall == pytest.approx(expected)
    assert watch.last_pass["vectors"] == n
    print(f"48 queries over {n} vectors checked in {took:.1f} s: {watch.last_pass}")
