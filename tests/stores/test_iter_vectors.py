"""``iter_vectors``: every live (id, vector) of a store, block by block, exactly once.

The in-memory stores answer with views of their own arrays (read-only, no copy) and the
others page through their records; either way the blocks hold each live point once, with
its stored vector, deleted and replaced points as they are now, and never more than the
block size asked for.
"""

from __future__ import annotations

import numpy as np
import pytest

from magretrieve.core.errors import StoreError
from magretrieve.stores import open_store

DIM = 8


def _vectors(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def _read(store, block: int) -> dict[str, np.ndarray]:
    seen: dict[str, np.ndarray] = {}
    for ids, vectors in store.iter_vectors(block):
        assert len(ids) == len(vectors) <= block and vectors.shape[1] == DIM
        assert vectors.dtype == np.float32
        for doc_id, vec in zip(ids, vectors, strict=True):
            assert doc_id not in seen, f"{doc_id} read twice"
            seen[doc_id] = np.array(vec)
    return seen


SPECS = {
    "memory": lambda d: open_store("memory:", dimension=DIM),
    "memory-dir": lambda d: open_store(f"memory:{d}/m", dimension=DIM),
    "faiss-flat": lambda d: open_store(f"faiss:{d}/f", dimension=DIM),
    "faiss-hnsw": lambda d: open_store(f"faiss:{d}/h", dimension=DIM, index_type="hnsw"),
    "scann": lambda d: open_store(f"scann:{d}/s", dimension=DIM, exact_below=100),
    "qdrant-edge": lambda d: open_store(f"qdrant-edge:{d}/q", dimension=DIM),
}


@pytest.mark.parametrize("backend", list(SPECS))
def test_blocks_hold_every_live_point_once_with_its_vector(tmp_path, backend):
    store = SPECS[backend](tmp_path)
    vecs = _vectors(700)
    ids = [f"d{i}" for i in range(700)]
    store.add(ids[:500], vecs[:500])
    store.optimize()  # the ScaNN searcher and the HNSW graph hold rows 0..499
    if backend == "scann":
        assert store.parameters()["indexed"] == 500
    store.add(ids[500:], vecs[500:])  # pending rows (searched exactly by ScaNN)
    store.delete(["d3", "d250", "d499", "d650"])  # inside the built rows and after them
    replaced = _vectors(2, seed=1)
    store.add(["d10", "d600"], replaced)  # a replaced row becomes a new one
    expected = {i: v for i, v in zip(ids, vecs, strict=True)}
    for gone in ("d3", "d250", "d499", "d650"):
        del expected[gone]
    expected["d10"], expected["d600"] = replaced
    for block in (64, 4096):
        seen = _read(store, block)
        assert set(seen) == set(expected)
        for doc_id, vec in expected.items():
            np.testing.assert_array_equal(seen[doc_id], vec, err_msg=doc_id)
    ids_again, vecs_again = store._stored_vectors()  # recall's truth is built on the blocks
    assert sorted(ids_again) == sorted(expected) and vecs_again.shape == (len(expected), DIM)
    store.close()


@pytest.mark.parametrize("backend", ["memory", "scann"])
def test_in_memory_blocks_are_read_only_views(tmp_path, backend):
    store = SPECS[backend](tmp_path)
    store.add([f"d{i}" for i in range(300)], _vectors(300))
    store.optimize()
    blocks = list(store.iter_vectors(128))
    assert [len(ids) for ids, _ in blocks] == [128, 128, 44]
    for _, vectors in blocks:
        assert vectors.base is not None and not vectors.flags.writeable  # a view, not a copy
        with pytest.raises(ValueError):
            vectors[0, 0] = 1.0
    store.close()


def test_a_write_during_the_scan_leaves_the_blocks_consistent(tmp_path):
    store = SPECS["memory"](tmp_path)
    vecs = _vectors(300)
    store.add([f"d{i}" for i in range(300)], vecs)
    blocks = store.iter_vectors(100)
    first_ids, first = next(blocks)
    store.add(["new"], _vectors(1, seed=2))  # appends: the scan keeps the rows it took
    store.delete(["d150"])  # replaces the arrays: the scan keeps reading the old ones
    rest = list(blocks)
    got = first_ids + [i for ids, _ in rest for i in ids]
    assert got == [f"d{i}" for i in range(300)]
    np.testing.assert_array_equal(rest[0][1], vecs[100:200])


def test_an_empty_store_has_no_blocks_and_the_block_size_is_checked(tmp_path):
    store = SPECS["scann"](tmp_path)
    assert list(store.iter_vectors()) == []
    for bad in (0, -1, 2.5, True):
        with pytest.raises(StoreError, match="block must be a positive integer"):
            next(store.iter_vectors(bad))
    store.close()
