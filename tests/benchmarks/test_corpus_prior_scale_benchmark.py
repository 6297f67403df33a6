"""benchmarks/studies/corpus_prior_scale.py: the synthetic top-up and the growth exponent, checked."""

from __future__ import annotations

import numpy as np
import pytest

from magretrieve.priors.base import unit
from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration


def test_topped_up_pool_keeps_every_real_vector_and_is_unit() -> None:
    bench = load_benchmark("studies/corpus_prior_scale")
    rng = np.random.default_rng(0)
    real = unit(rng.normal(size=(300, 16))).astype(np.float32)
    pool = bench.topped_up(real, 1000)
    assert pool.shape == (1000, 16)
    np.testing.assert_allclose(np.linalg.norm(pool, axis=1), 1.0, atol=1e-5)
    # every real vector is in the pool exactly once (synthetic ones are mixes, never copies)
    hits = (np.abs(pool @ real.T - 1.0) < 1e-6).sum(axis=0)
    assert (hits == 1).all()
    np.testing.assert_array_equal(bench.topped_up(real, 1000), pool)  # fixed seed
    marked, is_real = bench.topped_up_marked(real, 1000)
    np.testing.assert_array_equal(marked, pool)
    # the mark says which rows are real: exactly those equal to a real vector
    np.testing.assert_array_equal(is_real, (np.abs(pool @ real.T - 1.0) < 1e-6).any(axis=1))
    # a prefix smaller than the real set takes only real vectors
    assert bench.topped_up(real, 200).shape == (200, 16)


def test_slope_is_the_log_log_exponent() -> None:
    bench = load_benchmark("studies/corpus_prior_scale")
    rows = [{"n": n, "t": 3e-9 * n**2} for n in (1000, 2000, 8000)]
    assert abs(bench.slope(rows, "t") - 2.0) < 1e-9


def test_results_of_partial_rows_are_written(tmp_path) -> None:
    """Sizes without the old paths or fit-prior show '—'; goals judge the largest size."""
    bench = load_benchmark("studies/corpus_prior_scale")
    common = {"real": 10, "nlist": 4, "blocked_nlist": 2, "exact_rows": 50}
    rows = [
        {**common, "n": 100, "exact_s": 8.0, "grouped_s": 2.0, "grouped_speedup": 4.0,
         "grouped_spearman_z": 0.995, "rescale_s": 3.0, "rescale_hub_s": 2.0,
         "rescale_peak_rss_gib": 0.5, "ivf_s": 4.0, "ivf_speedup": 2.0, "ivf_spearman_z": 0.996},
        {**common, "n": 400, "exact_s": 128.0, "grouped_s": 16.0, "grouped_speedup": 8.0,
         "grouped_spearman_z": 0.991, "rescale_s": 700.0, "rescale_hub_s": 16.0,
         "rescale_peak_rss_gib": 1.5, "fit_prior_s": 30.0, "fit_prior_docs": 400,
         "fit_prior_peak_rss_gib": 1.0, "fit_prior_beta": 0.02},
    ]  # fmt: skip
    part = {"ndcg@10": 0.5, "seconds": 1.0, "spearman_z": 0.99}
    sci = {"beta": 0.02, "cosine": 0.5, "exact": {"ndcg@10": 0.5}, "grouped": part,
           "ivf": part, "blocked": part}  # fmt: skip
    bench.write_results(tmp_path, rows, sci, np.zeros((10, 4)), 128, 100, 50)
    text = (tmp_path / "corpus_prior_scale.md").read_text()
    assert "| Spearman of z vs exact at 400 | ≥ 0.99 | 0.9910 | yes |" in text
    assert "| whole rescale --corpus-prior at 400 | ≤ 600 s | 700 s | **no** |" in text
    assert "| 100 | 3 | 2 | 0.5 | — | — | — | — |" in text
    assert "grouped IVF n^1.50" in text  # 2 s → 16 s from 100 to 400 documents: 8 = 4^1.5
