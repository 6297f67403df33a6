"""The one exact top-k helper against hand-worked rankings: order, ties (lower index first,
also at the cut), NaN, k beyond the row, one row or many, and chunked inner-product search."""

from __future__ import annotations

import numpy as np
import pytest

from magretrieve.core.topk import exact_search, top_k


def test_rows_ranked_best_first_by_hand() -> None:
    scores = np.array([[0.1, 0.9, 0.5, 0.7], [3.0, -1.0, 2.0, 0.0]])
    idx, vals = top_k(scores, 2)
    np.testing.assert_array_equal(idx, [[1, 3], [0, 2]])
    np.testing.assert_array_equal(vals, [[0.9, 0.7], [3.0, 2.0]])
    assert idx.dtype == np.int64


def test_ties_go_to_the_lower_index_in_order_and_at_the_cut() -> None:
    # five equal scores around a better one: the cut at k=3 keeps columns 0 and 1 of the ties
    row = np.array([1.0, 1.0, 2.0, 1.0, 1.0, 1.0])
    idx, vals = top_k(row, 3)
    np.testing.assert_array_equal(idx, [2, 0, 1])
    np.testing.assert_array_equal(vals, [2.0, 1.0, 1.0])
    # ties reversed in position: still the lower indices, in index order
    idx, _ = top_k(np.array([[0.0, 5.0, 5.0, 5.0, 9.0]]), 3)
    np.testing.assert_array_equal(idx, [[4, 1, 2]])
    # all equal: the first k columns
    idx, _ = top_k(np.zeros((2, 7)), 4)
    np.testing.assert_array_equal(idx, [[0, 1, 2, 3], [0, 1, 2, 3]])


def test_agrees_with_a_stable_full_sort_on_many_ties() -> None:
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, size=(50, 30)).astype(np.float32)  # heavy ties
    for k in (1, 5, 17, 30):
        idx, vals = top_k(scores, k)
        want = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        np.testing.assert_array_equal(idx, want)
        np.testing.assert_array_equal(vals, np.take_along_axis(scores, want, axis=1))


def test_k_beyond_the_row_and_k_zero() -> None:
    idx, vals = top_k(np.array([0.2, 0.8, 0.5]), 10)
    np.testing.assert_array_equal(idx, [1, 2, 0])
    np.testing.assert_array_equal(vals, [0.8, 0.5, 0.2])
    idx, vals = top_k(np.ones((3, 4)), 0)
    assert idx.shape == (3, 0) and vals.shape == (3, 0)
    with pytest.raises(ValueError, match="k must be"):
        top_k(np.ones(3), -1)


def test_nan_ranks_below_every_number() -> None:
    idx, vals = top_k(np.array([np.nan, -5.0, np.nan, 1.0]), 3)
    np.testing.assert_array_equal(idx, [3, 1, 0])
    assert vals[0] == 1.0 and vals[1] == -5.0 and np.isnan(vals[2])


def test_infinities_are_ordinary_extremes() -> None:
    idx, _ = top_k(np.array([-np.inf, 0.0, np.inf, -np.inf]), 4)
    np.testing.assert_array_equal(idx, [2, 1, 0, 3])


def test_exact_search_chunks_queries_and_returns_float32() -> None:
    q = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=np.float32)
    d = np.array([[2.0, 0.0], [0.0, 1.0], [2.4, 1.8], [1.2, 1.6]], dtype=np.float32)
    # q1: 2, 0, 2.4, 1.2   q2: 0, 1, 1.8, 1.6   q3: 2, 1, 4.2, 2.8
    idx, scores = exact_search(q, d, 3, chunk=2)  # a full chunk of 2, then one of 1
    np.testing.assert_array_equal(idx, [[2, 0, 3], [2, 3, 1], [2, 3, 0]])
    np.testing.assert_allclose(scores, [[2.4, 2.0, 1.2], [1.8, 1.6, 1.0], [4.2, 2.8, 2.0]])
    assert scores.dtype == np.float32 and idx.dtype == np.int64
    idx, _ = exact_search(q[:1], d, 99)
    np.testing.assert_array_equal(idx, [[2, 0, 3, 1]])
