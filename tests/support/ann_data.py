"""Clustered vectors with log-normal norms, shared by the store tests (a fixture, not code)."""

from __future__ import annotations

import numpy as np


def ann_data(n: int = 3000, nq: int = 40, dim: int = 32, seed: int = 3):
    """Clustered vectors with log-normal norms, so ANN indexes have structure to use, and unit
    queries near some of them. Returns (ids, vectors, queries)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(30, dim))
    docs = centers[rng.integers(0, 30, n)] + 0.6 * rng.normal(size=(n, dim))
    docs = (docs / np.linalg.norm(docs, axis=1, keepdims=True)).astype(np.float32)
    docs *= rng.lognormal(0.0, 0.3, size=(n, 1)).astype(np.float32)
    queries = docs[rng.choice(n, nq, replace=False)] + 0.2 * rng.normal(size=(nq, dim))
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return [f"d{i}" for i in range(n)], docs, queries.astype(np.float32)
