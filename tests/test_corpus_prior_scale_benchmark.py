"""benchmarks/corpus_prior_scale.py: the synthetic top-up and the growth exponent, checked."""

from __future__ import annotations

import numpy as np
from conftest import load_benchmark

from magretrieve.priors.base import unit


def test_topped_up_pool_keeps_every_real_vector_and_is_unit() -> None:
    bench = load_benchmark("corpus_prior_scale")
    rng = np.random.default_rng(0)
    real = unit(rng.normal(size=(300, 16))).astype(np.float32)
    pool = bench.topped_up(real, 1000)
    assert pool.shape == (1000, 16)
    np.testing.assert_allclose(np.linalg.norm(pool, axis=1), 1.0, atol=1e-5)
    # every real vector is in the pool exactly once (synthetic ones are mixes, never copies)
    hits = (np.abs(pool @ real.T - 1.0) < 1e-6).sum(axis=0)
    assert (hits == 1).all()
    np.testing.assert_array_equal(bench.topped_up(real, 1000), pool)  # fixed seed
    # a prefix smaller than the real set takes only real vectors
    assert bench.topped_up(real, 200).shape == (200, 16)


def test_slope_is_the_log_log_exponent() -> None:
    bench = load_benchmark("corpus_prior_scale")
    rows = [{"n": n, "t": 3e-9 * n**2} for n in (1000, 2000, 8000)]
    assert abs(bench.slope(rows, "t") - 2.0) < 1e-9
