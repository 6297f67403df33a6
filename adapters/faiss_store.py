"""FAISS by inner product: exact (``IndexFlatIP``), HNSW and IVF, with string ids and payloads.

Layout of a store folder::

    DIR/faiss_store.json      state, written LAST: generation, parameters, checksums, metadata
    DIR/index-<gen>.faiss     the FAISS index (int64 ids = positions in the record table)
    DIR/records-<gen>.json    [[doc_id, payload, doc_norm] or null per int64 id], tombstones

Saving writes a new generation (temp file + fsync + ``os.replace``) and switches
``faiss_store.json`` to it last, so a crash at any point leaves the previous consistent state
loadable; a state file whose checksums do not match its files is reported as half-written.

Rules kept here: the metric is ``METRIC_INNER_PRODUCT`` (an L2 index is refused), the index
stores vectors as given (a normalizing pre-transform is reported by ``normalizes_vectors``
so the Retriever refuses it for magnitude-keeping models), and single-query search runs with
one OpenMP thread (measured faster than two on this machine; see benchmarks/stores.py).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.adapters import registry
from magretrieve.adapters.base import (
    IdMapMixin,
    StoreHit,
    StoreRecord,
    VectorStore,
    atomic_write_bytes,
    atomic_write_json,
    check_batch,
    check_k,
    check_queries,
    plain_file,
    read_state_file,
    require,
    sha256_file,
    state_metadata,
)
from magretrieve.errors import StoreError

logger = logging.getLogger(__name__)

STATE_FILE = "faiss_store.json"
INDEX_TYPES = ("flat", "hnsw", "ivf")
DEFAULTS: dict[str, Any] = {
    "hnsw_m": 32,
    "ef_construction": 200,
    "ef_search": 128,
    "nlist": None,  # IVF: default ~ 4·sqrt(n) at training time
    "nprobe": 16,
}


_DEFAULT_THREADS = 0  # FAISS's OpenMP default for batch search, read on first use


def _faiss() -> Any:
    global _DEFAULT_THREADS
    faiss = require("faiss", "FAISS (faiss-cpu)", "faiss")
    if not _DEFAULT_THREADS:
        _DEFAULT_THREADS = max(1, faiss.omp_get_max_threads())
    return faiss


def _metric_name(faiss: Any, metric: int) -> str:
    names = {faiss.METRIC_INNER_PRODUCT: "inner_product", faiss.METRIC_L2: "L2"}
    return names.get(metric, f"faiss metric {metric}")


def inspect_index(index: Any) -> dict[str, Any]:
    """Metric, normalization and kind of a FAISS index object (unwrapping ID maps/transforms)."""
    faiss = _faiss()
    index = faiss.downcast_index(index)
    normalizes = False
    core = index
    while True:
        if isinstance(core, faiss.IndexPreTransform):
            for i in range(core.chain.size()):
                vt = faiss.downcast_VectorTransform(core.chain.at(i))
                if isinstance(vt, faiss.NormalizationTransform):
                    normalizes = True
            core = faiss.downcast_index(core.index)
        elif isinstance(core, (faiss.IndexIDMap, faiss.IndexIDMap2)):
            core = faiss.downcast_index(core.index)
        else:
            break
    if isinstance(core, faiss.IndexHNSW):
        kind = "hnsw"
    elif isinstance(core, faiss.IndexIVF):
        kind = "ivf"
    elif isinstance(core, faiss.IndexFlat):
        kind = "flat"
    else:
        kind = type(core).__name__
    return {
        "metric": _metric_name(faiss, index.metric_type),
        "normalizes": normalizes,
        "kind": kind,
        "core": core,
    }


class FaissStore(IdMapMixin, VectorStore):
    """A FAISS index plus a record table (string id + payload per int64 FAISS id).

    Deletion and replacement use ``remove_ids`` where the index supports it (flat, IVF) and
    tombstones otherwise (HNSW: a deleted id is filtered out of results, and searches ask
    FAISS for ``k + tombstones`` candidates so ``k`` live hits come back).
    """

    kind = "faiss"
    thread_safe_search = True  # FAISS const search is thread-safe; params are per call

    def __init__(
        self,
        dimension: int,
        path: str | Path | None = None,
        *,
        index_type: str = "flat",
        hnsw_m: int | None = None,
        ef_construction: int | None = None,
        ef_search: int | None = None,
        nlist: int | None = None,
        nprobe: int | None = None,
        index: Any = None,
        single_query_threads: int | None = 1,
    ) -> None:
        faiss = _faiss()
        self._dim = int(dimension)
        self._path = Path(path) if path is not None else None
        self._lock = threading.RLock()
        self._records: list[list[Any] | None] = []  # FAISS id -> [doc_id, payload] | None
        self._row: dict[str, int] = {}
        self._tombstones: set[int] = set()
        self._meta: dict[str, Any] | None = None
        self._generation = 0
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []  # IVF vectors before training
        self._sequential = False  # adopted plain index: FAISS ids are positions
        self._kind_cache: tuple[int, str] | None = None
        self.single_query_threads = single_query_threads
        self.params: dict[str, Any] = {
            "hnsw_m": hnsw_m,
            "ef_construction": ef_construction,
            "ef_search": ef_search,
            "nlist": nlist,
            "nprobe": nprobe,
        }
        for key, default in DEFAULTS.items():
            if self.params[key] is None:
                self.params[key] = default
        if index is not None:
            self._index = self._adopt(index)
        else:
            self._index = self._build(index_type)
        if self._index is not None and self._index.d != self._dim:
            raise StoreError(
                f"{self.location}: FAISS index has dimension {self._index.d}, "
                f"but dimension {self._dim} was asked for"
            )
        self._faiss = faiss

    # ------------------------------------------------------------------ construction

    def _build(self, index_type: str) -> Any:
        faiss = _faiss()
        kind = index_type.lower()
        d, ip = self._dim, faiss.METRIC_INNER_PRODUCT
        if kind == "flat":
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(d))
        elif kind == "hnsw":
            hnsw = faiss.IndexHNSWFlat(d, int(self.params["hnsw_m"]), ip)
            hnsw.hnsw.efConstruction = int(self.params["ef_construction"])
            hnsw.hnsw.efSearch = int(self.params["ef_search"])
            index = faiss.IndexIDMap2(hnsw)
        elif kind == "ivf":
            index = None  # built at training time, when nlist can follow the data size
        else:
            try:
                index = faiss.index_factory(d, index_type, ip)
            except RuntimeError as exc:
                raise StoreError(
                    f"unknown FAISS index type {index_type!r}: use flat, hnsw, ivf or a "
                    f"faiss.index_factory string ({str(exc).splitlines()[0]})"
                ) from None
            index = self._adopt(index)
            kind = "factory"
            self.params["factory"] = index_type
        self.index_type = kind
        return index

    def _adopt(self, index: Any) -> Any:
        """Accept an existing FAISS index object after checking its metric."""
        faiss = _faiss()
        info = inspect_index(index)
        if info["metric"] != "inner_product":
            raise StoreError(
                f"FAISS index uses metric {info['metric']}; magretrieve stores are searched by "
                "inner product (METRIC_INNER_PRODUCT). An L2 index would rank by distance and "
                "ignore the magnitude the model keeps"
            )
        self._normalizes = info["normalizes"]
        self.index_type = getattr(self, "index_type", info["kind"])
        core = info["core"]
        if info["kind"] == "hnsw":  # report the adopted index's own settings
            self.params["hnsw_m"] = int(core.hnsw.nb_neighbors(1))
            self.params["ef_construction"] = int(core.hnsw.efConstruction)
            self.params["ef_search"] = int(core.hnsw.efSearch)
        elif info["kind"] == "ivf":
            self.params["nlist"], self.params["nprobe"] = int(core.nlist), int(core.nprobe)
        index = faiss.downcast_index(index)
        if not index.is_trained:
            raise StoreError("the FAISS index object is not trained; train it before passing it")
        if isinstance(index, (faiss.IndexIDMap, faiss.IndexIDMap2)):
            if index.ntotal > 0:
                raise StoreError(
                    "a non-empty FAISS ID-map index cannot be adopted (its int64 ids have no "
                    "string ids or payloads); pass an empty index or one without an ID map"
                )
        elif isinstance(index, faiss.IndexIVF):
            index.set_direct_map_type(faiss.DirectMap.Hashtable)
            if index.ntotal > 0:
                raise StoreError("a non-empty FAISS IVF index cannot be adopted; pass it empty")
        elif index.ntotal == 0:
            index = faiss.IndexIDMap2(index)
        else:
            # vectors without a record table: ids "0".."n-1" (FAISS's own sequential ids)
            logger.warning(
                "adopting a FAISS index with %d unnamed vectors; their ids are '0'..'%d'",
                index.ntotal,
                index.ntotal - 1,
            )
            norms = np.linalg.norm(index.reconstruct_n(0, index.ntotal), axis=1)
            self._records = [[str(i), {}, float(norms[i])] for i in range(index.ntotal)]
            self._row = {str(i): i for i in range(index.ntotal)}
            self._sequential = True
        return index

    @property
    def dimension(self) -> int:
        return self._dim

    @property
    def location(self) -> str:
        return f"faiss:{self._path}" if self._path else "faiss:(in memory)"

    @property
    def normalizes_vectors(self) -> bool:
        return bool(getattr(self, "_normalizes", False))

    @property
    def index(self) -> Any:
        """The underlying FAISS index object."""
        return self._index

    # ------------------------------------------------------------------ load / save

    @classmethod
    def open(cls, path: str | Path, dimension: int | None = None, **options: Any) -> FaissStore:
        """Open the store in ``path`` or create an empty one there (needs ``dimension``)."""
        path = Path(path)
        state_file = path / STATE_FILE
        if not state_file.is_file():
            if any(path.glob("index-*.faiss")) or any(path.glob("records-*.json")):
                raise StoreError(
                    f"{path}: index files without {STATE_FILE}: a save was interrupted before "
                    "its first commit; delete the folder and re-index"
                )
            if dimension is None:
                raise StoreError(f"{path}: no FAISS store here; pass a dimension to create one")
            return cls(int(dimension), path, **options)
        return cls._load(path, dimension, **options)

    @classmethod
    def _load(cls, path: Path, dimension: int | None, **options: Any) -> FaissStore:
        state = read_state_file(path / STATE_FILE, "magretrieve-faiss-store", "FAISS")
        try:
            if state.get("index_file") is None:
                return cls._load_empty(path, state, dimension, **options)
            return cls._load_state(path, state, dimension, **options)
        except (KeyError, TypeError, ValueError, AttributeError, RuntimeError) as exc:
            # a state or record file with the right checksums but wrong content, or a file
            # FAISS cannot parse: never a traceback, always the file at fault
            raise StoreError(
                f"{path / STATE_FILE}: malformed store ({type(exc).__name__}: {exc})"
            ) from None

    @classmethod
    def _load_state(
        cls, path: Path, state: dict[str, Any], dimension: int | None, **options: Any
    ) -> FaissStore:
        faiss = _faiss()
        files = {
            "index": plain_file(path, state["index_file"], STATE_FILE),
            "records": plain_file(path, state["records_file"], STATE_FILE),
        }
        for key, f in files.items():
            if not f.is_file():
                raise StoreError(f"{f}: missing (the store in {path} is incomplete)")
            if sha256_file(f) != state[f"{key}_sha256"]:
                raise StoreError(
                    f"{f}: does not match the checksum in {STATE_FILE} (half-written or modified)"
                )
        if dimension is not None and int(dimension) != int(state["dimension"]):
            raise StoreError(
                f"{path}: store has dimension {state['dimension']}, "
                f"but the model produces dimension {dimension}"
            )
        params = dict(state["parameters"])
        # search-time knobs may be overridden when opening; build-time ones come from disk
        for key in ("ef_search", "nprobe"):
            if options.get(key) is not None:
                params[key] = options[key]
        store = cls.__new__(cls)
        store._dim = int(state["dimension"])
        store._path = path
        store._lock = threading.RLock()
        store._faiss = faiss
        store._pending = []
        store._kind_cache = None
        store.single_query_threads = options.get("single_query_threads", 1)
        store.params = params
        store.index_type = state["index_type"]
        store._generation = int(state["generation"])
        store._meta = state_metadata(state, str(path / STATE_FILE))
        store._index = faiss.read_index(str(files["index"]))
        store._sequential = bool(state.get("sequential", False))
        info = inspect_index(store._index)
        store._normalizes = info["normalizes"]
        if info["metric"] != "inner_product":
            raise StoreError(f"{files['index']}: metric {info['metric']} is not inner product")
        if isinstance(info["core"], faiss.IndexIVF):
            info["core"].set_direct_map_type(faiss.DirectMap.Hashtable)
        records = json.loads(files["records"].read_text())
        store._records = records["records"]
        store._tombstones = set(records["tombstones"])
        store._row = {r[0]: n for n, r in enumerate(store._records) if r is not None}
        cls._check_consistent(store, files)
        for key, opt in (("hnsw_m", "hnsw_m"), ("ef_construction", "ef_construction")):
            if options.get(opt) is not None and options[opt] != params.get(key):
                logger.warning(
                    "%s: %s=%s ignored; the existing index was built with %s",
                    path,
                    opt,
                    options[opt],
                    params.get(key),
                )
        return store

    @staticmethod
    def _check_consistent(store: FaissStore, files: dict[str, Path]) -> None:
        """Index and record table must describe the same points (checksums only prove that
        each file is what the state file says, not that the two agree with each other)."""
        index, records = store._index, store._records
        if int(index.d) != store._dim:
            raise StoreError(
                f"{files['index']}: index has dimension {index.d}, {STATE_FILE} says {store._dim}"
            )
        if not isinstance(records, list) or any(
            r is not None and not (isinstance(r, list) and len(r) >= 2 and isinstance(r[0], str))
            for r in records
        ):
            raise StoreError(
                f"{files['records']}: records must be [id, payload, ...] lists or null"
            )
        if any(not isinstance(t, int) or not 0 <= t < len(records) for t in store._tombstones):
            raise StoreError(f"{files['records']}: tombstones outside the record table")
        live = len(store._row)
        if len(store._row) != sum(r is not None for r in records):
            raise StoreError(f"{files['records']}: a document id appears twice")
        expected = live + len(store._tombstones)
        if int(index.ntotal) != expected:
            raise StoreError(
                f"{files['index']}: index holds {index.ntotal} vectors but "
                f"{files['records'].name} describes {expected} ({live} live, "
                f"{len(store._tombstones)} tombstoned); the two files disagree"
            )

    @classmethod
    def _load_empty(
        cls, path: Path, state: dict[str, Any], dimension: int | None, **options: Any
    ) -> FaissStore:
        """Generation 0: the store was created but its first save never completed."""
        if dimension is not None and int(dimension) != int(state["dimension"]):
            raise StoreError(
                f"{path}: store has dimension {state['dimension']}, "
                f"but the model produces dimension {dimension}"
            )
        params = {k: v for k, v in dict(state["parameters"]).items() if k in DEFAULTS}
        params.update({k: options[k] for k in ("ef_search", "nprobe") if options.get(k)})
        kind = state["index_type"]
        index_type = state["parameters"].get("factory", kind) if kind == "factory" else kind
        store = cls(int(state["dimension"]), path, index_type=index_type, **params)
        store._meta = state_metadata(state, str(path / STATE_FILE))
        return store

    def _state(self, index_name: str | None, records_name: str | None, gen: int) -> dict[str, Any]:
        assert self._path is not None
        return {
            "format": "magretrieve-faiss-store",
            "format_version": 1,
            "generation": gen,
            "dimension": self._dim,
            "metric": "inner_product",
            "index_type": self.index_type,
            "sequential": self._sequential,
            "parameters": self.params,
            "count": self.count() if index_name else 0,
            "index_file": index_name,
            "records_file": records_name,
            "index_sha256": sha256_file(self._path / index_name) if index_name else None,
            "records_sha256": sha256_file(self._path / records_name) if records_name else None,
            "metadata": self._meta,
        }

    def persist(self) -> None:
        """Save a new generation atomically; the state file is switched last."""
        if self._path is None:
            return
        faiss = self._faiss
        with self._lock:
            self._flush_pending(final=True)
            self._path.mkdir(parents=True, exist_ok=True)
            if not (self._path / STATE_FILE).is_file():
                # commit an empty generation 0 first: a crash during the first real save then
                # leaves a store that reopens (empty) and resumes, instead of orphan files
                atomic_write_json(self._path / STATE_FILE, self._state(None, None, 0))
            gen = self._generation + 1
            index_name, records_name = f"index-{gen}.faiss", f"records-{gen}.json"
            atomic_write_bytes(
                self._path / index_name, faiss.serialize_index(self._index).tobytes()
            )
            atomic_write_bytes(
                self._path / records_name,
                json.dumps(
                    {"records": self._records, "tombstones": sorted(self._tombstones)}
                ).encode(),
            )
            atomic_write_json(self._path / STATE_FILE, self._state(index_name, records_name, gen))
            self._generation = gen
            # older generations, and temp files of saves a crash interrupted
            for stale in [
                *self._path.glob("index-*.faiss"),
                *self._path.glob("records-*.json"),
                *self._path.glob(".index-*.tmp"),
                *self._path.glob(".records-*.tmp"),
                *self._path.glob(f".{STATE_FILE}.*.tmp"),
            ]:
                if stale.name not in (index_name, records_name):
                    stale.unlink(missing_ok=True)

    # ------------------------------------------------------------------ IVF training

    def _build_ivf(self, train: np.ndarray) -> Any:
        faiss = self._faiss
        n = train.shape[0]
        nlist = self.params["nlist"] or max(1, min(int(4 * np.sqrt(n)), n // 39 or 1))
        if n < nlist:
            raise StoreError(
                f"{self.location}: IVF with nlist={nlist} needs at least {nlist} vectors to "
                f"train, got {n}; add more documents or lower --nlist"
            )
        self.params["nlist"] = int(nlist)
        quantizer = faiss.IndexFlatIP(self._dim)
        ivf = faiss.IndexIVFFlat(quantizer, self._dim, int(nlist), faiss.METRIC_INNER_PRODUCT)
        ivf.train(train)
        ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
        ivf.nprobe = int(self.params["nprobe"])
        return ivf

    def _flush_pending(self, final: bool) -> None:
        """IVF: train once enough vectors are buffered (or at save/search) and add them."""
        if self._index is not None or not self._pending:
            return
        n = sum(len(v) for _, v in self._pending)
        target = 39 * (self.params["nlist"] or 256)
        if not final and n < target:
            return
        vecs = np.concatenate([v for _, v in self._pending])
        fids = np.concatenate([f for f, _ in self._pending])
        self._index = self._build_ivf(vecs)
        self._index.add_with_ids(vecs, fids)
        self._pending = []

    def optimize(self) -> None:
        with self._lock:
            self._flush_pending(final=True)

    # ------------------------------------------------------------------ protocol

    def add(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        payloads: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        ids, arr, plist = check_batch(ids, vectors, payloads, self._dim, self.location)
        if not ids:
            return 0
        with self._lock:
            replaced = [self._row[i] for i in ids if i in self._row]
            if replaced:
                self._remove_fids(replaced)
            start = len(self._records)
            fids = np.arange(start, start + len(ids), dtype=np.int64)
            if self._index is None:
                self._pending.append((fids, arr))
            elif self._sequential:
                self._index.add(arr)  # plain index: FAISS ids are positions, as ours are
            else:
                self._index.add_with_ids(arr, fids)
            norms = np.linalg.norm(arr, axis=1)
            for doc_id, payload, fid, norm in zip(ids, plist, fids, norms, strict=True):
                self._records.append([doc_id, payload, float(norm)])
                self._row[doc_id] = int(fid)
            self._flush_pending(final=False)
        return len(ids)

    def _remove_fids(self, fids: list[int]) -> None:
        sel = np.asarray(fids, dtype=np.int64)
        removed = False
        if self._index is None:
            for i, (f, v) in enumerate(self._pending):
                keep = ~np.isin(f, sel)
                self._pending[i] = (f[keep], v[keep])
            removed = True
        elif not self._sequential:
            try:
                self._index.remove_ids(sel)
                removed = True
            except RuntimeError:
                removed = False  # HNSW: no removal; tombstone instead
        for fid in fids:
            rec = self._records[fid]
            if rec is not None:
                self._row.pop(rec[0], None)
            self._records[fid] = None
            if not removed:
                self._tombstones.add(int(fid))

    def delete(self, ids: Sequence[str]) -> int:
        with self._lock:
            fids = [self._row[i] for i in ids if i in self._row]
            if fids:
                self._remove_fids(fids)
            return len(fids)

    def count(self) -> int:
        return len(self._row)

    def _search_params(self) -> Any:
        faiss = self._faiss
        if self._kind_cache is None or self._kind_cache[0] != id(self._index):
            self._kind_cache = (id(self._index), inspect_index(self._index)["kind"])
        kind = self._kind_cache[1]
        if self.index_type == "factory":
            return None  # a factory chain keeps the search settings it was given
        if kind == "hnsw":
            return faiss.SearchParametersHNSW(efSearch=int(self.params["ef_search"]))
        if kind == "ivf":
            return faiss.SearchParametersIVF(nprobe=int(self.params["nprobe"]))
        return None

    def search(
        self, queries: np.ndarray, k: int, *, with_vectors: bool = True
    ) -> list[list[StoreHit]]:
        q = check_queries(queries, self._dim, self.location)
        k = check_k(k)
        if self._pending:
            with self._lock:
                self._flush_pending(final=True)
        if self._index is None or self.count() == 0:
            return [[] for _ in range(len(q))]
        faiss = self._faiss
        kk = min(k + len(self._tombstones), self._index.ntotal)
        params = self._search_params()
        # One query is latency-bound: OpenMP fan-out costs more than it saves. The OpenMP
        # thread count is per calling thread, so concurrent searches do not disturb each other.
        if len(q) == 1 and self.single_query_threads:
            faiss.omp_set_num_threads(int(self.single_query_threads))
        else:
            faiss.omp_set_num_threads(_DEFAULT_THREADS)
        scores, fids = self._index.search(q, kk, params=params)
        out = []
        for srow, frow in zip(scores, fids, strict=True):
            hits: list[StoreHit] = []
            for s, f in zip(srow, frow, strict=True):
                if f < 0 or f in self._tombstones:
                    continue
                rec = self._records[f]
                if rec is None:
                    continue
                vec = self._index.reconstruct(int(f)) if with_vectors else None
                hits.append(StoreHit(rec[0], float(s), dict(rec[1]), vec, self._norm(int(f))))
                if len(hits) == k:
                    break
            out.append(hits)
        return out

    def _norm(self, fid: int) -> float:
        """The stored vector's norm, kept in the record table (records of format 1 lack it)."""
        rec = self._records[fid]
        if len(rec) < 3:
            rec.append(float(np.linalg.norm(self._index.reconstruct(fid))))
        return float(rec[2])

    def get(self, ids: Sequence[str]) -> list[StoreRecord | None]:
        if self._pending:
            with self._lock:
                self._flush_pending(final=True)
        out: list[StoreRecord | None] = []
        for doc_id in ids:
            fid = self._row.get(doc_id)
            if fid is None:
                out.append(None)
                continue
            rec = self._records[fid]
            out.append(StoreRecord(doc_id, self._index.reconstruct(int(fid)), dict(rec[1])))
        return out

    def parameters(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index_type}
        if self.index_type == "hnsw":
            out.update({k: self.params[k] for k in ("hnsw_m", "ef_construction", "ef_search")})
        elif self.index_type == "ivf":
            out.update({k: self.params[k] for k in ("nlist", "nprobe")})
        elif self.index_type == "factory":
            out["factory"] = self.params.get("factory")
        out["tombstones"] = len(self._tombstones)
        return out


# ----------------------------------------------------------------------------- registry entry

FAISS_OPTIONS = (
    "index_type",
    "hnsw_m",
    "ef_construction",
    "ef_search",
    "nlist",
    "nprobe",
)


def _open(loc: dict[str, str], dimension: int | None, options: dict[str, Any]) -> FaissStore:
    return FaissStore.open(loc["path"], dimension, **options)


def _adopts(obj: Any) -> bool:
    return (type(obj).__module__ or "").startswith("faiss") and hasattr(obj, "metric_type")


def _adopt_object(
    obj: Any, dimension: int | None, collection: str | None, options: dict[str, Any]
) -> FaissStore:
    options = dict(options)
    path = options.pop("path", None)
    opts = registry.check_options(registry.backend_for("faiss:x")[0], options, "FAISS index")
    if dimension is not None and int(obj.d) != int(dimension):
        raise StoreError(
            f"FAISS index has dimension {obj.d}, but the model produces dimension {dimension}"
        )
    return FaissStore(int(obj.d), path, index=obj, **opts)


registry.register(
    registry.Backend(
        prefix="faiss",
        form="faiss:DIR",
        parse=registry.parse_dir,
        open=_open,
        options=FAISS_OPTIONS,
        folder=True,
        adopts=_adopts,
        adopt=_adopt_object,
        extra="faiss",
        examples=lambda tmp: [
            registry.Example("faiss-flat", f"faiss:{tmp / 'faiss'}"),
            registry.Example(
                "faiss-hnsw", f"faiss:{tmp / 'faiss-hnsw'}", {"index_type": "hnsw"}, exact=False
            ),
            registry.Example(
                "faiss-ivf",
                f"faiss:{tmp / 'faiss-ivf'}",
                {"index_type": "ivf", "nlist": 4},
                exact=False,
            ),
        ],
    )
)
