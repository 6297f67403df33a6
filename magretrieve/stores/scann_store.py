"""Google ScaNN by dot product in a folder: ``scann:DIR``, exact until an index pays off.

ScaNN partitions the vectors with a k-means tree, scores the leaves a query visits with
anisotropic vector quantization (``score_ah``: 2 dimensions per block, threshold 0.2, the
quantization built for inner-product search) and re-scores the best candidates exactly
(``reorder``). The metric is always ``dot_product``; vectors are stored as given, never
normalized.

How the store uses it:

- the store keeps its own record table (id, payload, norm per row) and the float32 vectors,
  so every answer is re-scored exactly and ``get`` returns the vectors as added;
- ``optimize()`` (after a bulk load) builds the searcher over every live vector once the store
  holds ``exact_below`` vectors or more, then measures its recall@10 against exact search
  (tuning ``leaves_to_search`` to ``target_recall`` when one is given); smaller stores, and
  every store before its first ``optimize()``, are searched exactly;
- vectors added after a build wait in a pending region searched exactly and merged with
  ScaNN's answers; deleted or replaced rows of the built region are tombstones, filtered out
  (ScaNN is asked for ``k`` + tombstones). The next ``optimize()`` folds both into a rebuild.
  ScaNN's own ``upsert``/``delete`` are not used: delete moves the last row into the hole, and
  the searcher keeps its string ids in a pickle, which this store never loads;
- the folder holds generations switched by one atomic state write (below), and a second
  writer process gets a one-line error (:mod:`._writer_lock`).

Layout of a store folder::

    DIR/scann_store.json    state, written LAST: generation, options, recall, metadata, checksums,
                            vectors_from (the first row kept in vectors-<gen>.npy)
    DIR/records-<gen>.json  [[doc_id, payload, doc_norm] or null per row], tombstones, built rows
    DIR/vectors-<gen>.npy   float32 vectors of rows vectors_from.. of the record table
    DIR/scann-<gen>/        ScaNN's serialized searcher over rows 0..built-1 (when built)

Each vector is on disk once. A searcher's folder holds ScaNN's ``dataset.npy``: the float32
vectors it was built from (for its reorder), which are rows 0..built-1 in order. So with a
searcher ``vectors_from`` is ``built`` and the vectors file holds the pending rows only; a load
takes the built rows from the checksummed ``dataset.npy`` (memory-mapped copy-on-write, so
nothing written to them reaches the file). Without a searcher, or in a state file that has no
``vectors_from``, the vectors file holds every row.

A crash at any point leaves the previous generation loadable: new files are written under new
names (temp file + fsync + rename; the searcher into a temp folder renamed when complete) and
the state file is switched last; a file that does not match its checksum is reported as
half-written, and files of an interrupted save are removed by the next one.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import mmap
import os
import re
import shutil
import sys
import tempfile
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.extras import require
from magretrieve.core.files import sha256_file
from magretrieve.core.locks import RWLock
from magretrieve.core.options import option
from magretrieve.core.topk import exact_search
from magretrieve.stores import _ann_recall, registry
from magretrieve.stores._generation import GenerationFiles, SavedGenerations
from magretrieve.stores._record_table import RecordTable, RecordTableMixin, json_bytes
from magretrieve.stores._scann_kernels import ensure_avx2
from magretrieve.stores._writer_lock import WriterLock
from magretrieve.stores.base import (
    Batch,
    StoreHit,
    StoreRecord,
    VectorStore,
    fsync_dir,
    missing_store,
    new_store_id,
    plain_file,
    reading_store,
    state_metadata,
    state_store_id,
)
from magretrieve.stores.options import RecallOptions, StoreOptions, check_dimension

logger = logging.getLogger(__name__)

STATE_FILE = "scann_store.json"
FORMAT = "magretrieve-scann-store"
FORMAT_VERSION = 1
#: Store sizes below this are searched exactly by default (no searcher is built).
EXACT_BELOW = 20_000
#: Candidates ScaNN re-scores exactly before answering (``pre_reorder_num_neighbors``).
REORDER = 100
#: Tuning doubles ``reorder`` up to this many times while the target needs every leaf: AH
#: scores are approximate, and once too few candidates are re-scored exactly no number of
#: leaves makes up for it (the k-means tree then only costs time).
REORDER_DOUBLINGS = 5
#: Share of the leaves searched until measured otherwise (``leaves_to_search`` unset).
LEAVES_SEARCHED = 0.1
MAX_TRAINING_SAMPLE = 250_000
#: Anisotropic quantization: dimensions per block and the noise-shaping threshold.
AH_DIMS, AH_THRESHOLD = 2, 0.2
#: Batches of at least this many queries use ScaNN's thread pool.
PARALLEL_BATCH = 64
#: A ScaNN searcher's file that loads a pickle (its string ids): never read by this store.
PICKLE_FILE = "scann_docids.pkl"
#: A ScaNN searcher's float32 vectors (rows 0..built-1 in order): the store's built rows.
DATASET_FILE = "dataset.npy"
#: Log lines of ScaNN's C++ core (absl): kept out of the terminal during builds and loads.
_NATIVE_LOG = re.compile(r"^([IW]\d{4} |WARNING: All log messages before absl)")


def scann_ops() -> Any:
    """ScaNN's pybind module (its AVX2 kernels on where the CPU has them, see
    :mod:`._scann_kernels`), or a one-line StoreError naming the extra that installs it."""
    require("scann")
    ops = require("scann.scann_ops.py.scann_ops_pybind")
    ensure_avx2()
    return ops


@contextlib.contextmanager
def _native_quiet() -> Iterator[None]:
    """Hold back ScaNN's C++ INFO/WARNING log lines (written straight to fd 2); other output
    written to stderr meanwhile is passed on afterwards."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no usable fd 2 (embedded interpreters): leave it alone
        yield
        return
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            kept = [
                line
                for line in sink.read().decode(errors="replace").splitlines(keepends=True)
                if not _NATIVE_LOG.match(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))


def default_leaves(n: int) -> int:
    """Leaves of the k-means tree for ``n`` vectors: about √n."""
    return max(1, round(math.sqrt(n)))


FILES = GenerationFiles(
    STATE_FILE,
    FORMAT,
    "ScaNN",
    {"records": "records-{gen}.json", "vectors": "vectors-{gen}.npy"},
    folders={"scann": "scann-{gen}"},
)


class ScannStore(SavedGenerations, RecordTableMixin, VectorStore):
    """Record table + float32 vectors + (after ``optimize``) a ScaNN searcher over them.

    Row ``r`` of the record table is row ``r`` of the vectors; rows ``0..built-1`` are the
    rows the searcher was built over (ScaNN answers row numbers), rows from ``built`` on are
    pending (searched exactly). The two parts are kept apart: the built rows never change until
    the next build (a reopened store maps them from the searcher's dataset file), and the
    pending rows grow in memory on their own, so a write never copies the built rows (at a
    million vectors that copy read 1.5 GB while holding the store's lock, and doubled the
    memory the vectors take).
    """

    kind = "scann"
    #: searches share the store lock; optimize() swaps the searcher holding it alone
    thread_safe_search = True
    #: the save compacts under the store lock, then writes without it
    persists_beside_search = True
    _files = FILES
    _lock: RWLock
    _kept_on_catch_up = ("_writer", "target_recall")
    _path: Path

    def __init__(
        self,
        dimension: int,
        path: str | Path,
        *,
        num_leaves: int | None = None,
        leaves_to_search: int | None = None,
        reorder: int | None = None,
        exact_below: int | None = None,
        target_recall: float | None = None,
        state: dict[str, Any] | None = None,
    ) -> None:
        """A new store in ``path``, or the one whose ``state`` :meth:`open` read there (the
        options given then replace the recorded ones for the next build and search)."""
        self._path = Path(path)
        where = self.location
        dim = check_dimension(dimension, where)
        given = {
            "num_leaves": registry.check_option("num_leaves", num_leaves, where),
            "leaves_to_search": registry.check_option("leaves_to_search", leaves_to_search, where),
            "reorder": registry.check_option("reorder", reorder, where),
            "exact_below": registry.check_option("exact_below", exact_below, where),
        }
        if state is None:
            params = {**given, "reorder": given["reorder"] or REORDER}
            if params["exact_below"] is None:
                params["exact_below"] = EXACT_BELOW
        else:
            params = dict(state["parameters"])
            params.update({k: v for k, v in given.items() if v is not None})
        self._init_common(dim, self._path, params, target_recall)
        if state is not None:
            self._load(state)

    def _init_common(
        self, dim: int, path: Path, params: dict[str, Any], target_recall: float | None
    ) -> None:
        self.target_recall = registry.check_option("target_recall", target_recall, self.location)
        self._dim = dim
        self._path = path
        self.params = params
        self._lock = RWLock()  # searches and scans share it; changes take it alone
        self._table = RecordTable()
        self._built_vecs = np.zeros((0, dim), dtype=np.float32)  # rows 0..built-1
        self._tail = np.zeros((0, dim), dtype=np.float32)  # rows built..; capacity may be more
        self._meta: dict[str, Any] | None = None
        self._searcher: Any = None
        self._file_rows: _FileRows | None = None  # built rows mapped from the dataset file
        self._built = 0  # rows 0..built-1 are in the searcher
        self._index: dict[str, Any] | None = None  # num_leaves, training sample of the build
        self._scann_files: dict[str, Any] | None = None  # the saved searcher, when saved
        self._pending_rows: np.ndarray | None = None  # cache of live rows >= built
        self.recall: dict[str, Any] | None = None
        self._generation = 0
        self._store_id = new_store_id()  # a folder loaded later keeps its recorded id
        self._dirty = False
        self._writer = WriterLock(path, self.location)

    # ------------------------------------------------------------------ properties

    @property
    def location(self) -> str:
        return f"scann:{self._path}"

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return (RuntimeError,)  # what ScaNN's C++ errors become

    # ------------------------------------------------------------------ open / load

    @classmethod
    def open(cls, path: str | Path, dimension: int | None = None, **options: Any) -> ScannStore:
        """Open the store in ``path`` or create an empty one there (needs ``dimension``)."""
        path = Path(path)
        where = f"scann:{path}"
        if path.exists() and not path.is_dir():
            raise StoreError(f"{where}: {path} is a file, not a folder")
        unknown = sorted(set(options) - set(OPTION_NAMES))
        if unknown:
            raise StoreError(f"{where}: option(s) {unknown} do not apply to scann stores")
        checked = {
            k: registry.check_option(k, v, where) for k, v in options.items() if v is not None
        }
        scann_ops()  # a missing extra is refused before anything is created
        if not FILES.has_state(path):
            FILES.check_no_orphans(path)
            if dimension is None:
                raise missing_store(str(path), "ScaNN store")
            return cls(int(dimension), path, **checked)
        with reading_store(path / STATE_FILE, OSError):
            return cls._from_state(path, dimension, checked)

    @classmethod
    def _from_state(cls, path: Path, dimension: int | None, options: dict[str, Any]) -> ScannStore:
        state = FILES.read_state(path)
        dim = int(state["dimension"])
        if dimension is not None and int(dimension) != dim:
            raise StoreError(
                f"{path}: store has dimension {dim}, but the model produces dimension {dimension}"
            )
        return cls(dim, path, state=state, **options)

    def _load(self, state: dict[str, Any]) -> None:
        """Take the records, vectors and searcher of the saved generation ``state`` names."""
        path, dim = self._path, self._dim
        self._generation = int(state["generation"])
        self._store_id = state_store_id(state.get("store_id"))
        self._meta = state_metadata(state, str(path / STATE_FILE))
        self.recall = state.get("recall")
        if state.get("records_file") is None:  # generation 0: created, nothing saved yet
            return
        records_file = FILES.checked(path, state, "records")
        vectors_file = FILES.checked(path, state, "vectors")
        records = json.loads(records_file.read_text())
        rows = records["records"]
        if not isinstance(rows, list) or any(
            r is not None
            and not (
                isinstance(r, list)
                and len(r) == 3
                and isinstance(r[0], str)
                and isinstance(r[2], (int, float))
            )
            for r in rows
        ):
            raise StoreError(f"{records_file}: records must be [id, payload, norm] lists or null")
        self._table = RecordTable.from_json(records)
        if len(self._table.row) != sum(r is not None for r in rows):
            raise StoreError(f"{records_file}: a document id appears twice")
        self._built = int(records.get("built", 0))
        m = len(self._table.records)
        if not 0 <= self._built <= m or any(t >= self._built for t in self._table.tombstones):
            raise StoreError(f"{records_file}: built rows or tombstones outside the table")
        rows_from = _vectors_from(path, state, self._built)
        saved = _read_vectors(vectors_file, records_file.name, m, rows_from, dim)
        self._built_vecs, self._tail = (
            saved[: self._built - rows_from],
            saved[self._built - rows_from :],
        )
        if state.get("scann_dir") is not None:
            self._index = dict(state["index"])
            self._scann_files = {"dir": state["scann_dir"], "sha256": state["scann_sha256"]}
            built_rows = _dataset_rows(path, state, self._built, dim) if rows_from else None
            self._searcher = _load_searcher(path, state)
            if int(self._searcher.size()) != self._built:
                raise StoreError(
                    f"{path / state['scann_dir']}: searcher holds {self._searcher.size()} "
                    f"vectors, {records_file.name} says {self._built}; the files disagree"
                )
            if built_rows is not None:
                self._built_vecs = built_rows
                self._file_rows = _FileRows.of(built_rows)
        elif self._built:
            raise StoreError(f"{records_file}: {self._built} built rows but no ScaNN searcher")

    # ------------------------------------------------------------------ save

    def _state(self, files: dict[str, Any]) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "generation": self._generation + 1 if files else 0,
            "store_id": self._store_id,
            "dimension": self._dim,
            "metric": "inner_product",
            "parameters": self.params,
            "index": self._index if files.get("scann_dir") else None,
            "recall": self.recall,
            "count": self.count() if files else 0,
            "metadata": self._meta,
            **files,
        }

    def _reopened(self) -> ScannStore:
        """The committed store, with this object's options for the next build and search."""
        options = {k: v for k, v in self.params.items() if v is not None}
        return ScannStore._from_state(self._path, None, options)

    def persist(self) -> None:
        """Save a new generation atomically (the state file is switched last).

        The searcher is serialized only after a build; other saves refer to the folder of the
        last one. The vectors file gets the rows the searcher's dataset does not hold. Nothing
        changed: nothing written.
        """
        with self._lock:  # what searches read changes here (compaction) and at the end only
            if not self._dirty and (self._path / STATE_FILE).is_file():
                return
            self._begin_write()
            path, gen = self._path, self._generation + 1
            FILES.begin(path, self._state({}))
            self._compact_pending()
            m = len(self._table.records)
            records = {**self._table.to_json(), "built": self._built}
            built_vecs, tail, searcher = self._built_vecs, self._tail, self._searcher
            scann_files = self._scann_files
        # Serialized and written without the lock, so searches go on: nothing here changes
        # what they read, and writers wait (the Retriever saves between writers' turns).
        if searcher is not None and scann_files is None:
            scann_files = self._save_searcher(f"scann-{gen}", searcher)
        saved: dict[str, Any] = {}
        if searcher is not None and scann_files is not None:
            saved["scann_dir"] = scann_files["dir"]
            saved["scann_sha256"] = scann_files["sha256"]
        saved["vectors_from"] = self._vectors_from_saved(searcher, scann_files)
        pending = tail[: m - len(built_vecs)]  # rows past m are spare capacity
        buf = io.BytesIO()
        np.save(buf, pending if saved["vectors_from"] else np.concatenate([built_vecs, pending]))
        blobs = {"records": json_bytes(records), "vectors": buf.getvalue()}
        FILES.commit(path, gen, blobs, self._state, saved)
        with self._lock:
            if self._searcher is searcher:
                self._scann_files = scann_files
            self._generation = gen
            self._dirty = False

    def _vectors_from_saved(self, searcher: Any, scann_files: dict[str, Any] | None) -> int:
        """First row the vectors file must hold: ``built`` when the saved searcher keeps its
        dataset (rows 0..built-1, never changed until the next build), else 0."""
        if searcher is None or scann_files is None:
            return 0
        return self._built if DATASET_FILE in scann_files["sha256"] else 0

    def _save_searcher(self, name: str, searcher: Any) -> dict[str, Any]:
        """Serialize ``searcher`` into ``DIR/name`` (a temp folder renamed when complete)."""
        final = self._path / name
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=self._path))
        try:
            with _native_quiet():
                searcher.serialize(str(tmp), relative_path=True)
            (tmp / PICKLE_FILE).unlink(missing_ok=True)
            sums = {}
            for f in sorted(tmp.iterdir()):
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
                sums[f.name] = sha256_file(f)
            fsync_dir(tmp)
            shutil.rmtree(final, ignore_errors=True)  # a complete folder of an uncommitted save
            os.replace(tmp, final)
            fsync_dir(self._path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return {"dir": name, "sha256": sums}

    # ------------------------------------------------------------------ rows

    def _ensure_capacity(self, rows: int) -> None:
        """Room for ``rows`` rows in all: the pending part grows (doubling), the built one
        never moves."""
        need, held = rows - self._built, len(self._table.records) - self._built
        if need > len(self._tail):
            grown = np.zeros((max(need, 2 * len(self._tail), 1024), self._dim), dtype=np.float32)
            grown[:held] = self._tail[:held]
            self._tail = grown

    def _drop_rows(self, rows: list[int]) -> None:
        """Forget rows: those inside the searcher become tombstones."""
        self._table.drop([r for r in rows if r < self._built], tombstone=True)
        self._table.drop([r for r in rows if r >= self._built], tombstone=False)
        self._pending_rows = None

    def _pending(self) -> np.ndarray:
        """Live rows outside the searcher (every live row before a build)."""
        if self._pending_rows is None:
            recs = self._table.records
            self._pending_rows = np.asarray(
                [r for r in range(self._built, len(recs)) if recs[r] is not None], dtype=np.int64
            )
        return self._pending_rows

    def _compact_pending(self) -> None:
        """Drop dead rows after the built region (rows are renumbered, the searcher's kept)."""
        recs, built = self._table.records, self._built
        if all(r is not None for r in recs[built:]):
            return
        keep = self._pending()
        self._tail[: len(keep)] = self._tail[keep - built]
        table = RecordTable.from_json(
            {
                "records": recs[:built] + [recs[r] for r in keep],
                "tombstones": sorted(self._table.tombstones),
            }
        )
        self._table = table
        self._pending_rows = None

    # ------------------------------------------------------------------ protocol

    def _upsert(self, batch: Batch) -> None:
        with self._lock:
            self._begin_write()
            replaced = self._table.fids_of(batch.ids)
            if replaced:
                self._drop_rows(replaced)
            self._ensure_capacity(len(self._table.records) + len(batch.ids))
            rows = self._table.append(batch.ids, batch.payloads, batch.norms)
            self._tail[np.asarray(rows) - self._built] = batch.vectors  # appended: past built
            self._pending_rows = None
            dead = len(self._table.records) - self._built - len(self._pending())
            if dead > max(4096, len(self._pending())):  # many replacements: reclaim memory
                self._compact_pending()
            self._dirty = True

    def _fetch(self, ids: list[str]) -> Iterable[StoreRecord]:
        with self._lock.read():
            out = []
            for doc_id in ids:
                row = self._table.row.get(doc_id)
                if row is not None:
                    rec = self._table.records[row]
                    vec = self._vectors_of(np.asarray([row]))[0]
                    out.append(StoreRecord(doc_id, vec, dict(rec[1])))  # type: ignore[index]
            return out

    def _scan_ids(self) -> Iterator[str]:
        with self._lock.read():
            return iter(list(self._table.row))

    def _query(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        with self._lock.read():  # ScaNN's search is const: searches run side by side
            rows = self._search_rows(q, k)
            out = []
            for found in rows:
                hits = []
                for row, score in found:
                    rec = self._table.records[row]
                    assert rec is not None  # _search_rows returns live rows only
                    vec = self._vectors_of(np.asarray([row]))[0] if with_vectors else None
                    hits.append(StoreHit(rec[0], score, dict(rec[1]), vec, float(rec[2])))
                out.append(hits)
            return out

    def _search_rows(self, q: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """(row, exact score) of the top ``k`` live rows per query, best first.

        ScaNN's candidates (minus tombstones) and the pending rows' exact top ``k`` are merged
        and re-scored exactly on the stored vectors.
        """
        candidates: list[list[np.ndarray]] = [[] for _ in range(len(q))]
        if self._searcher is not None and self._built:
            for n, found in enumerate(self._scann_rows(q, k)):
                candidates[n].append(found)
        pending = self._pending()
        if len(pending):
            top, _ = exact_search(q, self._tail[pending - self._built], k)
            for n, row in enumerate(top):
                candidates[n].append(pending[row])
        per_query = [
            np.unique(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)
            for parts in candidates
        ]
        every = np.unique(np.concatenate(per_query))
        stored = self._vectors_of(every)  # one read for the batch
        out = []
        for n, rows in enumerate(per_query):
            scores = stored[np.searchsorted(every, rows)] @ q[n]
            order = np.argsort(-scores, kind="stable")[:k]
            out.append([(int(rows[j]), float(scores[j])) for j in order])
        return out

    def _vectors_of(self, rows: np.ndarray) -> np.ndarray:
        """The stored vectors of ``rows`` (a new array). Built rows mapped from the searcher's
        dataset file are read from it with ``pread`` (:class:`_FileRows`): a search reads a
        few scattered rows, and through the map each would make resident a whole page-cache
        folio (up to 2 MB with large folios), until the file sits in memory a second time
        beside ScaNN's own copy. A gather of a large share of the store (a rebuild reads every
        row) goes through the map instead of one read per row."""
        rows = np.asarray(rows, dtype=np.int64)
        built = rows < self._built
        out = np.empty((len(rows), self._dim), dtype=np.float32)
        out[~built] = self._tail[rows[~built] - self._built]
        wanted = rows[built]
        f = self._file_rows
        if f is not None and f.array is self._built_vecs and len(wanted) <= self._built // 4:
            out[built] = f.read(wanted)
        elif len(wanted):
            out[built] = self._built_vecs[wanted]
        return out

    def _scann_rows(self, q: np.ndarray, k: int) -> list[np.ndarray]:
        """Live rows ScaNN proposes per query (``k`` + tombstones asked, padding dropped)."""
        kk = min(k + len(self._table.tombstones), self._built)
        leaves = self.effective_leaves_to_search()
        reorder = max(int(self.params["reorder"]), kk)
        search = (
            self._searcher.search_batched_parallel
            if len(q) >= PARALLEL_BATCH
            else self._searcher.search_batched
        )
        idx, dist = search(
            q, final_num_neighbors=kk, leaves_to_search=leaves, pre_reorder_num_neighbors=reorder
        )
        recs, out = self._table.records, []
        for irow, drow in zip(np.asarray(idx), np.asarray(dist), strict=True):
            valid = np.isfinite(drow) & (irow < self._built)  # short answers are NaN-padded
            rows = irow[valid].astype(np.int64)
            out.append(np.asarray([r for r in rows if recs[r] is not None], dtype=np.int64))
        return out

    # ------------------------------------------------------------------ index

    def effective_leaves_to_search(self) -> int:
        """Leaves a search visits: the set or tuned value, else a tenth, at most all."""
        leaves = int((self._index or {}).get("num_leaves", 1))
        asked = self.params.get("leaves_to_search")
        if asked is None:
            asked = math.ceil(LEAVES_SEARCHED * leaves)
        return max(1, min(int(asked), leaves))

    def set_search_parameters(
        self, *, leaves_to_search: int | None = None, reorder: int | None = None
    ) -> None:
        """Change the search-time knobs of an open store (validated; kept by the next save)."""
        new = {
            "leaves_to_search": registry.check_option(
                "leaves_to_search", leaves_to_search, self.location
            ),
            "reorder": registry.check_option("reorder", reorder, self.location),
        }
        with self._lock:
            self.params.update({k: v for k, v in new.items() if v is not None})
            self._dirty = True

    def optimize(self) -> None:
        """Build the searcher over every live vector (from ``exact_below`` vectors on), then
        measure its recall (tuning ``leaves_to_search`` to ``target_recall`` when given).

        A store below the threshold drops its searcher and is searched exactly. Nothing added
        or deleted since the last build: the searcher is kept (and re-measured only for a new
        target).
        """
        with self._lock:
            n = self.count()
            if n < int(self.params["exact_below"]):
                if self._searcher is not None or self._built:
                    self._begin_write()
                    self._rebuild(None)
                return
            leaves = self.params.get("num_leaves") or default_leaves(n)
            if leaves > n:
                raise StoreError(
                    f"{self.location}: --scann-leaves {leaves} is more than the {n} vectors "
                    "stored; give at most one leaf per vector (about √n is the default)"
                )
            stale = bool(
                self._searcher is None
                or len(self._pending())
                or self._table.tombstones
                or int((self._index or {}).get("num_leaves", 0)) != leaves
            )
            if stale:
                self._begin_write()
                self._rebuild(int(leaves))
            recall = self.recall or {}
            if stale or (
                self.target_recall is not None and recall.get("target") != self.target_recall
            ):
                self.measure_recall(target_recall=self.target_recall)

    def _rebuild(self, leaves: int | None) -> None:
        """Renumber the live rows 0..n-1 and build a searcher over them (None: exact only)."""
        recs = self._table.records
        live = np.asarray([r for r, rec in enumerate(recs) if rec is not None], dtype=np.int64)
        vecs = self._vectors_of(live)
        searcher, index = None, None
        if leaves is not None:
            n = len(live)
            sample = min(n, MAX_TRAINING_SAMPLE)
            to_search = self.params.get("leaves_to_search") or math.ceil(LEAVES_SEARCHED * leaves)
            builder = (
                scann_ops()
                .builder(vecs, 10, "dot_product")
                .tree(
                    num_leaves=leaves,
                    num_leaves_to_search=min(int(to_search), leaves),
                    training_sample_size=sample,
                )
                .score_ah(AH_DIMS, anisotropic_quantization_threshold=AH_THRESHOLD)
                .reorder(int(self.params["reorder"]))
            )
            with self._driver("build the ScaNN searcher"), _native_quiet():
                searcher = builder.build()
            index = {"num_leaves": leaves, "training_sample_size": sample}
        self._table = RecordTable.from_json({"records": [recs[r] for r in live], "tombstones": []})
        self._built = len(live) if searcher is not None else 0
        self._built_vecs, self._tail = vecs[: self._built], vecs[self._built :]
        self._file_rows = None
        self._searcher, self._index = searcher, index
        self._scann_files = None  # saved by the next persist
        self._pending_rows = None
        self.recall = None
        self._dirty = True

    def _recall_lock(self) -> Any:
        return self._lock

    def _recall_knob(self) -> Any:
        """``leaves_to_search`` of the searcher (None without one: the store is exact)."""
        if self._searcher is None:
            return None

        def set_leaves(value: int) -> None:
            self.params["leaves_to_search"] = int(value)

        leaves = int(self._index["num_leaves"])  # type: ignore[index]
        values = _ann_recall.nprobe_values(leaves)
        return _ann_recall.Knob(
            "leaves_to_search", values, set_leaves, self.effective_leaves_to_search()
        )

    def _vector_blocks(self, size: int) -> Iterator[tuple[list[str], np.ndarray]]:
        """The searcher's rows as read-only views (they never move: a build makes new arrays,
        a write appends or marks a row dead), then the pending rows copied under the lock,
        block by block. Dead rows are left out; a compaction or build during the scan ends
        it early (its rows were renumbered).

        A reopened store maps its built rows from the searcher's dataset file: once the
        caller asks for the next block, the pages of the previous one leave this process
        (:func:`_release_pages`), so a scan of the whole store (the server's recall watch)
        does not leave the file resident beside ScaNN's own copy of it."""
        with self._lock.read():
            table, vecs, built = self._table, self._built_vecs, self._built
        for start in range(0, built, size):
            part = table.records[start : min(start + size, built)]
            ids = [rec[0] for rec in part if rec is not None]
            view = vecs[start : start + len(part)]
            if len(ids) < len(part):
                view = view[[n for n, rec in enumerate(part) if rec is not None]]
            view.flags.writeable = False
            if ids:
                yield ids, view
            # from row 0: a fault maps a whole page-cache folio, rows of earlier blocks too
            _release_pages(vecs[: start + len(part)])
        after = built
        while True:
            with self._lock.read():
                if self._table is not table:
                    return
                pending = self._pending()
                rows = pending[np.searchsorted(pending, after) :][:size]
                if not len(rows):
                    return
                ids = [table.records[r][0] for r in rows.tolist()]
                block = self._tail[rows - built]
            after = int(rows[-1]) + 1
            yield ids, block

    def _recall_search(self, qs: np.ndarray, k: int) -> list[list[str]]:
        recs = self._table.records
        return [[recs[r][0] for r, _ in row] for row in self._search_rows(qs, k)]  # type: ignore[index]

    def _tune(self, run: Any, knob: Any, target: float | None) -> dict[str, Any]:
        """With a target, when only every leaf reaches it, ``reorder`` is doubled (up to
        :data:`REORDER_DOUBLINGS` times) and the leaves tuned again: once too few candidates
        are re-scored exactly no number of leaves makes up for it."""
        leaves = int(self._index["num_leaves"])  # type: ignore[index]
        base = int(self.params["reorder"])
        recall: dict[str, Any] = {}
        for step in range(REORDER_DOUBLINGS + 1 if target is not None else 1):
            self.params["reorder"] = base * 2**step
            recall = dict(run(knob, target, warn=False))
            if recall.get("target_met_on_tuning_queries") and knob.current < leaves:
                break  # reached before every leaf is searched: re-scoring is not the limit
        _ann_recall.warn_if_low(recall, self.location)
        recall["num_leaves"] = leaves
        recall["reorder"] = int(self.params["reorder"])
        return recall

    def _keep_recall(self, recall: dict[str, Any], knob: Any) -> None:
        """Kept (with the chosen leaves and reorder) in the state file by the next save."""
        self.recall = recall
        self._begin_write()
        self._dirty = True

    def _describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": "scann" if self._searcher is not None else "exact",
            "distance": "dot_product",
            "exact_below": int(self.params["exact_below"]),
            "search": _ann_recall.EXACT if self._searcher is None else _ann_recall.APPROXIMATE,
            "kernels": ensure_avx2(),
        }
        if self._searcher is not None:
            out.update(
                {
                    "tree": "k-means",
                    "num_leaves": int(self._index["num_leaves"]),  # type: ignore[index]
                    "leaves_to_search": self.effective_leaves_to_search(),
                    "quantization": f"anisotropic AH, {AH_DIMS} dims/block, "
                    f"threshold {AH_THRESHOLD}",
                    "reorder": int(self.params["reorder"]),
                    "training_sample_size": int(self._index["training_sample_size"]),  # type: ignore[index]
                    "indexed": self._built,
                    "tombstones": len(self._table.tombstones),
                }
            )
        out["pending_exact"] = int(len(self._pending()))
        if self.recall is not None:
            out["recall"] = self.recall
        return out


# ----------------------------------------------------------------------------- files


def _read_vectors(f: Path, records_name: str, rows: int, rows_from: int, dim: int) -> np.ndarray:
    """Rows ``rows_from..rows-1`` of the store's vectors from the vectors file ``f``."""
    vecs = np.load(f, allow_pickle=False)
    if vecs.dtype != np.float32 or vecs.shape != (rows - rows_from, dim):
        described = f"{rows}" if not rows_from else f"{rows - rows_from} (rows {rows_from} on)"
        raise StoreError(
            f"{f}: holds {vecs.shape} {vecs.dtype} vectors, "
            f"{records_name} describes {described} of dimension {dim}"
        )
    return np.ascontiguousarray(vecs)


def _vectors_from(path: Path, state: dict[str, Any], built: int) -> int:
    """The first row the vectors file holds: 0 (every row; also a state without the field) or
    ``built``, when the rows before it are the dataset of the saved searcher."""
    rows_from = state.get("vectors_from", 0)
    if rows_from == 0:
        return 0
    if (
        isinstance(rows_from, bool)
        or not isinstance(rows_from, int)
        or rows_from != built
        or state.get("scann_dir") is None
    ):
        raise StoreError(
            f"{path / STATE_FILE}: vectors_from {rows_from!r} is neither 0 nor the {built} rows "
            "of a saved searcher"
        )
    folder = plain_file(path, state["scann_dir"], STATE_FILE)
    sums = state.get("scann_sha256")
    if not isinstance(sums, dict) or DATASET_FILE not in sums:
        raise StoreError(
            f"{folder / DATASET_FILE}: not among the searcher files checksummed in {STATE_FILE}"
        )
    return rows_from


def _dataset_rows(path: Path, state: dict[str, Any], built: int, dim: int) -> np.ndarray:
    """Rows 0..built-1 of the store: the saved searcher's ``dataset.npy``, memory-mapped.

    Its header is checked here, before ScaNN reads the folder; its checksum by
    :func:`_load_searcher`. The map is read-only: the store grows into a new array before it
    adds rows, and a write into it would fail rather than be dropped by
    :func:`_release_pages`.
    """
    f = plain_file(path, state["scann_dir"], STATE_FILE) / DATASET_FILE
    if not f.is_file():
        raise StoreError(f"{f}: missing (the store in {path} is incomplete)")
    try:
        data = np.load(f, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise StoreError(f"{f}: unreadable ({str(exc).splitlines()[0]})") from None
    if data.dtype != np.float32 or data.shape != (built, dim):
        raise StoreError(
            f"{f}: holds {data.shape} {data.dtype} vectors, the store has {built} built rows "
            f"of dimension {dim}"
        )
    return np.ascontiguousarray(data)


def _release_pages(rows: np.ndarray) -> None:
    """Drop this process's resident pages under ``rows`` (C-contiguous) when they are a
    view of a memory-mapped file; no-op for any other array or where ``madvise`` is missing.

    Only file pages of a read-only map are released (``MADV_DONTNEED``): they stay in the
    page cache and a later read maps them again, with the same content, so the view stays
    valid; they just stop counting in this process's resident memory.
    """
    mapped: Any = rows
    while mapped is not None and not isinstance(mapped, mmap.mmap):
        mapped = getattr(mapped, "base", None)
    advice = getattr(mmap, "MADV_DONTNEED", None)
    if mapped is None or advice is None or not rows.nbytes or not rows.flags.c_contiguous:
        return
    try:
        whole = np.frombuffer(mapped, dtype=np.uint8)
        if whole.flags.writeable:
            return  # a writable (copy-on-write) map could hold writes: never dropped
        start = rows.ctypes.data - whole.ctypes.data
        first = start - start % mmap.PAGESIZE
        mapped.madvise(advice, first, start + rows.nbytes - first)
    except (ValueError, OSError):  # closed under us, or refused: only memory is at stake
        return


class _FileRows:
    """Rows of a memory-mapped float32 ``.npy`` array read with ``pread`` instead of through
    the map (see :meth:`ScannStore._vectors_of`); ``array`` is the mapped array they belong
    to. The file stays open (and readable after a newer generation removed it) until this
    object is collected."""

    def __init__(self, array: np.ndarray, f: str, offset: int) -> None:
        self.array = array
        self._file = f
        self._fd = os.open(f, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        weakref.finalize(self, os.close, self._fd)
        self._offset = int(offset)
        self._width = int(array.shape[1]) * array.itemsize

    @classmethod
    def of(cls, array: np.ndarray) -> _FileRows | None:
        """The reader of ``array`` when it is a whole ``np.memmap`` of a file (else None)."""
        mapped = array.base
        if not isinstance(mapped, np.memmap) or not hasattr(os, "pread"):
            return None
        if array.ctypes.data != mapped.ctypes.data or mapped.filename is None:
            return None
        return cls(array, mapped.filename, mapped.offset)

    def read(self, rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), self.array.shape[1]), dtype=np.float32)
        for n, row in enumerate(rows.tolist()):
            data = os.pread(self._fd, self._width, self._offset + row * self._width)
            if len(data) != self._width:
                raise StoreError(f"{self._file}: row {row} is past its end")
            out[n] = np.frombuffer(data, dtype=np.float32)
        return out


def _load_searcher(path: Path, state: dict[str, Any]) -> Any:
    """The saved searcher, every file checked first; ScaNN's pickle of ids is never read."""
    folder = plain_file(path, state["scann_dir"], STATE_FILE)
    sums = state["scann_sha256"]
    if not folder.is_dir() or not isinstance(sums, dict) or "scann_assets.pbtxt" not in sums:
        raise StoreError(f"{folder}: missing (the store in {path} is incomplete)")
    for name, digest in sums.items():
        f = plain_file(folder, name, STATE_FILE)
        if not f.is_file() or sha256_file(f) != digest:
            raise StoreError(
                f"{f}: missing or not matching the checksum in {STATE_FILE} "
                "(half-written or modified)"
            )
    assets = (folder / "scann_assets.pbtxt").read_text()
    for name in re.findall(r'asset_path:\s*"([^"]*)"', assets):
        if name not in sums:  # only the checksummed files of this folder, by plain name
            raise StoreError(f"{folder / 'scann_assets.pbtxt'}: asset {name!r} is not a store file")
    ops = scann_ops()
    try:
        with _native_quiet():
            native = ops.scann_pybind.ScannNumpy(str(folder), assets)
    except RuntimeError as exc:
        raise StoreError(f"{folder}: ScaNN cannot load it ({str(exc).splitlines()[0]})") from None
    return ops.ScannSearcher(native)


# ----------------------------------------------------------------------------- registry entry


@dataclass(frozen=True)
class ScannOptions(StoreOptions):
    """A ScaNN searcher: its k-means tree, how much of it a query visits, exact re-scoring."""

    num_leaves: int | None = option(
        "ScaNN: leaves of the k-means tree, used by the next build (default about √n).",
        flag="--scann-leaves",
        minimum=1,
        maximum=1 << 20,
    )
    leaves_to_search: int | None = option(
        "ScaNN: leaves each query visits (default a tenth; --target-recall tunes it).",
        flag="--scann-leaves-to-search",
        minimum=1,
        maximum=1 << 20,
        search=True,
    )
    reorder: int | None = option(
        f"ScaNN: candidates re-scored exactly before answering (default {REORDER}; "
        "--target-recall doubles it when every leaf is not enough).",
        flag="--scann-reorder",
        minimum=1,
        maximum=100_000,
        search=True,
    )
    exact_below: int | None = option(
        f"ScaNN: stores smaller than this are searched exactly, no searcher built "
        f"(default {EXACT_BELOW:,}).",
        flag="--scann-exact-below",
        minimum=100,
        maximum=1 << 40,
    )


SCANN_OPTIONS = (ScannOptions, RecallOptions)
OPTION_NAMES = (*ScannOptions.keywords(), *RecallOptions.keywords())


def _open(loc: dict[str, str], dimension: int | None, **options: Any) -> ScannStore:
    return ScannStore.open(loc["path"], dimension, **options)


registry.register(
    registry.Backend(
        form="scann:DIR",
        open=_open,
        options=SCANN_OPTIONS,
        folder=True,
        extra="scann",
    )
)
