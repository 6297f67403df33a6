"""The one small protocol every vector store implements, and the helpers they share.

A store keeps *stored* vectors (``d / ‖d‖^γd``, see :mod:`magretrieve.core.similarity`) under
string ids with a JSON payload, and is searched by inner product. Magnitude is the point of
this project, so a store never normalizes, and every store refuses NaN/inf before it writes.

Store metadata records the model that built the store (the manifest's
``model_fingerprint``, mode, γ values, dimension) so a :class:`~magretrieve.serving.retriever.Retriever`
can refuse to mix models.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
import uuid
from abc import ABC
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.files import is_plain_file_name
from magretrieve.core.redact import redact_value
from magretrieve.core.text import lone_surrogate
from magretrieve.stores.options import IndexOptions, check_dimension

#: The only metric a magretrieve store uses.
METRIC = "inner_product"
#: The identity of a folder store written before stores recorded one: every such folder
#: reads as this one id, so a replica keeps following its generations as before.
LEGACY_STORE_ID = "legacy"
#: Namespace of the deterministic point ids (uuid5 of the document id) used by Qdrant stores.
ID_NAMESPACE = uuid.UUID("6f1c3f0e-8a57-5b7e-9a43-3d2b1c0e9f10")


class StoreVersion(NamedTuple):
    """Which committed state of a folder store: the random id written when the folder was
    created, and the generation counter of its saves.

    Two states differ when either part does. The id tells a folder deleted and built again
    (whose counter starts over, and may land on the very number a reader holds) from the
    folder that reader opened."""

    store_id: str
    generation: int


def new_store_id() -> str:
    """A random id for a store folder being created."""
    return uuid.uuid4().hex


def state_store_id(value: Any) -> str:
    """The store id recorded in a state file or marker; :data:`LEGACY_STORE_ID` when none is
    (a folder written before stores recorded their id)."""
    return value if isinstance(value, str) and value else LEGACY_STORE_ID


@dataclass
class StoreHit:
    """One search result as a store returns it (before the Retriever decomposes the score).

    ``doc_norm`` is the stored vector's norm, kept by the store next to the vector (payload,
    record table) so explaining a score never needs the vector itself: with it the Retriever
    searches with ``with_vectors=False``. ``None`` only for third-party stores that cannot
    tell; the Retriever then fetches those vectors.
    """

    id: str
    score: float
    payload: dict[str, Any] = field(default_factory=dict)
    vector: np.ndarray | None = None
    doc_norm: float | None = None


@dataclass
class StoreRecord:
    """A stored point read back by id."""

    id: str
    vector: np.ndarray
    payload: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Batch:
    """One validated add/upsert batch, as a backend's ``_upsert`` receives it.

    ``ids`` are distinct non-empty strings the backend can store, ``vectors`` a finite
    float32 ``(n, dim)`` array, ``payloads`` strict-JSON copies without reserved keys, and
    ``norms`` each vector's norm (what every store keeps beside the vector as ``doc_norm``).
    """

    ids: list[str]
    vectors: np.ndarray
    payloads: list[dict[str, Any]]
    norms: np.ndarray

    def rows(self) -> Iterator[tuple[str, np.ndarray, dict[str, Any], float]]:
        """(id, vector, payload, norm) per document."""
        for n, doc_id in enumerate(self.ids):
            yield doc_id, self.vectors[n], self.payloads[n], float(self.norms[n])


#: Payload keys no store accepts from a user: Qdrant keeps its own ``doc_id``/``doc_norm``
#: beside the user's fields, and every store refuses them alike so a payload valid on one
#: store is valid on all.
RESERVED_PAYLOAD_KEYS = ("doc_id", "doc_norm")
#: Largest magnitude of a payload integer: Qdrant and Milvus keep JSON integers as int64.
INT64_RANGE = (-(2**63), 2**63 - 1)
#: Points read back per step of the exact scan that answers rows an index answered short.
EXACT_SCAN_CHUNK = 4096
#: Stored vectors per block of :meth:`VectorStore.iter_vectors` (100 MB of float32 at 384).
VECTOR_BLOCK = 65536
#: What reading a store file with the right checksum but the wrong content raises.
MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError)


class VectorStore(ABC):
    """The protocol: add/upsert, batch search, delete, count, get by id, persist, describe.

    The public methods are written here, once: they validate ids, vectors, payloads, ``k``
    and queries, compute the norms, turn the backend library's errors into one-line
    :class:`StoreError` messages (secrets redacted) and order the results. A backend
    implements only the primitives, which receive checked input:

    ==========================  ==========================================================
    ``_upsert(batch)``          write a :class:`Batch` (insert or replace), all or nothing
    ``_query(q, k, vectors)``   top-``k`` :class:`StoreHit` lists per query row, best first
    ``_delete(ids)``            remove those stored; return how many were removed
    ``_fetch(ids)``             the stored :class:`StoreRecord` objects among ``ids``
    ``_existing(ids)``          the stored subset of ``ids``
    ``_count()``                number of live points
    ``_scan_ids()``             every stored id
    ``_vector_blocks(size)``    every (ids, vectors) in blocks (optional: paged by default)
    ``_read_meta()`` / ``_write_meta(meta)``  the model metadata (None for a fresh store)
    ``_describe()``             index parameters worth reporting
    ==========================  ==========================================================

    plus ``_dim`` and ``_location`` (or the ``dimension`` and ``location`` properties) and
    :meth:`_driver_errors` (the library's exception classes). A store over a database
    opens or creates its collection through the lifecycle hooks (:meth:`_open_or_create`);
    an ANN store names its search knob (:meth:`_recall_knob`) and gets
    :meth:`measure_recall`. Class attributes declare a backend's limits:
    ``max_id_bytes`` (longest id in UTF-8 bytes) and ``max_k``. ``thread_safe_search`` says
    whether concurrent ``search`` calls are safe without a lock (the Retriever serializes
    them when not).
    """

    #: Short backend name, e.g. ``"faiss"``.
    kind: str = "store"
    #: Whether ``search`` may run from several threads at once.
    thread_safe_search: bool = False
    #: Whether :meth:`persist` may run while searches do: it changes nothing a search reads
    #: and takes no lock a search waits on. The Retriever then saves outside its search lock
    #: (writes still wait for the save); a store that does not say so is saved with searches
    #: held off.
    persists_beside_search: bool = False
    #: Longest document id in UTF-8 bytes (None: no limit of the backend's own).
    max_id_bytes: int | None = None
    #: Largest ``k`` the backend answers (None: no limit).
    max_k: int | None = None
    #: Query vectors an ANN store tunes and measures its recall on (``_ann_recall.TuningQueries``,
    #: set by ``open_store(tuning_queries=...)`` or the Retriever); None: a synthetic sample.
    tuning_queries: Any = None
    #: The vector dimension (set by :meth:`_open_or_create` for the database stores).
    _dim: int

    #: Where the data lives, for :attr:`location` (set by the backend's constructor).
    _location: str

    @property
    def dimension(self) -> int:
        """Vector dimension the store was created with."""
        return self._dim

    @property
    def location(self) -> str:
        """Human-readable name of where the data lives (a path, URL/collection, ...)."""
        return self._location

    @property
    def metric(self) -> str:
        return METRIC

    @property
    def normalizes_vectors(self) -> bool:
        """True when the store rescales vectors on the way in (magnitude would be lost)."""
        return False

    # ------------------------------------------------------------------ primitives

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        """Exception classes of the backend's library, reported as one-line StoreErrors."""
        return ()

    def _upsert(self, batch: Batch) -> None:
        raise NotImplementedError

    def _query(self, queries: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        raise NotImplementedError

    def _delete(self, ids: list[str]) -> int:
        raise NotImplementedError

    def _fetch(self, ids: list[str]) -> Iterable[StoreRecord]:
        raise NotImplementedError

    def _existing(self, ids: list[str]) -> Iterable[str]:
        return [r.id for r in self._fetch(ids)]

    def _count(self) -> int:
        raise NotImplementedError

    def _query_exact(
        self, queries: np.ndarray, k: int, with_vectors: bool
    ) -> list[list[StoreHit]] | None:
        """Top-``k`` by an exact scan, for the rows the index answered short (see
        :meth:`search`): the stored points are read back in chunks through the backend's own
        primitives (``_scan_ids`` + ``_fetch``), so memory stays at one chunk plus ``k``
        candidates a query. A backend with a faster scan overrides this; one that cannot list
        its ids returns None (the search is then refused, naming the shortfall)."""
        try:
            id_iter = iter(self._scan_ids())
        except NotImplementedError:
            return None
        q = np.asarray(queries, dtype=np.float32)
        best_scores = np.empty((len(q), 0), dtype=np.float32)
        best_ids = np.empty((len(q), 0), dtype=object)
        while chunk := list(itertools.islice(id_iter, EXACT_SCAN_CHUNK)):
            records = list(self._fetch(chunk))
            if not records:
                continue
            vectors = np.stack([np.asarray(r.vector, dtype=np.float32) for r in records])
            chunk_ids = np.array([r.id for r in records], dtype=object)
            scores = np.concatenate([best_scores, q @ vectors.T], axis=1)
            names = np.concatenate(
                [best_ids, np.broadcast_to(chunk_ids, (len(q), len(chunk_ids)))], axis=1
            )
            keep = min(k, scores.shape[1])
            part = np.argpartition(-scores, keep - 1, axis=1)[:, :keep]
            best_scores = np.take_along_axis(scores, part, axis=1)
            best_ids = np.take_along_axis(names, part, axis=1)
        out: list[list[StoreHit]] = []
        for row_scores, row_ids in zip(best_scores, best_ids, strict=True):
            order = sorted(range(len(row_ids)), key=lambda j: (-row_scores[j], row_ids[j]))
            chosen = [str(row_ids[j]) for j in order]
            found = {r.id: r for r in self._fetch(chosen)}
            row: list[StoreHit] = []
            for j, doc_id in zip(order, chosen, strict=True):
                record = found.get(doc_id)
                if record is None:  # deleted while the scan ran
                    continue
                vector = np.asarray(record.vector, dtype=np.float32)
                row.append(
                    StoreHit(
                        doc_id,
                        float(row_scores[j]),
                        dict(record.payload),
                        vector.copy() if with_vectors else None,
                        doc_norm=float(np.linalg.norm(vector.astype(np.float64))),
                    )
                )
            out.append(row)
        return out

    def _short_advice(self) -> str:
        """How a user makes the index answer every hit (a setting to raise)."""
        return "raise its search breadth (--ef-search / --nprobe) or use an exact index"

    def _scan_ids(self) -> Iterator[str]:
        raise NotImplementedError

    def _read_meta(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def _write_meta(self, meta: dict[str, Any]) -> None:
        raise NotImplementedError

    def _describe(self) -> dict[str, Any]:
        return {}

    # ------------------------------------------------------------------ lifecycle, once

    def _exists(self) -> bool:
        """Whether the collection / table / folder this object names exists already."""
        raise NotImplementedError

    def _open_existing(self, dimension: int | None) -> int:
        """Check what exists (fields, metric) and return its vector dimension (``dimension``
        is the one asked for, for a backend that can only tell from the caller)."""
        raise NotImplementedError

    def _create(self, dimension: int) -> None:
        """Create it, empty, for vectors of ``dimension`` with the build options given."""
        raise NotImplementedError

    def _recorded_build(self) -> dict[str, Any]:
        """The build options an existing store was built with (None where unknown), compared
        with the ones asked for by :func:`check_reopen`."""
        return {}

    def _before_create(self) -> bool:
        """Called before creating; True when what exists must be looked up again (the store
        took its folder's writer lock, and another process may have created it meanwhile)."""
        return False

    def _open_or_create(
        self, dimension: int | None, what: str, asked: Mapping[str, Any] | None = None
    ) -> None:
        """Open what exists, or create it when a ``dimension`` is given: the one lifecycle.

        Opening checks the backend's layout (:meth:`_open_existing`), the dimension against
        the one asked for, and the build options ``asked`` against the recorded ones; a
        read-only open (no dimension) of a missing ``what`` creates nothing. Sets
        ``_dim`` and :attr:`created_here`.
        """
        exists = self._exists()
        if not exists and dimension is not None:
            # checked before a writer lock is taken or a folder made: bad input creates nothing
            dimension = check_dimension(dimension, self.location)
            if self._before_create():
                exists = self._exists()
        if exists:
            self.created_here = False
            found = int(self._open_existing(dimension))
            if dimension is not None and found != int(dimension):
                raise StoreError(
                    f"{self.location} has vector size {found}, but the model produces "
                    f"dimension {dimension}"
                )
            self._dim = found
            check_reopen(self.location, self._recorded_build(), asked or {})
            return
        if dimension is None:
            raise missing_store(self.location, what)
        self._dim = dimension  # checked above: only a missing store gets here
        self._create(self._dim)
        self.created_here = True

    # ------------------------------------------------------------------ recall, once

    def _recall_knob(self) -> Any:
        """The search knob tuned to a recall target (``_ann_recall.Knob``: its name, the
        values to try and how to set one), or None when nothing approximate is searched now
        (no ANN index, an empty store): then :meth:`measure_recall` measures nothing."""
        return None

    def _vector_blocks(self, size: int) -> Iterator[tuple[list[str], np.ndarray]]:
        """Every live (id, vector) as blocks of at most ``size``: (ids, float32 ``(n, dim)``).

        Paged through the primitives (``_scan_ids`` + ``_fetch``, at most
        :data:`EXACT_SCAN_CHUNK` ids a fetch, what every database takes in one query); a store
        that holds its vectors in memory overrides it with views of its own arrays (no copy).
        See :meth:`iter_vectors`.
        """
        scan = iter(self._scan_ids())
        while chunk := list(itertools.islice(scan, min(size, EXACT_SCAN_CHUNK))):
            records = list(self._fetch(chunk))
            if records:
                yield (
                    [r.id for r in records],
                    np.stack([np.asarray(r.vector, dtype=np.float32) for r in records]),
                )

    def _stored_vectors(self) -> tuple[list[str], np.ndarray]:
        """Every live (id, vector) in one array, the truth recall is measured against (the
        blocks of :meth:`_vector_blocks`, joined)."""
        ids: list[str] = []
        blocks: list[np.ndarray] = []
        for block_ids, vectors in self._vector_blocks(VECTOR_BLOCK):
            ids.extend(block_ids)
            blocks.append(vectors)
        if not blocks:
            return [], np.zeros((0, self.dimension), dtype=np.float32)
        return ids, np.concatenate(blocks)

    def _ground_truth(self) -> str:
        """What exact search runs over when recall is measured."""
        return "exact inner product over the stored vectors"

    def _recall_search(self, queries: np.ndarray, k: int) -> list[list[str]]:
        """The ids the store answers, as a user's search gets them."""
        return [[h.id for h in row] for row in self.search(queries, k, with_vectors=False)]

    def _tune(self, run: Any, knob: Any, target: float | None) -> dict[str, Any]:
        """Measure (tuning ``knob`` to ``target`` first): ``run(knob, target, warn=True)`` is
        one pass of :func:`._ann_recall.measure`. A backend with a second knob or a second
        pass (LanceDB's partitions, ScaNN's reorder, Chroma's raise to the warning line)
        overrides this."""
        return dict(run(knob, target))

    def _keep_recall(self, recall: dict[str, Any], knob: Any) -> None:  # noqa: B027
        """Keep the measurement (and the knob's chosen value) where the backend records
        its state, for ``describe()``; the default keeps nothing beyond the return value."""

    def _recall_lock(self) -> Any:
        """Held while recall is measured (the stores that swap their index under a lock)."""
        return nullcontext()

    def measure_recall(
        self, queries: np.ndarray | None = None, target_recall: float | None = None
    ) -> dict[str, Any] | None:
        """recall@10 of the store's answers against exact search on a query sample, tuning
        the backend's search knob to ``target_recall`` first when one is given (see
        :mod:`magretrieve.stores._ann_recall`); None when nothing approximate is searched.

        ``queries`` are the user's query vectors (default: the store's ``tuning_queries``,
        else a synthetic sample). The result is kept by the backend and reported by
        ``describe()["parameters"]["recall"]``.
        """
        from magretrieve.stores import _ann_recall, registry

        if target_recall is not None:
            target_recall = registry.check_option("target_recall", target_recall, self.location)
        with self._recall_lock():
            knob = self._recall_knob()
            if knob is None:
                return None
            ids, vectors = self._stored_vectors()
            if not ids:
                return None
            given = queries if queries is not None else self.tuning_queries

            def run(
                knob: Any, target: float | None, warn: bool = True, queries: Any = given
            ) -> dict[str, Any]:
                return _ann_recall.measure(
                    self._recall_search,
                    ids,
                    vectors,
                    knob=knob,
                    target=target,
                    queries=queries,
                    ground_truth=self._ground_truth(),
                    where=self.location,
                    warn=warn,
                )

            recall = self._tune(run, knob, target_recall)
            self._keep_recall(recall, knob)
            return recall

    # ------------------------------------------------------------------ the checks, once

    @contextmanager
    def _driver(self, what: str) -> Iterator[None]:
        """Run backend code, turning its library's errors into one StoreError line."""
        try:
            yield
        except StoreError:
            raise
        except self._driver_errors() as exc:
            raise StoreError(
                f"{self.location}: {what} failed ({type(exc).__name__}: {one_line(exc)})"
            ) from None

    def _recorded_object(self, raw: Any, what: str) -> dict[str, Any] | None:
        """A JSON object the store recorded as text in its database's metadata (``what``
        names that field in the error): None when empty or not an object; text that is not
        JSON is refused in one line."""
        if not raw:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            raise StoreError(f"{self.location}: {what} is not JSON") from None
        return value if isinstance(value, dict) and value else None

    def _run(self, what: str, fn: Any) -> Any:
        """``fn()`` with the library's errors turned into one StoreError line."""
        with self._driver(what):
            return fn()

    def check_batch(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        payloads: Sequence[Mapping[str, Any]] | None = None,
    ) -> Batch:
        """The :class:`Batch` ``_upsert`` gets, or a StoreError naming the first fault."""
        where = self.location
        if isinstance(ids, (str, bytes)):
            raise StoreError(f"{where}: pass a list of document ids, not one string {ids!r:.60}")
        ids, arr, plist = check_batch(ids, vectors, payloads, self.dimension, where)
        for doc_id in ids:
            self._check_id_limit(doc_id)
        for doc_id, payload in zip(ids, plist, strict=True):
            check_payload_keys(payload, RESERVED_PAYLOAD_KEYS, doc_id, where)
        norms = np.linalg.norm(arr.astype(np.float64), axis=1)
        return Batch(ids, arr, plist, norms)

    def _check_id_limit(self, doc_id: str) -> None:
        limit = self.max_id_bytes
        if limit is not None and len(doc_id.encode("utf-8")) > limit:
            raise StoreError(
                f"{self.location}: document id {doc_id[:40]!r}... is longer than {limit} bytes; "
                f"nothing was written ({self.kind} keeps ids of at most {limit} bytes)"
            )

    def _lookup(self, ids: Sequence[str]) -> tuple[list[str], list[str]]:
        """(ids as given, the distinct ones a store could hold) for delete/get/existing.

        An id no store accepts (empty, NUL, lone surrogate, over the backend's length) is
        simply not stored: it never reaches the backend, so it cannot match anything else.
        """
        if isinstance(ids, (str, bytes)):
            raise StoreError(
                f"{self.location}: pass a list of document ids, not one string {ids!r:.60}"
            )
        given = list(ids)
        for doc_id in given:
            if not isinstance(doc_id, str):
                raise StoreError(
                    f"{self.location}: document ids must be strings, got {doc_id!r:.60}"
                )
        valid = []
        seen: set[str] = set()
        for doc_id in given:
            if doc_id in seen or id_problem(doc_id) is not None:
                continue
            limit = self.max_id_bytes
            if limit is not None and len(doc_id.encode("utf-8")) > limit:
                continue
            seen.add(doc_id)
            valid.append(doc_id)
        return given, valid

    # ------------------------------------------------------------------ public protocol

    def add(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        payloads: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        """Insert or replace (upsert) points; returns how many were written.

        The whole batch is checked before anything is written.
        """
        batch = self.check_batch(ids, vectors, payloads)
        if not batch.ids:
            return 0
        with self._driver("upsert"):
            self._upsert(batch)
        return len(batch.ids)

    def upsert(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        payloads: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        """Alias of :meth:`add`: adding an existing id replaces it."""
        return self.add(ids, vectors, payloads)

    def search(
        self, queries: np.ndarray, k: int, *, with_vectors: bool = True
    ) -> list[list[StoreHit]]:
        """Top-``k`` hits by inner product for each row of ``queries`` (best first)."""
        q = check_queries(queries, self.dimension, self.location)
        k = check_k(k)
        if self.max_k is not None and k > self.max_k:
            raise StoreError(
                f"{self.location}: {self.kind} returns at most {self.max_k} hits, asked {k}"
            )
        if not len(q):  # no queries: nothing to ask the backend (some fail on an empty batch)
            return []
        with self._driver("search"):
            hits = self._query(q, k, with_vectors)
            if any(len(row) < k for row in hits):
                self._fill_short_rows(q, k, with_vectors, hits)
            return hits

    def _fill_short_rows(
        self, q: np.ndarray, k: int, with_vectors: bool, hits: list[list[StoreHit]]
    ) -> None:
        """A search returns ``min(k, count)`` hits or says why: rows an approximate index
        answered short (HNSW graphs over inner product can stop early) are answered by the
        backend's exact scan, or the search is refused naming the shortfall."""
        stored = int(self._count())
        want = min(k, stored)
        short = [n for n, row in enumerate(hits) if len(row) < want]
        if not short:
            return
        exact = self._query_exact(q[short], want, with_vectors)
        if exact is None:
            got = len(hits[short[0]])
            raise StoreError(
                f"{self.location}: the {self.kind} index answered {got} of the {want} hits "
                f"asked (k={k}, {stored} stored) for query "
                f"{short[0]}; {self._short_advice()}"
            )
        for n, row in zip(short, exact, strict=True):
            hits[n] = row

    def delete(self, ids: Sequence[str]) -> int:
        """Remove points; unknown ids are ignored. Returns how many were removed."""
        _, valid = self._lookup(ids)
        if not valid:
            return 0
        with self._driver("delete"):
            return int(self._delete(valid))

    def get(self, ids: Sequence[str]) -> list[StoreRecord | None]:
        """Records (vector + payload) by id, ``None`` where an id is not stored."""
        given, valid = self._lookup(ids)
        if not valid:
            return [None] * len(given)
        with self._driver("read"):
            found = {r.id: r for r in self._fetch(valid)}
        return [found.get(i) for i in given]

    def fetch(self, ids: Sequence[str]) -> list[StoreRecord | None]:
        """Alias of :meth:`get`."""
        return self.get(ids)

    def existing(self, ids: Sequence[str]) -> set[str]:
        """The subset of ``ids`` already stored (what resumable indexing skips)."""
        _, valid = self._lookup(ids)
        if not valid:
            return set()
        with self._driver("read"):
            return set(self._existing(valid)) & set(valid)

    def count(self) -> int:
        """Number of live points."""
        with self._driver("count"):
            return int(self._count())

    def iter_ids(self) -> Iterator[str]:
        """Every stored id (order unspecified)."""
        with self._driver("read"):
            it = iter(self._scan_ids())
        while True:
            with self._driver("read"):
                try:
                    doc_id = next(it)
                except StopIteration:
                    return
            yield doc_id

    def iter_vectors(self, block: int = VECTOR_BLOCK) -> Iterator[tuple[list[str], np.ndarray]]:
        """Every stored (id, vector), ``block`` at a time: (ids, float32 ``(n, dim)`` array).

        What an exact scan over the whole store reads (the server's live recall check): no
        list of every id is built, and the in-memory stores (memory, FAISS, ScaNN) answer
        with read-only views of or batch copies from their own arrays, so a block costs one
        C-level read, not a Python object per vector. Do not keep a block past the next one
        if memory matters; never write into it. A write racing the scan may or may not be
        seen.
        """
        if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
            raise StoreError(f"{self.location}: block must be a positive integer, got {block!r}")
        with self._driver("read"):
            blocks = iter(self._vector_blocks(int(block)))
        while True:
            with self._driver("read"):
                try:
                    ids, vectors = next(blocks)
                except StopIteration:
                    return
            yield ids, vectors

    def read_metadata(self) -> dict[str, Any] | None:
        """The metadata recorded by :meth:`write_metadata`, or ``None`` for a fresh store."""
        with self._driver("read metadata"):
            return self._read_meta()

    def write_metadata(self, meta: Mapping[str, Any]) -> None:
        """Record which model built the store (fingerprint, mode, γ, dimension); secrets are masked."""
        with self._driver("write metadata"):
            self._write_meta(redact_value(dict(meta)))

    def parameters(self) -> dict[str, Any]:
        """Index parameters worth reporting (type, M, ef, nlist, quantization, ...)."""
        with self._driver("describe"):
            return self._describe()

    #: False when this object opened a table or collection that already existed (set by the
    #: database stores); folder stores hold only what magretrieve wrote.
    created_here: bool = True

    def foreign_points(self) -> int:
        """Points that magretrieve did not write (an existing collection without its model
        metadata); writing next to them needs ``force``. 0 for stores only magretrieve fills."""
        if self.created_here or self.read_metadata():
            return 0
        return self.count()

    def persist(self) -> None:  # noqa: B027 - optional hook
        """Make everything added so far durable (atomic where the backend allows)."""

    def has_unsaved_writes(self) -> bool:
        """Whether writes wait for :meth:`persist` (file stores); False where each write is
        already durable in the database."""
        return False

    @property
    def generation(self) -> int | None:
        """The committed state this object holds: a folder store's generation counter
        (None for stores that read their engine's live state)."""
        version = self.version
        return version.generation if version is not None else None

    def disk_generation(self) -> int | None:
        """The generation committed on disk now, by any process (None: no such marker)."""
        version = self.disk_version()
        return version.generation if version is not None else None

    @property
    def version(self) -> StoreVersion | None:
        """The committed state this object holds, id and generation (None: a store that reads
        its engine's live state)."""
        return None

    def disk_version(self) -> StoreVersion | None:
        """The state committed on disk now, by any process (None: no such marker).

        A reader whose :attr:`version` differs from it holds another state than the one
        committed since: a newer generation, or a folder deleted and created again (another
        id, whatever its generation). Reopening the store reads it."""
        return None

    #: Whether :meth:`reload` reads a newer generation into this object. Set where every
    #: open of a folder in one process shares one engine (embedded Chroma), so a second open
    #: beside this one would share its stale state instead of reading the disk.
    reloads_in_place = False

    def reload(self) -> None:
        """Read the newest committed generation into this object (``reloads_in_place``)."""
        raise NotImplementedError

    def optimize(self) -> None:  # noqa: B027 - optional hook
        """Finish a bulk load (train/build indexes); a no-op where nothing is deferred."""

    #: True inside :meth:`bulk_load`.
    bulk_loading: bool = False

    @contextmanager
    def bulk_load(self) -> Iterator[None]:
        """Writes inside are one bulk load that :meth:`optimize` finishes, so a store may leave
        index work to be done once at the end (pgvector builds HNSW after the load). Writes
        outside it are incremental and keep the store's index current."""
        outer, self.bulk_loading = self.bulk_loading, True
        try:
            yield
        finally:
            self.bulk_loading = outer

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release files and connections."""

    def get_vectors(self, ids: Sequence[str]) -> np.ndarray:
        """Stored vectors by id as a float32 ``(n, dim)`` array; unknown ids are an error."""
        records = self.get(ids)
        missing = [i for i, r in zip(ids, records, strict=True) if r is None]
        if missing:
            raise StoreError(
                f"{self.location}: {len(missing)} id(s) not stored, e.g. {missing[0]!r}"
            )
        if not records:
            return np.zeros((0, self.dimension), dtype=np.float32)
        return np.stack([r.vector for r in records]).astype(np.float32)  # type: ignore[union-attr]

    def describe(self) -> dict[str, Any]:
        """Metric, dimension, count, parameters and recorded metadata (secrets masked)."""
        return redact_value(
            {
                "kind": self.kind,
                "location": self.location,
                "metric": self.metric,
                "dimension": self.dimension,
                "count": self.count(),
                "normalizes_vectors": self.normalizes_vectors,
                "parameters": self.parameters(),
                "metadata": self.read_metadata(),
            }
        )

    def __enter__(self) -> VectorStore:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """Leaving a ``with`` block normally saves unsaved writes, as a file or a database
        transaction would; leaving it on an exception keeps the last saved state."""
        try:
            if exc_type is None and self.has_unsaved_writes():
                self.persist()
        finally:
            self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.location} dim={self.dimension}>"


class CollectionStore(VectorStore):
    """A store over one named collection (or table) of a database client: the constructor of
    the database backends (Chroma, LanceDB, Milvus, pgvector and the cosine plug-in stores),
    written once.

    It keeps the ``client``, the ``collection`` name and whether this object owns the client
    (and closes it), checks the index options given (an
    :class:`~magretrieve.stores.options.IndexOptions`, or its keywords, limited to
    :meth:`_index_keywords`), and opens or creates the collection through the lifecycle hooks
    (:meth:`~VectorStore._open_or_create`). A backend adds its own keywords by taking them in
    an ``__init__(self, *args, mine=..., **kwargs)`` that passes the rest on, and fills in

    ======================  ==============================================================
    ``_configure(opts)``    its own checks of the name and options; returns the build
                            options asked for (compared with the recorded ones on reopen)
    ``_opening()``          a context around the open (a transaction, the driver's errors)
    ``_opened(opts)``       what it reads once the collection is open
    ======================  ==============================================================
    """

    #: What the default location calls what it opens (``milvus collection 'c'``).
    noun = "collection"
    #: How a missing one is named (``no Milvus collection 'c' here``).
    label = "collection"
    #: Each write commits in the database, so persisting is a no-op searches need not wait for
    #: (a backend whose flush shares the searches' client says otherwise).
    persists_beside_search = True

    def __init__(
        self,
        client: Any,
        collection: Any,
        dimension: int | None = None,
        *,
        options: IndexOptions | None = None,
        location: str | None = None,
        owns_client: bool = False,
        **knobs: Any,
    ) -> None:
        self.client = client
        self.collection = collection
        #: Whether :meth:`close` closes the client (it was opened for this store).
        self._owns = owns_client
        self._location = location or f"{self.noun} {self._name_shown()!r}"
        opts = IndexOptions.of(options, knobs, self._location, self._index_keywords())
        self.target_recall: float | None = opts.target_recall
        asked = self._configure(opts)
        with self._opening():
            self._open_or_create(dimension, f"{self.label} {self._name_shown()!r}", asked)
        self._opened(opts)

    def _index_keywords(self) -> tuple[str, ...] | None:
        """The index keywords the backend takes (None: every ``IndexOptions`` keyword)."""
        return None

    def _name_shown(self) -> str:
        """The collection's name as messages show it."""
        return str(self.collection)

    def _configure(self, opts: IndexOptions) -> dict[str, Any]:
        """Check the name and the options before anything is opened; return the build
        options asked for. The default asks for every build option given."""
        return opts.build()

    def _opening(self) -> Any:
        """Held while the collection is opened or created (default: nothing)."""
        return nullcontext()

    def _opened(self, opts: IndexOptions) -> None:
        """Called once the collection is open (read what the build recorded, load it)."""

    def close(self) -> None:
        """Close the client when this store opened it (``owns_client``), once."""
        if self._owns:
            self.client.close()
            self._owns = False


@contextmanager
def closed_on_failure(client: Any) -> Iterator[Any]:
    """``client``, made by an opener for the store it builds, closed when building that store
    fails (any error, an interrupt too), so a failed open leaves no connection behind."""
    try:
        yield client
    except BaseException:
        client.close()
        raise


class IdMapMixin:
    """Id-map primitives for stores that keep ids and metadata in process.

    Used by the memory, FAISS and ScaNN stores: each maps every live document id to a row in
    ``_row`` (insertion order) and holds the recorded model metadata in ``_meta`` until
    :meth:`VectorStore.persist` writes it. A change takes the folder's writer lock first
    (the store's ``_begin_write``) and marks the store ``_dirty``, so the next ``persist``
    writes it. List it before :class:`VectorStore` in the bases.
    """

    _row: dict[str, int]
    _meta: dict[str, Any] | None
    _lock: AbstractContextManager[Any]  # an RLock, or the RWLock changes take alone
    _dirty: bool

    def _begin_write(self) -> None:
        """Before the first change: take the folder's writer lock, catch up with disk."""
        raise NotImplementedError

    def has_unsaved_writes(self) -> bool:
        return self._dirty

    def _existing(self, ids: list[str]) -> Iterable[str]:
        return [i for i in ids if i in self._row]

    def _scan_ids(self) -> Iterator[str]:
        return iter(list(self._row))

    def _read_meta(self) -> dict[str, Any] | None:
        return dict(self._meta) if self._meta is not None else None

    def _write_meta(self, meta: dict[str, Any]) -> None:
        with self._lock:
            self._begin_write()
            self._meta = dict(meta)
            self._dirty = True


# ----------------------------------------------------------------------------- validation


def check_batch(
    ids: Sequence[str],
    vectors: np.ndarray,
    payloads: Sequence[Mapping[str, Any]] | None,
    dimension: int,
    where: str,
) -> tuple[list[str], np.ndarray, list[dict[str, Any]]]:
    """Validate one add/upsert batch before anything is written.

    Refuses non-string or empty ids, duplicate ids inside the batch, a wrong shape or
    dimension, and NaN/inf values (the error names the first offending document id).
    """
    ids = list(ids)
    for doc_id in ids:
        problem = id_problem(doc_id)
        if problem is not None:
            raise StoreError(f"{where}: {problem}; nothing of this batch was written")
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise StoreError(f"{where}: duplicate document id {dup!r} in one batch")
    try:
        arr = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:  # strings, ragged lists, objects
        raise StoreError(
            f"{where}: vectors must be numbers ({one_line(exc, 120)}); nothing of this batch "
            "was written"
        ) from None
    if arr.ndim == 1 and len(ids) == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.shape[0] != len(ids):
        raise StoreError(
            f"{where}: expected {len(ids)} vectors of dimension {dimension}, got shape {arr.shape}"
        )
    if arr.shape[1] != dimension:
        raise StoreError(
            f"{where}: vectors have dimension {arr.shape[1]} but the store has dimension {dimension}"
        )
    check_finite(arr, ids, where)
    if payloads is None:
        plist: list[dict[str, Any]] = [{} for _ in ids]
    else:
        payloads = list(payloads)
        if len(payloads) != len(ids):
            raise StoreError(f"{where}: {len(ids)} ids but {len(payloads)} payloads")
        plist = [check_payload(p, i, where) for i, p in zip(ids, payloads, strict=True)]
    return ids, np.ascontiguousarray(arr), plist


_JSON_SCALARS = (str, int, float, bool, type(None))


def id_problem(doc_id: Any) -> str | None:
    """Why no store can hold ``doc_id`` (one line), or None for a valid id.

    Valid: a non-empty string of Unicode scalar values without NUL (PostgreSQL text cannot
    hold NUL, so no store accepts it and every store gives the same answer).
    """
    if not isinstance(doc_id, str) or not doc_id:
        return f"document ids must be non-empty strings, got {doc_id!r:.60}"
    if "\x00" in doc_id:
        return (
            f"document id {doc_id!r:.60} holds a NUL character at position "
            f"{doc_id.index(chr(0))} (no store can keep NUL in an id)"
        )
    at = lone_surrogate(doc_id)  # Qdrant hashes ids as UTF-8; a lone surrogate has none
    if at is not None:
        return f"document id {doc_id!r:.60} holds a lone surrogate at position {at} (not valid Unicode)"
    return None


#: Payload objects and lists may nest this deep. Qdrant Edge stores deeper ones and then
#: cannot read its own write-ahead log back (its decoder stops near 128 levels), which would
#: lose the whole shard; real metadata is a few levels deep.
MAX_PAYLOAD_DEPTH = 32


def check_payload(payload: Any, doc_id: str, where: str) -> dict[str, Any]:
    """A strict-JSON copy of one payload, or a StoreError naming the document and the field.

    Strict JSON: objects with string keys, lists, strings (Unicode, without NUL), finite
    numbers, booleans and null.
    NaN/Infinity (which ``json.dumps`` writes as invalid tokens), dates, sets, bytes, numpy
    values and other objects are refused *before* anything of the batch is written, so one
    bad payload can never leave a store that fails at every later save.
    """
    if payload is None:
        return {}
    if not isinstance(payload, Mapping):
        raise StoreError(
            f"{where}: payload of document {doc_id!r} must be a JSON object (dict), "
            f"got {type(payload).__name__}; nothing of this batch was written"
        )

    low, high = INT64_RANGE

    def walk(value: Any, path: str, depth: int = 0) -> Any:
        if depth > MAX_PAYLOAD_DEPTH:
            raise _bad(path, f"objects and lists nested more than {MAX_PAYLOAD_DEPTH} levels deep")
        if isinstance(value, bool) or value is None:
            return value
        if isinstance(value, str):
            if "\x00" in value:
                raise _bad(path, "a NUL character (no store can keep NUL in a payload string)")
            if (at := lone_surrogate(value)) is not None:
                raise _bad(path, f"a lone surrogate at position {at} (not valid Unicode)")
            return value
        if isinstance(value, int) and type(value) is int:
            if not low <= value <= high:
                raise _bad(path, f"the integer {value}, outside the 64-bit range stores keep")
            return value
        if isinstance(value, float) and type(value) is float:
            if not math.isfinite(value):
                raise _bad(path, f"the number {value!r} (JSON has no NaN/Infinity)")
            return value
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise _bad(path, f"a non-string key {key!r}")
                if "\x00" in key:
                    raise _bad(path, f"the key {key!r}, which holds a NUL character")
                if lone_surrogate(key) is not None:
                    raise _bad(path, f"the key {key!r}, which holds a lone surrogate")
                out[key] = walk(item, f"{path}.{key}" if path else key, depth + 1)
            return out
        if isinstance(value, (list, tuple)):
            return [walk(item, f"{path}[{n}]", depth + 1) for n, item in enumerate(value)]
        raise _bad(path, f"a {type(value).__name__} ({value!r:.40}), which is not JSON")

    def _bad(path: str, what: str) -> StoreError:
        field_name = f"field {path!r}" if path else "payload"
        return StoreError(
            f"{where}: document {doc_id!r}: payload {field_name} holds {what}; "
            "nothing of this batch was written"
        )

    return walk(payload, "")


def missing_store(where: str, what: str) -> StoreError:
    """The one answer of a read-only open (no dimension given) of a store that does not exist:
    it names what is missing and says that nothing was created, whatever the backend."""
    return StoreError(
        f"{where}: no {what} here; the store is missing and nothing was created (check the "
        "spec; writing to a store creates it, e.g. magretrieve index)"
    )


def check_reopen(where: str, recorded: Mapping[str, Any], asked: Mapping[str, Any]) -> None:
    """Refuse build options of a reopen that differ from the ones recorded at creation.

    ``asked`` holds the options given now (None: not given), ``recorded`` what the store was
    built with (None: unknown). Build options shape an index that exists, so a store never
    ignores them silently: it is refused here, the same way on every backend (FAISS's rule).
    """
    from magretrieve.stores import registry  # the registry imports the backends lazily

    for key, value in asked.items():
        old = recorded.get(key)
        if value is None or old is None or _same(old, value):
            continue
        option = registry.OPTIONS.get(key)
        label = option.label if option is not None else key
        raise StoreError(
            f"{where}: {label} {value} differs from the {old} the store was built with; it "
            "cannot change on reopen. Leave it out to use the store as built, or index into a "
            "new store to rebuild"
        )


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, str) and isinstance(new, str):
        return old.strip().upper() == new.strip().upper()
    return bool(old == new)


def metric_refusal(where: str, found: str, native: str, advice: str = "") -> StoreError:
    """The one refusal of a collection, shard or index ranked by anything but the inner
    product: ``found`` names what it uses (``distance Cosine``), ``native`` the backend's
    spelling of the inner product (``Dot``)."""
    return StoreError(
        f"{where} uses {found}; magretrieve needs {native}, the inner product (cosine "
        "normalizes vectors and would erase document magnitude; L2, Euclid and Manhattan rank "
        f"by distance){advice}"
    )


def one_line(exc: BaseException, limit: int = 400) -> str:
    """A driver exception's whole message on one line (libpq puts hints on later lines)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:limit]


def check_finite(arr: np.ndarray, ids: Sequence[str], where: str) -> None:
    """Raise a StoreError naming the first id whose vector holds NaN or inf."""
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise StoreError(
            f"{where}: vector of document {ids[first]!r} contains NaN or inf "
            f"({int(bad.sum())} bad vector(s) in this batch); nothing was written"
        )


def check_queries(queries: np.ndarray, dimension: int, where: str) -> np.ndarray:
    """Queries as a float32 ``(n, dim)`` array; NaN/inf and wrong dimensions refused."""
    try:
        arr = np.asarray(queries, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{where}: query vectors must be numbers ({one_line(exc, 120)})") from None
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.shape[1] != dimension:
        raise StoreError(
            f"{where}: query vectors must have dimension {dimension}, got shape {arr.shape}"
        )
    bad = ~np.isfinite(arr).all(axis=1)
    if bad.any():
        raise StoreError(f"{where}: query vector {int(np.flatnonzero(bad)[0])} contains NaN or inf")
    return np.ascontiguousarray(arr)


def check_k(k: int) -> int:
    if not isinstance(k, (int, np.integer)) or isinstance(k, bool) or k < 1:
        raise StoreError(f"k must be a positive integer, got {k!r}")
    return int(k)


def point_uuid(doc_id: str) -> str:
    """Deterministic point id for a document id, so re-indexing overwrites instead of duplicating."""
    return str(uuid.uuid5(ID_NAMESPACE, doc_id))


def check_payload_keys(
    payload: Mapping[str, Any], reserved: Iterable[str], doc_id: str, where: str = ""
) -> None:
    """Refuse user payload keys that collide with the store's own bookkeeping keys."""
    clash = sorted(set(payload) & set(reserved))
    if clash:
        prefix = f"{where}: " if where else ""
        raise StoreError(
            f"{prefix}document {doc_id!r}: payload key(s) {clash} are reserved by magretrieve "
            "stores; nothing of this batch was written"
        )


def json_safe(value: Any, doc_id: str) -> Any:
    """Round-trip a payload through JSON (refusing NaN) so every backend stores the same thing."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"document {doc_id!r}: payload is not JSON-serializable ({exc})") from None


# ----------------------------------------------------------------------------- files


def plain_file(folder: Path, name: Any, where: str) -> Path:
    """``folder / name`` for a plain file name; a state file naming ``../x`` or ``/x`` is refused.

    Store state files are data: a name leading out of the store folder would make loading
    read (and hand to FAISS/numpy) a file the user never pointed at.
    """
    if not is_plain_file_name(name):
        raise StoreError(
            f"{folder / where}: file name {name!r} is not a plain file name inside {folder}"
        )
    return folder / name


def read_state_file(state_file: Path, fmt: str, what: str) -> dict[str, Any]:
    """A store's JSON state file, refused with its path when unreadable or of another format.

    ``fmt`` is the expected ``"format"`` value, ``what`` names the store kind in the error.
    """
    try:
        state = json.loads(state_file.read_text())
    except (OSError, ValueError) as exc:  # JSON and UTF-8 errors are ValueErrors
        raise StoreError(f"{state_file}: unreadable ({exc})") from None
    if not isinstance(state, dict) or state.get("format") != fmt:
        raise StoreError(f"{state_file}: not a magretrieve {what} store")
    return state


@contextmanager
def reading_store(state_file: Path, *errors: type[BaseException]) -> Iterator[None]:
    """Load a store from its files: what a file with the right checksum but the wrong content
    raises (:data:`MALFORMED`, and the store's own ``errors``) becomes one StoreError naming
    the state file, never a traceback; a StoreError passes as raised."""
    caught: tuple[type[BaseException], ...] = (*MALFORMED, *errors)
    try:
        yield
    except StoreError:
        raise
    except caught as exc:
        raise StoreError(f"{state_file}: malformed store ({type(exc).__name__}: {exc})") from None


def state_metadata(state: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """The ``metadata`` recorded in a store's state file: a JSON object or nothing."""
    meta = state.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise StoreError(f"{where}: 'metadata' must be a JSON object, got {type(meta).__name__}")
    return meta


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder, fsync, then os.replace.

    A crash leaves either the old file or the new one, never a half-written one.
    """
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:  # read-only or missing folder: name the folder, not a temp name
        raise OSError(exc.errno, exc.strerror or str(exc), str(path.parent)) from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.filename is None:
            # a full disk raises ENOSPC from write() without a file name: add the path
            raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode())


def fsync_dir(folder: Path) -> None:
    """fsync a directory so a rename inside it survives a power loss (best effort)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
