"""FAISS by inner product around factory strings, with string ids, payloads and norms.

``index_type`` is ``flat`` (exact ``IndexFlatIP``, default), ``hnsw``, ``ivf`` (aliases of the
factory strings ``Flat``, ``HNSW{M},Flat``, ``IVF{nlist},Flat``) or any
``faiss.index_factory`` string, e.g. ``IVF1024,PQ32`` or ``OPQ16,IVF256,PQ16``; the metric is
always ``METRIC_INNER_PRODUCT``. An index that needs training (IVF, PQ, OPQ) buffers the
first vectors added and is trained on them once enough are there (or at ``optimize``/search),
the FAISS idiom. A FAISS index object can be passed instead (``open_store(index)``).

Split by job: :mod:`._faiss_index` builds/adopts index objects (owning references, training,
search knobs), :mod:`._record_table` is the id map, :mod:`._faiss_files` the generations on
disk, :mod:`._ann_recall` measures and tunes recall, :mod:`._writer_lock` keeps a second
writer out. This module is the store that ties them together.

Rules kept here: an L2 index is refused, the index stores vectors as given (a normalizing
pre-transform is reported by ``normalizes_vectors`` so the Retriever refuses it for
magnitude-keeping models), every option is validated before any native call, and
single-query search runs with one OpenMP thread (faster than two for one query: see
benchmarks/results/stores.md).
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.locks import Counter, RWLock
from magretrieve.core.options import option
from magretrieve.core.topk import top_k
from magretrieve.stores import _ann_recall, _faiss_files, registry
from magretrieve.stores import _faiss_index as fx
from magretrieve.stores._generation import SavedGenerations
from magretrieve.stores._record_table import RecordTable, RecordTableMixin, json_bytes
from magretrieve.stores._writer_lock import WriterLock
from magretrieve.stores.base import (
    Batch,
    StoreHit,
    StoreRecord,
    VectorStore,
    check_reopen,
    missing_store,
    new_store_id,
    reading_store,
    state_store_id,
)
from magretrieve.stores.options import IndexOptions, StoreOptions, check_dimension

logger = logging.getLogger(__name__)

STATE_FILE = _faiss_files.STATE_FILE
INDEX_TYPES = fx.ALIASES
DEFAULTS = fx.DEFAULTS
inspect_index = fx.inspect_index  # kept importable from here
#: Options fixed when the index is built (a different value on reopen is an error).
BUILD_OPTIONS = ("hnsw_m", "ef_construction", "nlist")
#: The build options a factory string itself fixes (``HNSW32``, ``IVF1024``).
FACTORY_OPTIONS = ("hnsw_m", "nlist")
#: Options a reopen may change (search-time knobs).
SEARCH_OPTIONS = ("ef_search", "nprobe")
#: An HNSW or IVF index holding fewer live vectors than this is searched exactly (its flat
#: storage scanned, every IVF list probed): one query over 5,000 384-d vectors takes as long
#: by a flat scan as by HNSW at efSearch 128 (docs/stores.md, "Exact below a size").
EXACT_BELOW = 5_000


class FaissStore(SavedGenerations, RecordTableMixin, VectorStore):
    """A FAISS index plus a record table (string id + payload + norm per int64 FAISS id).

    Deletion and replacement use ``remove_ids`` where the index supports it (flat, IVF) and
    tombstones otherwise (HNSW: a deleted id is filtered out of results, and searches ask
    FAISS for ``k + tombstones`` candidates so ``k`` live hits come back).
    """

    kind = "faiss"
    #: Live vectors below which an ANN index is searched exactly (:data:`EXACT_BELOW`).
    exact_below = EXACT_BELOW
    thread_safe_search = True  # FAISS const search is thread-safe; knobs change only by tuning
    #: the save trains (ivf alias) under the store lock, then serializes without it
    persists_beside_search = True
    _files = _faiss_files.FILES
    _lock: RWLock
    _kept_on_catch_up = ("_writer", "single_query_threads", "target_recall")

    def __init__(
        self,
        dimension: int,
        path: str | Path | None = None,
        *,
        options: IndexOptions | None = None,
        index: Any = None,
        single_query_threads: int | None = 1,
        saved: _faiss_files.Saved | None = None,
        **knobs: Any,
    ) -> None:
        """A new store (``options``, or its keywords ``index_type``, ``hnsw_m``, ... ; or an
        adopted ``index``), or the one ``saved`` in ``path`` (what :meth:`open` read; the
        options then are the search-time ones)."""
        self._path = Path(path) if path is not None else None
        where = self.location
        dim = check_dimension(dimension, where)
        opts = IndexOptions.of(options, knobs, where)
        index_type = opts.index_type
        given = opts.as_keywords()
        del given["index_type"], given["target_recall"]
        self.target_recall = opts.target_recall
        self._init_common(dim, self._path, single_query_threads)
        if saved is not None:
            self._load(saved, given)
            return
        self.params = {k: (v if v is not None else DEFAULTS[k]) for k, v in given.items()}
        if index is not None:
            if index_type is not None:
                raise StoreError(f"{where}: pass either an index object or index_type, not both")
            self._adopt(index, given)
        else:
            self._build(index_type or "flat", given)
        if self._handle is not None and self._handle.index.d != self._dim:
            raise StoreError(
                f"{where}: FAISS index has dimension {self._handle.index.d}, "
                f"but dimension {self._dim} was asked for"
            )

    def _init_common(self, dim: int, path: Path | None, threads: int | None) -> None:
        self._dim = dim
        self._path = path
        self._lock = RWLock()  # searches and scans share it; changes take it alone
        self._searches_now = Counter()  # FAISS searches running at this moment
        self._table = RecordTable()
        self._meta: dict[str, Any] | None = None
        self._generation = 0
        self._store_id = new_store_id()  # a folder loaded below keeps its recorded id
        self._handle: fx.IndexHandle | None = None
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []  # before training
        self._sequential = False  # adopted plain index: FAISS ids are positions
        self._writer = WriterLock(path, self.location) if path is not None else None
        self._dirty = False
        self.single_query_threads = threads
        self.recall: dict[str, Any] | None = None
        self.target_recall = getattr(self, "target_recall", None)

    # ------------------------------------------------------------------ construction

    def _build(self, index_type: str, given: dict[str, Any]) -> None:
        where = self.location
        if not isinstance(index_type, str) or not index_type.strip():
            raise StoreError(f"{where}: unknown FAISS index type {index_type!r}")
        alias = index_type.strip().lower()
        if alias in fx.ALIASES:
            self.index_type = alias
            kind = alias
            factory = fx.alias_factory(alias, self.params)
        else:
            self.index_type = "factory"
            factory = index_type.strip()
            for key in ("hnsw_m", "nlist"):
                if given[key] is not None:
                    raise StoreError(
                        f"{where}: {registry.OPTIONS[key].label} applies to the hnsw/ivf aliases; "
                        f"the factory string {factory!r} sets it itself"
                    )
            kind = None
        self.params["factory"] = factory
        if factory is not None:
            handle = fx.wrap(fx.make_factory_index(self._dim, factory, where), where)
            kind = handle.kind
            self._handle = handle
        self._check_applicable(kind, given)
        if self._handle is not None:
            # M and nlist come from the factory string; efConstruction (which a factory string
            # cannot set) and the search-time knobs keep the given values or the store
            # defaults (FAISS's own efConstruction=40 / efSearch=16 / nprobe=1 lose recall)
            built = fx.read_parameters(self._handle)
            self.params.update({k: v for k, v in built.items() if k in FACTORY_OPTIONS})
            fx.set_build_parameters(self._handle, self.params)
            fx.set_search_parameters(self._handle, self.params)
        self._normalizes = bool(self._handle and self._handle.normalizes)

    def _check_applicable(self, kind: str | None, given: dict[str, Any]) -> None:
        """Options for another index kind are an error, not silently ignored."""
        allowed = {"hnsw": {"hnsw_m", "ef_construction", "ef_search"}, "ivf": {"nlist", "nprobe"}}
        ok = allowed.get(kind or "", set())
        bad = [k for k, v in given.items() if v is not None and k not in ok]
        if bad:
            flags = ", ".join(registry.OPTIONS[k].label for k in bad)
            raise StoreError(
                f"{self.location}: {flags} do(es) not apply to a FAISS {kind or 'index'} index "
                f"({self.params.get('factory') or self.index_type})"
            )
        if self.target_recall is not None and kind not in ("hnsw", "ivf"):
            raise StoreError(
                f"{self.location}: --target-recall needs an approximate (hnsw/ivf) index, "
                f"not {kind}"
            )

    def _adopt(self, index: Any, given: dict[str, Any]) -> None:
        """Accept a FAISS index object: its metric is checked, its owner kept alive."""
        where = self.location
        handle = fx.wrap(index, where)
        self._check_applicable(handle.kind, {k: v for k, v in given.items() if k != "nlist"})
        self.index_type = handle.kind
        self.params.update(fx.read_parameters(handle))
        self.params.update({k: v for k, v in given.items() if v is not None})
        self.params["factory"] = None
        fx.set_search_parameters(handle, self.params)
        self._normalizes = handle.normalizes
        self._handle = handle
        if (
            handle.index is index
            and handle.ntotal > 0
            and not fx.inspect_index(index)["native_ids"]
        ):
            # vectors without a record table: ids "0".."n-1" (FAISS's own sequential ids)
            logger.warning(
                "adopting a FAISS index with %d unnamed vectors; their ids are '0'..'%d'",
                handle.ntotal,
                handle.ntotal - 1,
            )
            norms = np.linalg.norm(index.reconstruct_n(0, handle.ntotal), axis=1)
            self._table = RecordTable.sequential(norms)
            self._sequential = True

    # ------------------------------------------------------------------ properties

    @property
    def location(self) -> str:
        return f"faiss:{self._path}" if self._path else "faiss:(in memory)"

    @property
    def normalizes_vectors(self) -> bool:
        return bool(getattr(self, "_normalizes", False))

    @property
    def index(self) -> Any:
        """The underlying FAISS index object (None while an untrained index waits for data)."""
        return self._handle.index if self._handle is not None else None

    def _is_trained(self) -> bool:
        return self._handle is not None and self._handle.is_trained

    # ------------------------------------------------------------------ load / save

    @classmethod
    def open(cls, path: str | Path, dimension: int | None = None, **options: Any) -> FaissStore:
        """Open the store in ``path`` or create an empty one there (needs ``dimension``)."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise StoreError(f"faiss:{path}: {path} is a file, not a folder")
        if not _faiss_files.has_state(path):
            _faiss_files.check_no_orphans(path)
            if dimension is None:
                raise missing_store(str(path), "FAISS store")
            return cls(int(dimension), path, **options)
        with reading_store(path / STATE_FILE, RuntimeError):  # RuntimeError: FAISS cannot parse it
            saved = _faiss_files.read(path)
            return cls._from_saved(path, saved, dimension, options)

    @classmethod
    def _from_saved(
        cls,
        path: Path,
        saved: _faiss_files.Saved,
        dimension: int | None,
        options: dict[str, Any],
    ) -> FaissStore:
        state = saved.state
        if dimension is not None and int(dimension) != int(state["dimension"]):
            raise StoreError(
                f"{path}: store has dimension {state['dimension']}, "
                f"but the model produces dimension {dimension}"
            )
        cls._check_reopen(f"faiss:{path}", state["index_type"], state["parameters"], options)
        return cls(int(state["dimension"]), path, saved=saved, **options)

    def _load(self, saved: _faiss_files.Saved, given: dict[str, Any]) -> None:
        """Take the state, index and records of a saved generation."""
        state, path, where = saved.state, self._path, self.location
        assert path is not None
        params = dict(state["parameters"])
        stored_type = state["index_type"]
        self.params = {**{k: DEFAULTS[k] for k in DEFAULTS}, **params}
        self.params.update({k: given[k] for k in SEARCH_OPTIONS if given[k] is not None})
        self.index_type = stored_type
        self._generation = int(state["generation"])
        self._store_id = state_store_id(state.get("store_id"))
        self._meta = _faiss_files.metadata(state, path)
        self.recall = state.get("recall")
        self._sequential = bool(state.get("sequential", False))
        if saved.index_file is None:  # generation 0: created, first save never completed
            if stored_type != "factory" and params.get("factory") is None:
                self.params["factory"] = fx.alias_factory(stored_type, self.params)
            factory = self.params.get("factory")
            if factory is not None:
                self._handle = fx.wrap(fx.make_factory_index(self._dim, factory, where), where)
                fx.set_build_parameters(self._handle, self.params)
            self._normalizes = bool(self._handle and self._handle.normalizes)
        else:
            self._handle = fx.read(str(saved.index_file), str(saved.index_file))
            self._normalizes = self._handle.normalizes
            records_file = path / state["records_file"]
            _check_records(saved.records, records_file)
            self._table = RecordTable.from_json(saved.records or {})
            pending = saved.pending
            pfids = (saved.records or {}).get("pending", [])
            if pending is not None and len(pfids):
                self._pending = [(np.asarray(pfids, dtype=np.int64), pending)]
            _check_consistent(self, saved.index_file, records_file)
        if self._handle is not None:
            fx.set_search_parameters(self._handle, self.params)
            self._check_applicable(self._handle.kind, {k: given[k] for k in SEARCH_OPTIONS})

    @staticmethod
    def _check_reopen(
        where: str, stored_type: str, params: dict[str, Any], options: dict[str, Any]
    ) -> None:
        """Build-time options on reopen must match what the index was built with."""
        asked = options.get("index_type")
        if asked is not None:
            stored_factory = params.get("factory")
            same = asked.strip().lower() == stored_type or (
                stored_factory is not None and asked.strip() == stored_factory
            )
            if not same:
                shown = stored_factory or stored_type
                raise StoreError(
                    f"{where}: the store was built as a {shown} index; --faiss-index {asked} "
                    "cannot change it. Index into a new folder (or delete this one) to rebuild"
                )
        check_reopen(where, params, {k: options.get(k) for k in BUILD_OPTIONS})

    def _state(self, files: dict[str, Any]) -> dict[str, Any]:
        return {
            "format": _faiss_files.FORMAT,
            "format_version": _faiss_files.FORMAT_VERSION,
            "generation": self._generation + 1 if files else 0,
            "store_id": self._store_id,
            "dimension": self._dim,
            "metric": "inner_product",
            "index_type": self.index_type,
            "sequential": self._sequential,
            "parameters": self.params,
            "recall": self.recall,
            "count": self.count() if files else 0,
            "index_file": files.get("index_file"),
            "records_file": files.get("records_file"),
            "pending_file": files.get("pending_file"),
            "index_sha256": files.get("index_sha256"),
            "records_sha256": files.get("records_sha256"),
            "pending_sha256": files.get("pending_sha256"),
            "metadata": self._meta,
        }

    def _reopened(self) -> FaissStore:
        return FaissStore.open(self._path)  # type: ignore[arg-type]

    def persist(self) -> None:
        """Save a new generation atomically (the state file is switched last).

        An untrained index is saved untrained with its buffered vectors, so a checkpoint does
        not force training on too few vectors; only the ``ivf`` alias, whose list count
        follows the data, trains at its first save. Nothing changed: nothing written.
        """
        if self._path is None:
            return
        with self._lock:  # searches wait while an untrained index is saved (a small store)
            if not self._dirty and _faiss_files.has_state(self._path):
                return
            self._begin_write()
            if self._handle is None and self._pending:
                self._flush_pending(final=True)
            if self._handle is None:  # nothing added yet: record the empty store's settings
                _faiss_files.FILES.begin(self._path, self._state({}))
                self._dirty = False
                return
            handle, records, gen = self._handle, self._table.to_json(), self._generation + 1
            pending: dict[str, bytes] = {}
            if self._pending:
                vecs = np.concatenate([v for _, v in self._pending])
                records["pending"] = np.concatenate([f for f, _ in self._pending]).tolist()
                buf = io.BytesIO()
                np.save(buf, np.ascontiguousarray(vecs, dtype=np.float32))
                pending["pending"] = buf.getvalue()
                # a search may train the index on its buffer: save this small store locked
                self._save(handle, records, pending, gen)
                return
        # Serialized and written without the lock, so searches go on: FAISS searches only
        # read a trained index, and writers wait (the Retriever saves between their turns).
        self._save(handle, records, pending, gen)

    def _save(
        self, handle: fx.IndexHandle, records: dict[str, Any], pending: dict[str, bytes], gen: int
    ) -> None:
        blobs = {"index": fx.serialize(handle), "records": json_bytes(records), **pending}
        _faiss_files.FILES.commit(self._path, gen, blobs, self._state)  # type: ignore[arg-type]
        with self._lock:
            self._generation = gen
            self._dirty = False

    # ------------------------------------------------------------------ training

    def _flush_pending(self, final: bool) -> None:
        """Untrained index: train once enough vectors are buffered (or ``final``), then add."""
        if not self._pending:
            return
        n = sum(len(v) for _, v in self._pending)
        where = self.location
        if self._handle is None:  # the ivf alias: nlist follows the data size
            if not final and n < fx.POINTS_PER_CENTROID * 256:
                return
            factory = fx.alias_factory("ivf", self.params, n)
            assert factory is not None  # nlist is known once n is given
            self._handle = fx.wrap(fx.make_factory_index(self._dim, factory, where), where)
            self.params["factory"] = factory
            self.params.update(fx.read_parameters(self._handle))
            self.params["nprobe"] = self.params.get("nprobe") or DEFAULTS["nprobe"]
        if not self._handle.is_trained:
            if not final and n < fx.train_target(self._handle.index):
                return
            vecs = np.concatenate([v for _, v in self._pending])
            fx.train(self._handle, vecs[: fx.MAX_TRAIN], where)
            fx.set_search_parameters(self._handle, self.params)
        vecs = np.concatenate([v for _, v in self._pending])
        fids = np.concatenate([f for f, _ in self._pending])
        self._handle.index.add_with_ids(vecs, fids)
        self._pending = []

    def optimize(self) -> None:
        """Train/add what is buffered; for an ANN index, measure recall (and tune to target)."""
        with self._lock:
            if self._pending:
                self._begin_write()
                self._flush_pending(final=True)
                self._dirty = True
            self.measure_recall(target_recall=self.target_recall)

    def _recall_lock(self) -> Any:
        return self._lock

    def _recall_knob(self) -> Any:
        """``efSearch`` of an HNSW index, ``nprobe`` of an IVF one (set through FAISS)."""
        self._ready_for_search()
        handle = self._handle
        if handle is None or self._pending or handle.kind not in ("hnsw", "ivf"):
            return None
        if self._searches_exactly():
            return None  # nothing approximate is searched below exact_below
        name = "ef_search" if handle.kind == "hnsw" else "nprobe"
        if name == "ef_search":
            values: list[int] = list(_ann_recall.HNSW_EF)
        else:
            values = _ann_recall.nprobe_values(int(self.params["nlist"]))

        def set_knob(v: int) -> None:
            self.params[name] = int(v)
            fx.set_search_parameters(handle, self.params)

        return _ann_recall.Knob(name, values, set_knob, int(self.params[name]))

    def _vector_blocks(self, size: int) -> Iterator[tuple[list[str], np.ndarray]]:
        """The vectors as the index holds them (decoded codes of a lossy index), rebuilt by
        FAISS a block at a time under the shared lock (rows deleted meanwhile are left out);
        an untrained buffer is read through the records."""
        self._ready_for_search()
        with self._lock.read():
            if self._pending or self._handle is None:
                fids = None
            else:
                fids = np.fromiter(self._table.row.values(), dtype=np.int64)
        if fids is None:
            yield from super()._vector_blocks(size)
            return
        for start in range(0, len(fids), size):
            with self._lock.read():
                recs = self._table.records
                block = [f for f in fids[start : start + size].tolist() if recs[f] is not None]
                if not block:
                    continue
                ids = [recs[f][0] for f in block]
                vectors = self._handle.index.reconstruct_batch(np.asarray(block, dtype=np.int64))  # type: ignore[union-attr]
            yield ids, vectors

    def _ground_truth(self) -> str:
        if self._handle is not None and self._handle.lossy:
            return "exact inner product over the decoded (compressed) vectors"
        return super()._ground_truth()

    def _recall_search(self, q: np.ndarray, k: int) -> list[list[str]]:
        table = self._table
        _, found = self.raw_search(q, min(k + len(table.tombstones), self._handle.ntotal))  # type: ignore[union-attr]
        return [[r[0] for f in row if (r := table.live(int(f))) is not None][:k] for row in found]

    def _keep_recall(self, recall: dict[str, Any], knob: Any) -> None:
        self.recall = recall
        self._dirty = True  # kept in the state file by the next save

    # ------------------------------------------------------------------ protocol

    def _upsert(self, batch: Batch) -> None:
        ids, arr = batch.ids, batch.vectors
        with self._lock:
            self._begin_write()
            if self._sequential:
                new = [i for i in ids if i not in self._table.row]
                if len(new) != len(ids):
                    raise StoreError(
                        f"{self.location}: an adopted FAISS index with unnamed vectors cannot "
                        "replace them; pass an empty index to get updates"
                    )
            replaced = self._table.fids_of(ids)
            if replaced:
                self._drop_rows(replaced)
            fids = self._table.append(ids, batch.payloads, batch.norms)
            if not self._is_trained():
                self._pending.append((fids, arr))
                self._flush_pending(final=False)
            elif self._sequential:
                self._handle.index.add(arr)  # type: ignore[union-attr]
            else:
                self._handle.index.add_with_ids(arr, fids)  # type: ignore[union-attr]
            self._dirty = True

    def _drop_rows(self, fids: list[int]) -> None:
        """Remove the FAISS ids from the index where it can (flat, IVF), else tombstone them."""
        sel = np.asarray(fids, dtype=np.int64)
        removed = False
        if self._pending:
            for i, (f, v) in enumerate(self._pending):
                keep = ~np.isin(f, sel)
                self._pending[i] = (f[keep], v[keep])
        if self._handle is not None and self._handle.ntotal and not self._sequential:
            try:
                self._handle.index.remove_ids(sel)
                removed = True
            except RuntimeError:
                removed = False  # HNSW: no removal; tombstone instead
        elif self._handle is None or not self._handle.ntotal:
            removed = True
        self._table.drop(fids, tombstone=not removed)

    def _ready_for_search(self) -> None:
        """Train on the buffer when it can be trained; a smaller buffer is searched exactly."""
        if self._pending:
            with self._lock:
                if self._pending and self._trainable():
                    self._flush_pending(final=True)

    def _trainable(self) -> bool:
        n = sum(len(v) for _, v in self._pending)
        if self._handle is None or self._handle.is_trained:
            return n > 0
        return n >= fx.min_train(self._handle.index)

    def _pending_search(self, q: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Exact search over vectors still waiting for training: (FAISS id, score) per query."""
        fids = np.concatenate([f for f, _ in self._pending])
        vecs = np.concatenate([v for _, v in self._pending])
        scores = q @ vecs.T
        rows, _ = top_k(scores, k)
        return [
            [(int(fids[j]), float(row[j])) for j in top]
            for row, top in zip(scores, rows, strict=True)
        ]

    def _vector(self, fid: int) -> np.ndarray:
        for f, v in self._pending:
            hit = np.flatnonzero(f == fid)
            if len(hit):
                return v[int(hit[0])].copy()
        return self._handle.index.reconstruct(int(fid))  # type: ignore[union-attr]

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return (RuntimeError,)  # what FAISS's C++ exceptions become

    def _query(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        self._ready_for_search()
        if self.count() == 0:
            return [[] for _ in range(len(q))]
        with self._lock.read():  # const FAISS searches run side by side
            if self._pending:  # too few vectors to train yet: exact search over the buffer
                rows = self._pending_search(q, k)
            else:
                kk = min(k + len(self._table.tombstones), self._handle.ntotal)  # type: ignore[union-attr]
                scores, fids = self.raw_search(q, kk)
                rows = [
                    [(int(f), float(sc)) for sc, f in zip(srow, frow, strict=True)]
                    for srow, frow in zip(scores, fids, strict=True)
                ]
        out = []
        for row in rows:
            hits: list[StoreHit] = []
            for f, sc in row:
                rec = self._table.live(f)
                if rec is None:
                    continue
                vec = self._vector(f) if with_vectors else None
                hits.append(StoreHit(rec[0], sc, dict(rec[1]), vec, self._norm(f)))
                if len(hits) == k:
                    break
            out.append(hits)
        return out

    def _searches_exactly(self) -> bool:
        """Whether the ANN index holds fewer live vectors than :attr:`exact_below` (and can
        search exactly: see :func:`._faiss_index.exhaustive_search`)."""
        handle = self._handle
        return (
            handle is not None
            and len(self._table.row) < self.exact_below
            and fx.searches_exhaustively(handle)
        )

    def raw_search(self, q: np.ndarray, kk: int) -> tuple[np.ndarray, np.ndarray]:
        """FAISS scores and int64 ids (tombstones included) with the store's thread policy;
        an ANN index below :attr:`exact_below` live vectors answers by its exact search."""
        faiss = fx.faiss_module()
        with self._searches_now.inside() as running:
            # One query is latency-bound: OpenMP fan-out costs more than it saves. A batch
            # beside other searches gets its share of the threads: each fanned out on every
            # core would only wait for the others at its barriers. The OpenMP thread count
            # is per calling thread, so concurrent searches do not disturb each other.
            if len(q) == 1 and self.single_query_threads:
                threads = int(self.single_query_threads)
            else:
                threads = max(1, fx.default_threads() // running)
            faiss.omp_set_num_threads(threads)
            if self._searches_exactly():
                found = fx.exhaustive_search(self._handle, q, max(1, kk))  # type: ignore[arg-type]
                if found is not None:
                    return found
            return self._handle.index.search(q, max(1, kk))  # type: ignore[union-attr]

    def set_search_parameters(
        self, *, ef_search: int | None = None, nprobe: int | None = None
    ) -> None:
        """Change the search-time knobs of an open store (validated; kept by the next save)."""
        where = self.location
        new = {
            "ef_search": registry.check_option("ef_search", ef_search, where),
            "nprobe": registry.check_option("nprobe", nprobe, where),
        }
        self._ready_for_search()
        if self._handle is not None:
            self._check_applicable(self._handle.kind, new)
        with self._lock:
            self.params.update({k: v for k, v in new.items() if v is not None})
            if self._handle is not None:
                fx.set_search_parameters(self._handle, self.params)

    def _norm(self, fid: int) -> float:
        """The stored vector's norm, kept in the record table (records of format 1 lack it)."""
        rec = self._table.records[fid]
        assert rec is not None  # a live record: callers pass ids found by a search
        if len(rec) < 3:
            rec.append(float(np.linalg.norm(self._vector(fid))))
        return float(rec[2])

    def _fetch(self, ids: list[str]) -> Iterable[StoreRecord]:
        self._ready_for_search()
        out = []
        for doc_id in ids:
            fid = self._table.row.get(doc_id)
            if fid is not None:
                rec = self._table.records[fid]
                out.append(StoreRecord(doc_id, self._vector(int(fid)), dict(rec[1])))  # type: ignore[index]
        return out

    def _describe(self) -> dict[str, Any]:
        kind = self._handle.kind if self._handle is not None else self.index_type
        out: dict[str, Any] = {"index": self.index_type, "factory": self.params.get("factory")}
        if kind == "hnsw":
            out.update({k: self.params[k] for k in ("hnsw_m", "ef_construction", "ef_search")})
        elif kind == "ivf":
            out.update({k: self.params[k] for k in ("nlist", "nprobe")})
        if self._handle is not None and self._handle.lossy:
            out["lossy_codes"] = True
        if self._handle is not None and fx.searches_exhaustively(self._handle):
            out.update(_ann_recall.search_mode(len(self._table.row), self.exact_below))
        out["tombstones"] = len(self._table.tombstones)
        out["trained"] = self._is_trained()
        if self._pending:
            out["pending_training"] = int(sum(len(v) for _, v in self._pending))
        if self.recall is not None:
            out["recall"] = self.recall
        return out


# ----------------------------------------------------------------------------- consistency


def _check_records(records: Any, records_file: Path) -> None:
    """The record file's shape: ``[id, payload, ...]`` lists or null, tombstones in range."""
    rows = records.get("records") if isinstance(records, dict) else None
    if not isinstance(rows, list) or any(
        r is not None and not (isinstance(r, list) and len(r) >= 2 and isinstance(r[0], str))
        for r in rows
    ):
        raise StoreError(f"{records_file}: records must be [id, payload, ...] lists or null")
    tombs = records.get("tombstones", [])
    if not isinstance(tombs, list) or any(
        not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < len(rows) for t in tombs
    ):
        raise StoreError(f"{records_file}: tombstones outside the record table")
    pending = records.get("pending", [])
    if not isinstance(pending, list) or any(
        not isinstance(t, int) or not 0 <= t < len(rows) for t in pending
    ):
        raise StoreError(f"{records_file}: pending ids outside the record table")


def _check_consistent(store: FaissStore, index_file: Path, records_file: Path) -> None:
    """Index and record table must describe the same points (checksums only prove that each
    file is what the state file says, not that the two agree with each other)."""
    index, table = store._handle.index, store._table  # type: ignore[union-attr]
    if int(index.d) != store._dim:
        raise StoreError(
            f"{index_file}: index has dimension {index.d}, {STATE_FILE} says {store._dim}"
        )
    live = len(table.row)
    if live != sum(r is not None for r in table.records):
        raise StoreError(f"{records_file}: a document id appears twice")
    pending = sum(len(f) for f, _ in store._pending)
    expected = live + len(table.tombstones) - pending
    if int(index.ntotal) != expected:
        raise StoreError(
            f"{index_file}: index holds {index.ntotal} vectors but {records_file.name} "
            f"describes {expected} ({live} live, {len(table.tombstones)} tombstoned"
            + (f", {pending} waiting for training" if pending else "")
            + "); the two files disagree"
        )


# ----------------------------------------------------------------------------- registry entry

FAISS_OPTIONS = IndexOptions.keywords()


@dataclass(frozen=True)
class AdoptedFaissOptions(StoreOptions):
    """What only an adopted FAISS index takes: where it is saved."""

    path: str | None = option("An adopted FAISS index: the folder it saves to.")


def _open(loc: dict[str, str], dimension: int | None, **options: Any) -> FaissStore:
    return FaissStore.open(loc["path"], dimension, **options)


def _adopt_object(
    obj: Any, collection: str | None, dimension: int | None, path: str | None = None, **opts: Any
) -> FaissStore:
    if dimension is not None and int(obj.d) != int(dimension):
        raise StoreError(
            f"FAISS index has dimension {obj.d}, but the model produces dimension {dimension}"
        )
    return FaissStore(int(obj.d), path, index=obj, **opts)


registry.register(
    registry.Backend(
        form="faiss:DIR",
        open=_open,
        options=(IndexOptions,),
        index_types="flat (exact, default), hnsw, ivf, or any faiss.index_factory string, e.g. "
        "'IVF1024,PQ32' (untrained indexes are trained on the first vectors added)",
        folder=True,
        adopts=("faiss", "", "metric_type"),
        adopt=_adopt_object,
        adopted="a FAISS index with the inner-product metric",
        adopt_options=(AdoptedFaissOptions,),
        extra="faiss",
    )
)
