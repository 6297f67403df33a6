"""The plug-in path for an existing Qdrant **Cosine** collection: rank by ``cos·m(d)`` inside Qdrant.

Most deployments hold unit vectors in a Cosine collection and will not re-create it. After
``magretrieve annotate`` has written each point's magnitude ``m(d)`` into its payload (field
``magretrieve_m`` by default, vectors untouched), this store searches such a collection with
Qdrant's query API: a **prefetch** of the ``prefetch`` nearest points by cosine, re-ranked by
the formula ``$score · m`` (a ``FormulaQuery``; it runs in qdrant-client's embedded mode too).

It is an :class:`~magretrieve.stores.annotation.AnnotatableStore`: it implements the store
primitives, so the base's id, payload and query rules apply as on every store, and the
annotation primitives ``magretrieve annotate`` drives. Seen through the store protocol the
collection holds the vectors ``m(d)·d̂``: hits and records carry them, ``doc_norm`` is
``m(d)``, and ``add`` writes ``d̂`` with ``m = ‖v‖`` in the payload. So the
:class:`~magretrieve.serving.retriever.Retriever` explains each score as
``query_norm · doc_norm · cosine`` as with any store, and documents it adds get their
magnitude from the recipe recorded at annotation (like a rescaled store).

The one approximation is the prefetch: a document outside the cosine top-``prefetch`` is never
scored. ``benchmarks/studies/plugin_prefetch.py`` measures recall@10 against exact ``cos·m(d)`` as a
function of the prefetch size; :data:`DEFAULT_PREFETCH` comes from that measurement.

Points another pipeline adds after the annotation have no ``m``: they are scored with
``m = 1`` (never dropped), and :meth:`QdrantCosineStore.describe` counts them in a warning
until ``magretrieve annotate`` runs again. While an annotation runs (or after one was
interrupted) the metadata holds an ``incomplete`` marker: search then ranks by plain cosine
(one logged warning), never by a mix of old and new magnitudes, and the Retriever refuses to
open the collection until the same command has finished.

An unannotated Cosine collection is refused as before (Cosine would erase the magnitude).
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.extras import require
from magretrieve.stores._qdrant_common import point_payload
from magretrieve.stores.annotation import (
    ANNOTATION_KEY,
    DEFAULT_FIELD,
    DEFAULT_PREFETCH,
    FIELD_PATTERN,
    INCOMPLETE_KEY,
    RESERVED_FIELDS,
    AnnotatableStore,
    StoredPoint,
    annotation_of,
    annotation_warnings,
    check_field_name,
    fallback_warning,
    is_incomplete,
    unit,
)
from magretrieve.stores.base import (
    Batch,
    StoreHit,
    StoreRecord,
    check_payload_keys,
    point_uuid,
)
from magretrieve.stores.options import IndexOptions

# The annotation names below live in magretrieve.stores.annotation and stay importable here.
__all__ = [
    "ANNOTATION_KEY",
    "DEFAULT_FIELD",
    "DEFAULT_PREFETCH",
    "FIELD_PATTERN",
    "INCOMPLETE_KEY",
    "META_KEY",
    "RESERVED_FIELDS",
    "QdrantCosineStore",
    "annotation_of",
    "annotation_warnings",
    "check_field_name",
    "fallback_warning",
    "is_incomplete",
    "refusal",
]

#: Metadata key of the collection (shared with QdrantStore).
META_KEY = "magretrieve"


def _models() -> Any:
    return require("qdrant_client.models")


def refusal(where: str, collection: str) -> StoreError:
    return StoreError(
        f"{where}: collection {collection!r} uses distance Cosine; magretrieve needs Dot (Cosine "
        "normalizes vectors at upload and would erase document magnitude). Create a new Dot "
        "collection, or keep this one and rank by cos·m(d) after `magretrieve annotate --store "
        "SPEC ...` writes m(d) into its payload"
    )


def _point_id(doc_id: str) -> int | str | None:
    """``doc_id`` as a Qdrant point id (unsigned integer or UUID), or None when it is neither."""
    if doc_id.isascii() and doc_id.isdigit() and int(doc_id) < 2**64:
        return int(doc_id)
    try:
        return str(uuid.UUID(doc_id)) if len(doc_id) in (32, 36) else None
    except ValueError:
        return None


class QdrantCosineStore(AnnotatableStore):
    """An annotated Cosine collection searched by ``cos·m(d)`` (prefetch + formula).

    ``QdrantCosineStore(client, collection, dimension, prefetch=…, ef_search=…, …)``.
    """

    kind = "qdrant-cosine"
    noun = "qdrant collection"

    def _configure(self, opts: IndexOptions) -> dict[str, Any]:
        self.embedded = type(getattr(self.client, "_client", None)).__name__ == "QdrantLocal"
        self.thread_safe_search = not self.embedded
        return super()._configure(opts)

    def _open_existing(self, dimension: int | None) -> int:
        params = self.client.get_collection(self.collection).config.params.vectors
        if isinstance(params, Mapping):
            raise StoreError(
                f"{self._location} has named vectors {sorted(params)}; magretrieve uses one "
                "unnamed vector per point"
            )
        distance = getattr(params.distance, "value", str(params.distance))
        if distance != "Cosine":
            raise StoreError(f"{self._location} uses distance {distance}, not Cosine")
        return int(params.size)

    def _refusal(self) -> StoreError:
        return refusal(self._location, self.collection)

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        exceptions = require("qdrant_client.http.exceptions")
        return (exceptions.ApiException, ValueError, RuntimeError, OSError)

    def _payload_out(
        self, payload: Mapping[str, Any] | None, point_id: Any
    ) -> tuple[str, dict[str, Any]]:
        """(document id, user payload) of a stored point; foreign points use their own id."""
        payload = dict(payload or {})
        doc_id = payload.pop("doc_id", None)
        payload.pop("doc_norm", None)
        payload.pop(self.field, None)
        return (str(doc_id) if doc_id is not None else str(point_id)), payload

    def _m(self, payload: Mapping[str, Any] | None, point_id: Any) -> float:
        """m(d) of a point; 1 for a point added after the annotation (see :meth:`describe`)."""
        value = (payload or {}).get(self.field)
        if value is None:
            return 1.0
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise StoreError(
                f"{self._location}: point {point_id} holds a non-numeric {self.field!r}; run "
                "`magretrieve annotate` again"
            )
        return float(value)

    # ------------------------------------------------------------------ store primitives

    def _upsert(self, batch: Batch) -> None:
        """Write ``d̂`` with ``m = ‖v‖`` in the payload (a checked batch: ids, JSON payloads)."""
        models = _models()
        zero = np.flatnonzero(batch.norms <= 0)
        if len(zero):
            raise StoreError(
                f"{self._location}: document {batch.ids[int(zero[0])]!r} has a zero vector (it "
                "has no direction to rank by cosine); nothing of this batch was written"
            )
        points = []
        for doc_id, vec, payload, norm in batch.rows():
            check_payload_keys(payload, (self.field,), doc_id, self._location)
            pay = point_payload(doc_id, payload, norm)
            pay[self.field] = norm
            points.append(
                models.PointStruct(id=point_uuid(doc_id), vector=(vec / norm).tolist(), payload=pay)
            )
        self.client.upsert(self.collection, points=points, wait=True)

    def _request(self, row: np.ndarray, k: int, with_vectors: bool, cosine: bool = False) -> Any:
        models = _models()
        params = None
        if self.ef_search is not None and not self.embedded:
            params = models.SearchParams(hnsw_ef=max(self.ef_search, self.prefetch))
        if cosine:  # marked incomplete: plain cosine, no magnitude at all
            return models.QueryRequest(
                query=row.tolist(),
                limit=k,
                params=params,
                with_payload=True,
                with_vector=with_vectors,
            )
        return models.QueryRequest(
            prefetch=models.Prefetch(
                query=row.tolist(), limit=max(self.prefetch, k), params=params
            ),
            query=models.FormulaQuery(
                formula=models.MultExpression(mult=["$score", self.field]),
                defaults={self.field: 1.0},  # points added since the annotation
            ),
            limit=k,
            with_payload=True,
            with_vector=with_vectors,
        )

    def _query(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        cosine = self._ranks_by_cosine()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            res = self.client.query_batch_points(
                self.collection,
                requests=[self._request(row, k, with_vectors, cosine) for row in q],
            )
        out = []
        for response in res:
            hits = []
            for p in response.points:
                m = 1.0 if cosine else self._m(p.payload, p.id)
                doc_id, payload = self._payload_out(p.payload, p.id)
                vec = unit(p.vector) * np.float32(m) if with_vectors else None
                hits.append(StoreHit(doc_id, float(p.score), payload, vec, doc_norm=m))
            out.append(hits)
        return out

    def _find(self, ids: list[str], with_vectors: bool) -> dict[str, Any]:
        """Stored points by document id: magretrieve's uuid5 ids, else a ``doc_id`` payload."""
        models = _models()
        found: dict[str, Any] = {}
        for p in self.client.retrieve(
            self.collection,
            ids=[point_uuid(i) for i in ids],
            with_payload=True,
            with_vectors=with_vectors,
        ):
            found[self._payload_out(p.payload, p.id)[0]] = p
        # points another pipeline wrote (and nobody annotated since) have no doc_id: their
        # document id is their own point id (an unsigned integer or a UUID)
        raw = [_point_id(i) for i in ids if i not in found]
        for p in self.client.retrieve(
            self.collection,
            ids=[r for r in raw if r is not None],
            with_payload=True,
            with_vectors=with_vectors,
        ):
            doc_id = self._payload_out(p.payload, p.id)[0]
            if doc_id in ids:
                found.setdefault(doc_id, p)
        rest = [i for i in ids if i not in found]
        if rest:
            flt = models.Filter(
                must=[models.FieldCondition(key="doc_id", match=models.MatchAny(any=rest))]
            )
            offset = None
            while True:
                points, offset = self.client.scroll(
                    self.collection,
                    scroll_filter=flt,
                    limit=1024,
                    offset=offset,
                    with_payload=True,
                    with_vectors=with_vectors,
                )
                for p in points:
                    found[self._payload_out(p.payload, p.id)[0]] = p
                if offset is None:
                    break
        return found

    def _delete(self, ids: list[str]) -> int:
        models = _models()
        found = self._find(ids, with_vectors=False)
        if found:
            self.client.delete(
                self.collection,
                points_selector=models.PointIdsList(points=[p.id for p in found.values()]),
                wait=True,
            )
        return len(found)

    def _count(self) -> int:
        return int(self.client.count(self.collection, exact=True).count)

    def _fetch(self, ids: list[str]) -> Iterable[StoreRecord]:
        out = []
        for doc_id, p in self._find(ids, with_vectors=True).items():
            _, payload = self._payload_out(p.payload, p.id)
            out.append(
                StoreRecord(doc_id, unit(p.vector) * np.float32(self._m(p.payload, p.id)), payload)
            )
        return out

    def _existing(self, ids: list[str]) -> Iterable[str]:
        return list(self._find(ids, with_vectors=False))

    def _scan_ids(self) -> Iterator[str]:
        offset = None
        while True:
            points, offset = self.client.scroll(
                self.collection,
                limit=1024,
                offset=offset,
                with_payload=["doc_id"],
                with_vectors=False,
            )
            for p in points:
                yield self._payload_out(p.payload, p.id)[0]
            if offset is None:
                return

    def _read_meta(self) -> dict[str, Any] | None:
        meta = self.client.get_collection(self.collection).config.metadata or {}
        value = meta.get(META_KEY)
        return dict(value) if value else None

    def _write_meta(self, meta: dict[str, Any]) -> None:
        self.client.update_collection(self.collection, metadata={META_KEY: dict(meta)})

    def _describe(self) -> dict[str, Any]:
        return {
            "distance": "Cosine",
            "ranking": f"$score * {self.field} over a cosine prefetch",
            "prefetch": self.prefetch,
            "field": self.field,
            "index": "exact (embedded mode)" if self.embedded else "hnsw",
        }

    # ------------------------------------------------------------------ annotation primitives

    def _pages(self, batch: int) -> Iterator[list[StoredPoint]]:
        offset = None
        while True:
            points, offset = self.client.scroll(
                self.collection, limit=batch, offset=offset, with_payload=True, with_vectors=True
            )
            if points:
                yield points
            if offset is None:
                return

    def _user_data_in(self, field: str, meta: Mapping[str, Any] | None) -> str | None:
        """The field (and ``doc_norm``, written beside it) is ours only when the annotation
        record names it; otherwise any point holding it holds user data."""
        ann = annotation_of(meta)
        if ann is not None and ann.get("field") == field:
            return None
        keys = [field] if ann is not None else [field, "doc_norm"]
        held = dict.fromkeys(keys, 0)
        offset = None
        while True:  # key presence, exactly: a null or an empty list is the user's too
            points, offset = self.client.scroll(
                self.collection, limit=1024, offset=offset, with_payload=keys, with_vectors=False
            )
            for p in points:
                for key in keys:
                    held[key] += key in (p.payload or {})
            if offset is None:
                break
        for key, count in held.items():
            if count:
                return f"payload key {key!r} of {count} point(s)"
        return None

    def _begin_annotation(self, field: str, meta: dict[str, Any]) -> None:
        """The payload field needs no creating: recording ``meta`` is the whole step."""
        self._write_meta(meta)

    def _set_magnitudes(self, points: Sequence[StoredPoint], magnitudes: list[float]) -> None:
        """Write ``m`` (and ``doc_id``/``doc_norm``) into the payload of ``points``."""
        models = _models()
        ops = []
        for p, m in zip(points, magnitudes, strict=True):
            doc_id = self._payload_out(p.payload, p.id)[0]
            ops.append(
                models.SetPayloadOperation(
                    set_payload=models.SetPayload(
                        payload={self.field: m, "doc_id": doc_id, "doc_norm": m},
                        points=[p.id],
                    )
                )
            )
        self.client.batch_update_points(self.collection, update_operations=ops, wait=True)

    def _unannotated(self) -> int:
        models = _models()
        return int(
            self.client.count(
                self.collection,
                count_filter=models.Filter(
                    must=[models.IsEmptyCondition(is_empty=models.PayloadField(key=self.field))]
                ),
                exact=True,
            ).count
        )
