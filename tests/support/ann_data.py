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


#: The store classes with an ``exact_below`` size (module, class): below it they search exactly.
EXACT_BELOW_STORES = (
    ("magretrieve.stores.faiss_store", "FaissStore"),
    ("magretrieve.stores.chroma_store", "ChromaStore"),
    ("magretrieve.stores.qdrant_store", "QdrantStore"),
    ("magretrieve.stores.pgvector_store", "PgVectorStore"),
    ("magretrieve.stores.lancedb_store", "LanceDBStore"),
    ("magretrieve.stores.milvus_store", "MilvusStore"),
)


def search_indexes_at_every_size(monkeypatch) -> None:
    """Tests of an ANN index itself (its recall, its tuning) on a few thousand vectors: set
    every store's ``exact_below`` to 0 for this test, so the index answers (in this process)."""
    import importlib

    for module, name in EXACT_BELOW_STORES:
        try:
            cls = getattr(importlib.import_module(module), name)
        except ImportError:  # a backend whose extra is not installed
            continue
        monkeypatch.setattr(cls, "exact_below", 0)
