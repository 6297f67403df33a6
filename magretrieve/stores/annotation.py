"""The annotation protocol, declared once: what ``magretrieve annotate`` needs from a store.

An *annotatable* store is an existing collection or table ranked by cosine that magretrieve
did not build and does not rebuild (a Qdrant Cosine collection, a pgvector table with a
``vector_cosine_ops`` index). ``magretrieve annotate`` writes each document's magnitude
``m(d)`` beside its vector (a payload field, a column) and records the recipe in the store's
metadata; from then on the store ranks by ``cos·m(d)`` inside the database: a cosine
prefetch of ``prefetch`` candidates re-ranked by ``cos·m``.

:class:`AnnotatableStore` is that protocol. It is a :class:`~magretrieve.stores.base.VectorStore`
like any other: a backend implements the store primitives (``_query``, ``_delete``,
``_fetch``, ...; it shows each point as the vector ``m(d)·d̂``), so the base's id, payload,
query and error rules apply to it unchanged. On top it implements the annotation primitives,
which the public methods here wrap with the same checks and one-line errors:

==================================  ===================================================
``_pages(batch)``                   every stored point (``.id``, ``.vector``, ``.payload``)
                                    page by page, as stored: what annotate reads
``_user_data_in(field, meta)``      why ``field`` holds data magretrieve did not write
``_begin_annotation(field, meta)``  create ``field`` if needed and record ``meta`` (with
                                    its incomplete marker) before any m is written
``_set_magnitudes(points, mags)``   write m of these points (vectors stay)
``_unannotated()``                  points without m (added after the annotation)
==================================  ===================================================

Shared here, once for every backend: while the metadata holds the ``incomplete`` marker a
search ranks by plain cosine (``m = 1``, one logged warning), :meth:`AnnotatableStore.describe`
warns about that and about points without m, and rows the cosine index answered short are
filled by the exact ``cos·m`` scan.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.redact import redact_value
from magretrieve.stores.base import CollectionStore, StoreHit, StoreRecord, VectorStore
from magretrieve.stores.options import AnnotatedOptions, IndexOptions

#: Payload field (Qdrant) or column (pgvector) holding m(d) unless the annotation names another.
DEFAULT_FIELD = "magretrieve_m"
#: Cosine candidates re-ranked by the formula (see benchmarks/results/plugin_prefetch.md).
DEFAULT_PREFETCH = 100
#: ``annotate --prefetch``: the prefetch an annotation records as the default of its searches.
#: It is the annotated store's search option (:class:`~magretrieve.stores.options.
#: AnnotatedOptions`: the same flag and bounds), told from the side of the one writing it.
RECORDED_PREFETCH = dataclasses.replace(
    AnnotatedOptions.named("prefetch"),
    help="Cosine candidates re-ranked by cos·m(d) at search time, recorded as the default "
    "(100; see docs/stores.md for recall by prefetch size).",
    search=False,
)
#: Key (inside the store's ``magretrieve`` metadata) of the annotation record.
ANNOTATION_KEY = "annotation"
#: Key (inside the metadata) present while an annotation has not finished.
INCOMPLETE_KEY = "incomplete"
#: Payload keys magretrieve writes besides m(d); a --field may not name them.
RESERVED_FIELDS = ("doc_id", "doc_norm")
#: A field magretrieve may create: a plain identifier that is the same in a payload key, a
#: formula variable and (unquoted or quoted) a PostgreSQL column, at most 63 bytes.
FIELD_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

logger = logging.getLogger(__name__)


def annotation_of(meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The annotation record in a store's metadata, or None when it was never annotated."""
    ann = (meta or {}).get(ANNOTATION_KEY)
    return dict(ann) if isinstance(ann, Mapping) and ann.get("field") else None


def is_incomplete(meta: Mapping[str, Any] | None) -> bool:
    """Is an annotation (or rescale) of this store running or interrupted?"""
    return bool((meta or {}).get(INCOMPLETE_KEY))


def check_field_name(field: str, where: str) -> None:
    """Refuse a field name magretrieve cannot own safely (reserved, nested, quoted, too long)."""
    if field in RESERVED_FIELDS:
        raise StoreError(f"{where}: --field {field!r} is reserved by magretrieve; choose another")
    if not isinstance(field, str) or not FIELD_PATTERN.fullmatch(field):
        raise StoreError(
            f"{where}: --field {str(field)[:80]!r} is not a plain name (letters, digits, _; at "
            "most 63 bytes, not starting with a digit)"
        )


def fallback_warning(where: str) -> None:
    logger.warning(
        "%s: marked incomplete (an annotate is running or was interrupted): ranking by plain "
        "cosine until it finishes; if it was interrupted, run the same `magretrieve annotate` "
        "again",
        where,
    )


def annotation_warnings(where: str, meta: Mapping[str, Any] | None, missing: int) -> list[str]:
    """What ``describe`` warns about on an annotated store: incomplete, points without m."""
    out = []
    if is_incomplete(meta):
        out.append(
            f"{where}: marked incomplete (an annotate is running or was interrupted); searches "
            "rank by plain cosine until the same `magretrieve annotate` finishes"
        )
    if missing:
        out.append(
            f"{where}: {missing} point(s) added after the annotation have no m(d) and are "
            "scored with m = 1; run `magretrieve annotate` again to give them theirs"
        )
    return out


def unit(vector: Any) -> np.ndarray:
    """A stored vector's direction (cosine ranks by it; the store may keep the raw vector)."""
    v = np.asarray(vector, dtype=np.float32)
    return v / max(float(np.linalg.norm(v)), 1e-12)


class StoredPoint(Protocol):
    """One point as annotate reads it and hands it back to :meth:`AnnotatableStore.set_magnitudes`."""

    @property
    def id(self) -> Any: ...

    @property
    def vector(self) -> Any: ...

    @property
    def payload(self) -> Any: ...


class _Directions:
    """A store's points seen as their directions ``d̂`` (m = 1): what the exact scan reads
    while the store is marked incomplete, so it ranks by plain cosine as the index does."""

    def __init__(self, store: AnnotatableStore) -> None:
        self._store = store

    def _scan_ids(self) -> Iterator[str]:
        return self._store._scan_ids()

    def _fetch(self, ids: list[str]) -> list[StoreRecord]:
        return [StoreRecord(r.id, unit(r.vector), r.payload) for r in self._store._fetch(ids)]


class AnnotatableStore(CollectionStore):
    """An existing store ranked by cosine, searched by ``cos·m(d)`` once annotated (see module doc).

    ``field`` names where m(d) lives, ``prefetch`` how many cosine candidates a search
    re-ranks. A point's vector, seen through the store protocol, is ``m(d)·d̂``; a point
    without m counts as ``m = 1``. It is opened as any collection store (its opener found it
    ranked by cosine; nothing is created): its ``_open_existing`` checks the layout, then
    the annotation recorded in its metadata sets ``field`` and ``prefetch``.
    """

    field: str = DEFAULT_FIELD
    prefetch: int = DEFAULT_PREFETCH
    #: True while searches rank by plain cosine because the store is marked incomplete.
    _fallback: bool = False

    def __init__(
        self, *args: Any, prefetch: int | None = None, annotating: bool = False, **kwargs: Any
    ) -> None:
        """Over ``client`` and ``collection`` (see :class:`CollectionStore`), which takes
        ``ef_search``; ``prefetch`` (default: the annotation's) and ``annotating`` (opened by
        ``magretrieve annotate``: a store not annotated yet is not refused)."""
        self._prefetch_asked = prefetch
        self._annotating = annotating
        super().__init__(*args, **kwargs)

    def _index_keywords(self) -> tuple[str, ...]:
        return ("ef_search",)

    def _configure(self, opts: IndexOptions) -> dict[str, Any]:
        self.ef_search = opts.hnsw.ef_search
        return {}

    def _exists(self) -> bool:
        """Its opener found it (an annotation never creates a store)."""
        return True

    def _opened(self, opts: IndexOptions) -> None:
        ann = annotation_of(self.read_metadata())
        if ann is None and not self._annotating:
            raise self._refusal()
        ann = ann or {}
        self.field = str(ann.get("field", self.field))
        self.prefetch = int(self._prefetch_asked or ann.get("prefetch") or DEFAULT_PREFETCH)
        if self.prefetch < 1:
            raise StoreError(f"{self.location}: prefetch must be positive, got {self.prefetch}")

    @abstractmethod
    def _refusal(self) -> StoreError:
        """The refusal of a store not annotated yet (its cosine erases the magnitude)."""

    # ------------------------------------------------------------------ annotation primitives

    @abstractmethod
    def _pages(self, batch: int) -> Iterator[list[StoredPoint]]:
        """Every stored point, page by page, with its stored vector and whole payload."""

    @abstractmethod
    def _user_data_in(self, field: str, meta: Mapping[str, Any] | None) -> str | None:
        """Why writing ``field`` would overwrite data magretrieve did not write (None: safe)."""

    @abstractmethod
    def _begin_annotation(self, field: str, meta: dict[str, Any]) -> None:
        """Create ``field`` if needed and record ``meta``, in one step."""

    @abstractmethod
    def _set_magnitudes(self, points: Sequence[StoredPoint], magnitudes: list[float]) -> None:
        """Write m of ``points`` (one value each); the vectors stay as they are."""

    @abstractmethod
    def _unannotated(self) -> int:
        """Points without m: added after the annotation, scored with m = 1."""

    # ------------------------------------------------------------------ the protocol annotate uses

    def iter_points(self, batch: int = 512) -> Iterator[list[StoredPoint]]:
        """Every stored point (``.id``, stored ``.vector``, ``.payload``), page by page."""
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise StoreError(
                f"{self.location}: page size must be a positive integer, got {batch!r}"
            )
        with self._driver("read"):
            pages = iter(self._pages(batch))
        while True:
            with self._driver("read"):
                try:
                    page = next(pages)
                except StopIteration:
                    return
            yield page

    def field_holds_user_data(self, field: str, meta: Mapping[str, Any] | None) -> str | None:
        """Why writing ``field`` would overwrite data magretrieve did not write (None: safe).

        A field is magretrieve's only when the annotation record (complete or marked
        incomplete) names it; any other one holding data is the user's.
        """
        check_field_name(field, self.location)
        with self._driver("read"):
            return self._user_data_in(field, meta)

    def begin_annotation(self, field: str, meta: Mapping[str, Any]) -> None:
        """Make ``field`` the one m(d) goes into and record ``meta`` (with its incomplete
        marker) before any m is written: from here searches rank by plain cosine."""
        check_field_name(field, self.location)
        if not is_incomplete(meta):
            raise StoreError(
                f"{self.location}: an annotation begins marked {INCOMPLETE_KEY!r}, so that no "
                "search mixes old and new magnitudes"
            )
        with self._driver("begin annotation"):
            self._begin_annotation(field, redact_value(dict(meta)))
        self.field = field

    def set_magnitudes(self, points: Sequence[StoredPoint], magnitudes: Iterable[float]) -> None:
        """Write m(d) of ``points`` (as :meth:`iter_points` gave them); the vectors stay."""
        mags = np.asarray(list(magnitudes), dtype=np.float64)
        if mags.ndim != 1 or len(mags) != len(points):
            raise StoreError(
                f"{self.location}: {len(points)} points but {mags.size} magnitudes; nothing "
                "was written"
            )
        if not np.isfinite(mags).all() or (mags <= 0).any():
            raise StoreError(
                f"{self.location}: m(d) must be finite and positive; nothing was written"
            )
        if not len(points):
            return
        with self._driver("annotate"):
            self._set_magnitudes(points, [float(m) for m in mags])

    def unannotated(self) -> int:
        """Points with no m(d): added after the annotation, scored with m = 1."""
        with self._driver("count"):
            return int(self._unannotated())

    # ------------------------------------------------------------------ shared behaviour

    def _ranks_by_cosine(self) -> bool:
        """True while the store is marked incomplete: search then ranks by plain cosine
        (never by a mix of old and new magnitudes), warning once each time it starts."""
        incomplete = is_incomplete(self._read_meta())
        if incomplete and not self._fallback:
            fallback_warning(self.location)
        self._fallback = incomplete
        return incomplete

    def _query_exact(
        self, queries: np.ndarray, k: int, with_vectors: bool
    ) -> list[list[StoreHit]] | None:
        """Rows the cosine index answered short: the exact ``cos·m`` over every point. The
        query's norm does not count (the database ranks by cosine), and while the store is
        marked incomplete every m is 1, as in :meth:`_query`."""
        norms = np.linalg.norm(queries.astype(np.float64), axis=1, keepdims=True)
        units = (queries / np.maximum(norms, 1e-12)).astype(np.float32)
        source: Any = _Directions(self) if self._fallback else self
        return VectorStore._query_exact(source, units, k, with_vectors)

    def _short_advice(self) -> str:
        return "raise --prefetch or --ef-search"

    def describe(self) -> dict[str, Any]:
        """The store's description, with warnings: marked incomplete, points without m."""
        out = super().describe()
        out["warnings"] = annotation_warnings(
            self.location, out.get("metadata"), self.unannotated()
        )
        return out
