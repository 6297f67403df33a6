"""benchmarks/mips_scale.py on a tiny corpus: the mixture keeps each cluster's norms, every
column is tuned and measured against exact search, and the table's ratios are its own rows'."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.ann_data import search_indexes_at_every_size
from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration


def clustered(n: int, dim: int, clusters: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Vectors around ``clusters`` directions whose norms depend on the cluster."""
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((clusters, dim))
    centers /= np.linalg.norm(centers, axis=1, keepdims=True)
    label = rng.integers(clusters, size=n)
    x = centers[label] + 0.3 * rng.standard_normal((n, dim)) / np.sqrt(dim)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    norms = 1.0 + 2.0 * label / clusters  # cluster c has norm 1 + 2c/C
    return (x * norms[:, None]).astype(np.float32), label


def test_mixture_samples_keep_each_clusters_norms():
    bench = load_benchmark("mips_scale")
    docs, _ = clustered(4000, 32, 8, seed=0)
    mixture = bench.Mixture.fit(docs, clusters=8)
    sample = mixture.sample(3000, seed=1)
    norms = np.linalg.norm(sample, axis=1)
    # every sampled norm is a measured cluster norm times exp(N(0, 0.02)): within 10 %
    measured = np.unique(np.round(np.linalg.norm(docs, axis=1), 4))
    nearest = measured[np.abs(norms[:, None] - measured[None, :]).argmin(axis=1)]
    assert np.all(np.abs(norms / nearest - 1) < 0.1)
    # directions stay near the fitted clusters: each sample's best centroid cosine is high
    means = mixture.means / np.linalg.norm(mixture.means, axis=1, keepdims=True)
    best = ((sample / norms[:, None]) @ means.T).max(axis=1)
    assert np.median(best) > 0.8


def test_run_size_measures_every_column_against_exact(tmp_path, monkeypatch):
    search_indexes_at_every_size(monkeypatch)  # 3,000 vectors: the stores' indexes answer
    bench = load_benchmark("mips_scale")
    docs, _ = clustered(3000, 32, 8, seed=2)
    mixture = bench.Mixture.fit(docs, clusters=8)
    rng = np.random.default_rng(3)  # queries near the corpus's clusters, like real ones
    near = docs[rng.choice(len(docs), 60, replace=False)]
    queries = near / np.linalg.norm(near, axis=1, keepdims=True)
    queries = (queries + 0.1 * rng.standard_normal(queries.shape) / np.sqrt(32)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    rows = bench.run_size(
        3000,
        mixture,
        queries[:40],
        queries[40:],
        ["faiss-hnsw", "usearch", "store-faiss", "store-scann"],
        0.99,
        10,
        tmp_path,
    )
    assert [r["column"] for r in rows] == [
        "faiss-flat",
        "faiss-hnsw",
        "usearch",
        "store-faiss",
        "store-faiss (real-query tuned)",
        "store-scann",
        "store-scann (real-query tuned)",
    ]
    exact = rows[0]
    assert exact["recall"] == 1.0 and exact["speedup_single"] == 1.0
    for row in rows:
        assert 0.0 <= row["recall"] <= 1.0
        assert row["speedup_single"] == round(row["qps_single"] / exact["qps_single"], 2)
        assert row["memory_x_raw"] == round(row["bytes"] / (3000 * 4 * 32), 3)
        assert row["goal_met"] == (
            row["recall"] >= 0.99 and row["speedup_single"] >= 20 and row["memory_x_raw"] <= 1.5
        )
    # HNSW at this size reaches the target on the tuning queries; the store reports the recall
    # it measured, first on its own vectors, then on the real tuning queries, from one build
    hnsw = rows[1]
    assert hnsw["tuning_reached"] and hnsw["recall"] >= 0.95
    self_tuned, real_tuned = rows[3], rows[4]
    assert self_tuned["self_measured_recall"] is not None and self_tuned["bytes"] > 0
    assert real_tuned["self_measured_recall"] is not None
    assert (
        real_tuned["build_s"] == self_tuned["build_s"]
        and real_tuned["bytes"] == self_tuned["bytes"]
    )
    table = bench.report(
        rows,
        {
            "command": "c",
            "machine": "m",
            "threads": 2,
            "seconds": 60.0,
            "data": "d",
            "target": 0.99,
            "held_out": 40,
        },
    )
    assert table.count("\n| 3,000 |") == 7
