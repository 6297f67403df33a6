"""Exact inner-product search in numpy: the reference every other store is compared with.

Optionally persisted to a folder (``memory:DIR``) as ``vectors.npy`` + ``records.json`` with
the same generation-and-checksum scheme as the FAISS store.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.files import sha256_file
from magretrieve.core.topk import top_k
from magretrieve.stores import registry
from magretrieve.stores._generation import GenerationFiles, SavedGenerations
from magretrieve.stores._writer_lock import WriterLock
from magretrieve.stores.base import (
    Batch,
    IdMapMixin,
    StoreHit,
    StoreRecord,
    VectorStore,
    atomic_write_bytes,
    atomic_write_json,
    missing_store,
    new_store_id,
    plain_file,
    read_state_file,
    reading_store,
    state_metadata,
    state_store_id,
)

STATE_FILE = "memory_store.json"


class MemoryStore(SavedGenerations, IdMapMixin, VectorStore):
    """All vectors in one float32 matrix; search is ``queries @ vectors.T`` and a partial sort."""

    kind = "memory"
    thread_safe_search = True
    persists_beside_search = True  # the save only reads the arrays; searches take no lock
    _files = GenerationFiles(STATE_FILE, "magretrieve-memory-store", "memory", {})

    def __init__(self, dimension: int, path: str | Path | None = None) -> None:
        if int(dimension) < 1:
            raise StoreError(f"memory store: dimension must be positive, got {dimension}")
        self._dim = int(dimension)
        self._path = Path(path) if path is not None else None
        self._vectors = np.zeros((0, self._dim), dtype=np.float32)
        self._ids: list[str] = []
        self._payloads: list[dict[str, Any]] = []
        self._row: dict[str, int] = {}
        self._meta: dict[str, Any] | None = None
        self._lock = threading.RLock()
        self._generation = 0
        self._store_id = new_store_id()  # a folder loaded later keeps its recorded id
        self._dirty = False
        self._writer = WriterLock(self._path, self.location) if self._path else None

    @classmethod
    def open(cls, path: str | Path, dimension: int | None = None) -> MemoryStore:
        """Open a persisted memory store, or create it when the folder holds none."""
        path = Path(path)
        state_file = path / STATE_FILE
        if not state_file.is_file():
            if dimension is None:
                raise missing_store(str(path), "memory store")
            return cls(dimension, path)
        state = read_state_file(state_file, "magretrieve-memory-store", "memory")
        with reading_store(state_file, OSError):
            return cls._load_state(path, state, dimension)

    @classmethod
    def _load_state(cls, path: Path, state: dict[str, Any], dimension: int | None) -> MemoryStore:
        vec_file = plain_file(path, state["vectors"], STATE_FILE)
        rec_file = plain_file(path, state["records"], STATE_FILE)
        for f, key in ((vec_file, "vectors_sha256"), (rec_file, "records_sha256")):
            if not f.is_file() or sha256_file(f) != state[key]:
                raise StoreError(f"{f}: missing or does not match its checksum (half-written?)")
        store = cls(int(state["dimension"]), path)
        if dimension is not None and int(dimension) != store._dim:
            raise StoreError(
                f"{path}: store has dimension {store._dim}, but dimension {dimension} was asked for"
            )
        vectors = np.load(vec_file, allow_pickle=False)  # never unpickle a store file
        records = json.loads(rec_file.read_text())
        if vectors.dtype != np.float32 or vectors.shape != (len(records), store._dim):
            raise StoreError(
                f"{vec_file}: holds {vectors.dtype} {vectors.shape}, expected float32 "
                f"({len(records)}, {store._dim}) for {rec_file.name}"
            )
        store._vectors = vectors
        store._ids = [str(r[0]) for r in records]
        store._payloads = [dict(r[1]) for r in records]
        store._row = {i: n for n, i in enumerate(store._ids)}
        store._meta = state_metadata(state, str(path / STATE_FILE))
        store._generation = int(state.get("generation", 0))
        store._store_id = state_store_id(state.get("store_id"))
        return store

    def _reopened(self) -> MemoryStore:
        return MemoryStore.open(self._path)  # type: ignore[arg-type]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.release()

    @property
    def location(self) -> str:
        return f"memory:{self._path}" if self._path else "memory:"

    def _upsert(self, batch: Batch) -> None:
        with self._lock:
            self._begin_write()
            self._dirty = True
            new_rows = []
            for doc_id, vec, payload, _ in batch.rows():
                row = self._row.get(doc_id)
                if row is None:
                    self._row[doc_id] = len(self._ids)
                    new_rows.append(vec)
                    self._ids.append(doc_id)
                    self._payloads.append(payload)
                else:
                    self._vectors[row] = vec
                    self._payloads[row] = payload
            if new_rows:
                self._vectors = np.vstack([self._vectors, np.stack(new_rows)])

    def _query(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        vectors, ids, payloads = self._vectors, self._ids, self._payloads
        n = vectors.shape[0]
        if n == 0:
            return [[] for _ in range(len(q))]
        scores = q @ vectors.T
        rows, _ = top_k(scores, k)  # ties broken by insertion order, like a stable exact scan
        out = []
        for row, top in zip(scores, rows, strict=True):
            norms = np.linalg.norm(vectors[top], axis=1)
            out.append(
                [
                    StoreHit(
                        ids[j],
                        float(row[j]),
                        dict(payloads[j]),
                        vectors[j].copy() if with_vectors else None,
                        float(norm),
                    )
                    for j, norm in zip(top, norms, strict=True)
                ]
            )
        return out

    def _delete(self, ids: list[str]) -> int:
        with self._lock:
            rows = sorted({self._row[i] for i in ids if i in self._row})
            if not rows:
                return 0
            self._begin_write()
            self._dirty = True
            keep = np.setdiff1d(np.arange(len(self._ids)), rows)
            self._vectors = self._vectors[keep]
            self._ids = [self._ids[j] for j in keep]
            self._payloads = [self._payloads[j] for j in keep]
            self._row = {i: n for n, i in enumerate(self._ids)}
            return len(rows)

    def _count(self) -> int:
        return len(self._ids)

    def _fetch(self, ids: list[str]) -> Iterable[StoreRecord]:
        for doc_id in ids:
            row = self._row.get(doc_id)
            if row is not None:
                yield StoreRecord(doc_id, self._vectors[row].copy(), dict(self._payloads[row]))

    def _vector_blocks(self, size: int) -> Iterator[tuple[list[str], np.ndarray]]:
        """Read-only views of the matrix. A write replaces ``_vectors`` and ``_ids`` (or
        appends past the rows taken here, or overwrites a row in place), so the pair taken
        under the lock stays consistent for the whole scan."""
        with self._lock:
            vectors, ids, n = self._vectors, self._ids, len(self._ids)
        for start in range(0, n, size):
            view = vectors[start : start + size]
            view.flags.writeable = False
            yield ids[start : start + size], view

    def _describe(self) -> dict[str, Any]:
        return {"index": "exact (numpy)"}

    def persist(self) -> None:
        """Write vectors and records under a new generation, then the state file last."""
        if self._path is None:
            return
        import io

        with self._lock:
            if not self._dirty and (self._path / STATE_FILE).is_file():
                return  # nothing changed (and a reader never takes the writer lock)
            self._begin_write()
            self._path.mkdir(parents=True, exist_ok=True)
            old = (
                json.loads((self._path / STATE_FILE).read_text())
                if (self._path / STATE_FILE).is_file()
                else {}
            )
            gen = int(old.get("generation", 0)) + 1
            buf = io.BytesIO()
            np.save(buf, self._vectors)
            vec_name, rec_name = f"vectors-{gen}.npy", f"records-{gen}.json"
            atomic_write_bytes(self._path / vec_name, buf.getvalue())
            atomic_write_bytes(
                self._path / rec_name,
                json.dumps(
                    [[i, p] for i, p in zip(self._ids, self._payloads, strict=True)]
                ).encode(),
            )
            atomic_write_json(
                self._path / STATE_FILE,
                {
                    "format": "magretrieve-memory-store",
                    "generation": gen,
                    "store_id": self._store_id,
                    "dimension": self._dim,
                    "vectors": vec_name,
                    "records": rec_name,
                    "vectors_sha256": sha256_file(self._path / vec_name),
                    "records_sha256": sha256_file(self._path / rec_name),
                    "metadata": self._meta,
                },
            )
            for key in ("vectors", "records"):
                if key in old and old[key] not in (vec_name, rec_name):
                    (self._path / old[key]).unlink(missing_ok=True)
            self._generation = gen
            self._dirty = False


# ----------------------------------------------------------------------------- registry entry


def _open(loc: dict[str, str], dimension: int | None, **options: Any) -> MemoryStore:
    if loc["path"]:
        return MemoryStore.open(loc["path"], dimension)
    if dimension is None:
        raise StoreError("memory: store needs a dimension")
    return MemoryStore(dimension)


registry.register(
    registry.Backend(
        form="memory:[DIR]",
        open=_open,
        folder=True,
        persists=lambda loc: bool(loc["path"]),
    )
)
