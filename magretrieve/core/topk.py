"""Exact top-k: the one implementation every exact search of the package uses.

Rule, for every caller: rows are ranked best (highest score) first, and equal scores are
broken by the lower column index — the result a stable full sort would give — both for the
order and for which tied entries make the cut at rank ``k``. NaN scores rank below every
number. ``argpartition`` keeps it linear in the number of columns; ties at the cut are
resolved exactly, not left to the partition's arbitrary order.
"""

from __future__ import annotations

import numpy as np

__all__ = ["top_k", "exact_search"]


def _top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Column indices of the top ``k`` of each row of a 2-D matrix (``0 < k <= columns``)."""
    n_rows, n_cols = scores.shape
    if k == n_cols:
        return np.argsort(-scores, axis=1, kind="stable")
    # k-th largest value of each row: everything strictly above it is in, ties fill up by index
    kth = -np.partition(-scores, k - 1, axis=1)[:, k - 1]
    above = scores > kth[:, None]
    tied = scores == kth[:, None]
    # a tied entry is kept when it is among the first (k - n_above) ties of its row
    room = k - above.sum(axis=1)
    keep = above | (tied & (np.cumsum(tied, axis=1) <= room[:, None]))
    cols = np.nonzero(keep)[1].reshape(n_rows, k)  # ascending column per row
    order = np.argsort(-np.take_along_axis(scores, cols, axis=1), axis=1, kind="stable")
    return np.take_along_axis(cols, order, axis=1)


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best entries of each row: (column indices, scores), best first.

    ``scores`` is 1-D (one row) or 2-D (rows × columns); ``k`` larger than the number of
    columns returns every column, ranked. Ties go to the lower column index.
    """
    matrix = np.asarray(scores)
    one_row = matrix.ndim == 1
    if one_row:
        matrix = matrix[None, :]
    if matrix.ndim != 2:
        raise ValueError(f"scores must be 1-D or 2-D, got shape {matrix.shape}")
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    k = min(int(k), matrix.shape[1])
    if k == 0:
        idx = np.zeros((matrix.shape[0], 0), dtype=np.int64)
    else:
        ranked = matrix
        if np.issubdtype(matrix.dtype, np.floating) and np.isnan(matrix).any():
            ranked = np.where(np.isnan(matrix), -np.inf, matrix)
        idx = _top_k_rows(ranked, k).astype(np.int64, copy=False)
    values = np.take_along_axis(matrix, idx, axis=1)
    return (idx[0], values[0]) if one_row else (idx, values)


#: Scores held at once by :func:`exact_search` when no chunk is given (64 MB of float32).
SCORE_BUDGET = 1 << 24


def exact_search(
    queries: np.ndarray, vectors: np.ndarray, k: int, chunk: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Top-``k`` inner-product search: (row indices int64, scores float32), best first.

    Queries are scored ``chunk`` at a time so memory stays at ``chunk × len(vectors)``
    scores (default: as many queries as fit :data:`SCORE_BUDGET` scores, at least one);
    ``k`` beyond the number of vectors returns them all, ranked.
    """
    if chunk is None:
        chunk = max(1, SCORE_BUDGET // max(1, vectors.shape[0]))
    k = min(int(k), vectors.shape[0])
    all_idx = np.zeros((queries.shape[0], k), dtype=np.int64)
    all_scores = np.zeros((queries.shape[0], k), dtype=np.float32)
    for start in range(0, queries.shape[0], chunk):
        idx, scores = top_k(queries[start : start + chunk] @ vectors.T, k)
        all_idx[start : start + chunk] = idx
        all_scores[start : start + chunk] = scores
    return all_idx, all_scores
