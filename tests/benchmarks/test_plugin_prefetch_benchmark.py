"""benchmarks/studies/plugin_prefetch.py: the recall-by-prefetch computation on hand-checked cases."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration

bench = load_benchmark("studies/plugin_prefetch")


def test_recall_counts_only_what_the_cosine_prefetch_can_reach():
    # the best cos·m document (index 2: 0.7·2 = 1.4) is third by cosine
    cos = np.array([[0.9, 0.8, 0.7, 0.1]])
    m = np.array([1.0, 1.0, 2.0, 1.0])
    assert bench.prefetch_recall(cos, m, (1, 2, 3, 4), k=1) == {1: 0.0, 2: 0.0, 3: 1.0, 4: 1.0}
    # k=2: exact {2, 0}; P=2 reaches {0, 1} -> one of two
    assert bench.prefetch_recall(cos, m, (2, 3), k=2) == {2: 0.5, 3: 1.0}


def test_constant_magnitude_needs_no_prefetch_beyond_k():
    rng = np.random.default_rng(0)
    cos = rng.uniform(-1, 1, size=(30, 200))
    rec = bench.prefetch_recall(cos, np.full(200, 3.0), (10, 50), k=10)
    assert rec == {10: 1.0, 50: 1.0}
    wide = bench.prefetch_recall(cos, rng.lognormal(0, 1.0, 200), (10, 200), k=10)
    assert wide[10] < 1.0 and wide[200] == 1.0
