"""benchmarks/ann_recall.py in --quick mode: rows are measured, consistent and reported."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration


def test_synthetic_norms_have_the_asked_coefficient_of_variation():
    bench = load_benchmark("ann_recall")
    for cv in (0.05, 0.3, 1.0):
        ids, docs, queries = bench.synthetic(20_000, 16, cv, 100, seed=1)
        norms = np.linalg.norm(docs, axis=1)
        assert abs(norms.std() / norms.mean() - cv) < 0.08 * cv + 0.01, cv
        # queries sit near low-norm documents: the closest direction to each query belongs
        # to a document below the median norm
        nearest = np.argmax(queries @ (docs / norms[:, None]).T, axis=1)
        assert np.median(norms[nearest]) < np.median(norms), cv
        assert np.allclose(np.linalg.norm(queries, axis=1), 1.0, atol=1e-5)
        assert len(ids) == 20_000


def test_quick_run_writes_measured_rows(tmp_path):
    bench = load_benchmark("ann_recall")
    assert bench.main(["--quick", "--no-lock", "--out", str(tmp_path)], standalone_mode=False) == 0
    data = json.loads((tmp_path / "ann_recall_quick.json").read_text())
    rows = data["rows"]
    assert [r["index"] for r in rows] == [
        "FAISS HNSW32",
        "FAISS IVF",
        "FAISS IVF-PQ",
        "Qdrant Edge HNSW16",
    ]
    for r in rows:
        assert 0.0 <= r["recall_heldout"] <= 1.0
        assert r["speedup_single"] == round(r["qps_single"] / r["exact_qps_single"], 2)
        assert r["goal_met"] == (r["recall_heldout"] >= 0.99 and r["speedup_single"] >= 10)
    # tuning on real queries never lowers held-out recall below the stored-direction tuning
    hnsw = rows[0]
    assert hnsw["recall_heldout"] >= hnsw["recall_heldout_after_stored_tuning"] - 0.01
    md = (tmp_path / "ann_recall_quick.md").read_text()
    assert "| synthetic norm CV 0.3 | FAISS HNSW32 |" in md and "Goal not met:" in md
