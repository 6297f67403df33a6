"""The live recall check: sampled searches re-run exactly, a gauge, a warning below target."""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import numpy as np
import pytest

from magretrieve.server.metrics import Metrics
from magretrieve.server.recall_watch import MIN_QUERIES, RecallWatch, store_target
from magretrieve.stores import open_store


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


def test_a_poor_ann_index_drops_the_gauge_and_warns(tmp_path, caplog):
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
