"""The plug-in path for an existing Qdrant **Cosine** collection: rank by ``cos·m(d)`` inside Qdrant.

Most deployments hold unit vectors in a Cosine collection and will not re-create it. After
``magretrieve annotate`` has written each point's magnitude ``m(d)`` into its payload (field
``magretrieve_m`` by default, vectors untouched), this store searches such a collection with
Qdrant's query API: a **prefetch** of the ``prefetch`` nearest points by cosine, re-ranked by
the formula ``$score · m`` (a ``FormulaQuery``; it runs in qdrant-client's embedded mode too).

Seen through the :class:`~magretrieve.stores.base.VectorStore` protocol the collection holds
the vectors ``m(d)·d̂``: hits and records carry them, ``doc_norm`` is ``m(d)``, and ``add``
writes ``d̂`` with ``m = ‖v‖`` in the payload. So the :class:`~magretrieve.serving.retriever.Retriever`
explains each score as ``query_norm · doc_norm · cosine`` as with any store, and documents it
adds get their magnitude from the recipe recorded at annotation (like a rescaled store).

The one approximation is the prefetch: a document outside the cosine top-``prefetch`` is never
scored. ``benchmarks/studies/plugin_prefetch.py`` measures recall@10 against exact ``cos·m(d)`` as a
function of the prefetch size; :data:`DEFAULT_PREFETCH` comes from that measurement.

An unannotated Cosine collection is refused as before (Cosine would erase the magnitude).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.stores._qdrant_common import make_payload
from magretrieve.stores.base import (
    StoreHit,
    StoreRecord,
    VectorStore,
    check_batch,
    check_k,
    check_queries,
    point_uuid,
    require,
)

#: Payload field holding m(d) unless the annotation names another.
DEFAULT_FIELD = "magretrieve_m"
#: Cosine candidates re-ranked by the formula (see benchmarks/results/plugin_prefetch.md).
DEFAULT_PREFETCH = 100
#: Key (inside the collection's ``magretrieve`` metadata) of the annotation record.
ANNOTATION_KEY = "annotation"
#: Metadata key of the collection (shared with QdrantStore).
META_KEY = "magretrieve"


def _models() -> Any:
    return require("qdrant_client.models", "qdrant-client", "qdrant")


def _unit(vector: Any) -> np.ndarray:
    """A stored vector's direction (Cosine ranks by it; embedded mode may keep the raw one)."""
    v = np.asarray(vector, dtype=np.float32)
    return v / max(float(np.linalg.norm(v)), 1e-12)


def annotation_of(meta: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The annotation record in a store's metadata, or None when it was never annotated."""
    ann = (meta or {}).get(ANNOTATION_KEY)
    return dict(ann) if isinstance(ann, Mapping) and ann.get("field") else None


def refusal(where: str, collection: str) -> StoreError:
    return StoreError(
        f"{where}: collection {collection!r} uses distance Cosine; magretrieve needs Dot (Cosine normalizes vectors at "
        "upload and would erase document magnitude). Create a new Dot collection, or keep this "
        "one and rank by cos·m(d) after `magretrieve annotate --store SPEC ...` writes m(d) into "
        "its payload"
    )


class QdrantCosineStore(VectorStore):
    """An annotated Cosine collection searched by ``cos·m(d)`` (prefetch + formula)."""

    kind = "qdrant-cosine"

    def __init__(
        self,
        client: Any,
        collection: str,
        dimension: int | None = None,
        *,
        prefetch: int | None = None,
        ef_search: int | None = None,
        owns_client: bool = False,
        location: str | None = None,
        annotating: bool = False,
    ) -> None:
        self.client = client
        self.collection = collection
        self._owns = owns_client
        self._location = location or f"qdrant collection {collection!r}"
        self.ef_search = ef_search
        self.embedded = type(getattr(client, "_client", None)).__name__ == "QdrantLocal"
        self.thread_safe_search = not self.embedded
        info = client.get_collection(collection)
        params = info.config.params.vectors
        if isinstance(params, Mapping):
            raise StoreError(
                f"{self._location} has named vectors {sorted(params)}; magretrieve uses one "
                "unnamed vector per point"
            )
        distance = getattr(params.distance, "value", str(params.distance))
        if distance != "Cosine":
            raise StoreError(f"{self._location} uses distance {distance}, not Cosine")
        if dimension is not None and int(params.size) != int(dimension):
            raise StoreError(
                f"{self._location} has vector size {params.size}, but the model produces "
                f"dimension {dimension}"
            )
        self._dim = int(params.size)
        ann = annotation_of(self.read_metadata())
        if ann is None and not annotating:
            raise refusal(self._location, collection)
        ann = ann or {}
        self.field = str(ann.get("field", DEFAULT_FIELD))
        self.prefetch = int(prefetch or ann.get("prefetch") or DEFAULT_PREFETCH)
        if self.prefetch < 1:
            raise StoreError(f"{self._location}: prefetch must be positive, got {self.prefetch}")

    @property
    def dimension(self) -> int:
        return self._dim

    @property
    def location(self) -> str:
        return self._location

    def _payload_out(self, payload: Mapping[str, Any] | None, point_id: Any) -> tuple[str, dict]:
        """(document id, user payload, m) of a stored point; foreign points use their own id."""
        payload = dict(payload or {})
        doc_id = payload.pop("doc_id", None)
        payload.pop("doc_norm", None)
        payload.pop(self.field, None)
        return (str(doc_id) if doc_id is not None else str(point_id)), payload

    def _m(self, payload: Mapping[str, Any] | None, point_id: Any) -> float:
        value = (payload or {}).get(self.field)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise StoreError(
                f"{self._location}: point {point_id} has no numeric {self.field!r}; run "
                "`magretrieve annotate` again (it fills the points added since)"
            )
        return float(value)

    # ------------------------------------------------------------------ protocol

    def add(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        payloads: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        models = _models()
        ids, arr, plist = check_batch(ids, vectors, payloads, self._dim, self._location)
        norms = np.linalg.norm(arr, axis=1)
        if (norms <= 0).any():
            bad = ids[int(np.flatnonzero(norms <= 0)[0])]
            raise StoreError(f"{self._location}: document {bad!r} has a zero vector")
        points = []
        for doc_id, vec, norm, payload in zip(ids, arr, norms, plist, strict=True):
            if self.field in payload:
                raise StoreError(f"document {doc_id!r}: payload key {self.field!r} is reserved")
            pay = make_payload(doc_id, vec, payload)
            pay[self.field] = float(norm)
            points.append(
                models.PointStruct(id=point_uuid(doc_id), vector=(vec / norm).tolist(), payload=pay)
            )
        if points:
            self.client.upsert(self.collection, points=points, wait=True)
        return len(points)

    def _request(self, row: np.ndarray, k: int, with_vectors: bool) -> Any:
        models = _models()
        params = None
        if self.ef_search is not None and not self.embedded:
            params = models.SearchParams(hnsw_ef=max(self.ef_search, self.prefetch))
        return models.QueryRequest(
            prefetch=models.Prefetch(
                query=row.tolist(), limit=max(self.prefetch, k), params=params
            ),
            query=models.FormulaQuery(
                formula=models.MultExpression(mult=["$score", self.field]),
                defaults={self.field: 0.0},
            ),
            limit=k,
            with_payload=True,
            with_vector=with_vectors,
        )

    def search(
        self, queries: np.ndarray, k: int, *, with_vectors: bool = True
    ) -> list[list[StoreHit]]:
        q = check_queries(queries, self._dim, self._location)
        k = check_k(k)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            res = self.client.query_batch_points(
                self.collection, requests=[self._request(row, k, with_vectors) for row in q]
            )
        out = []
        for response in res:
            hits = []
            for p in response.points:
                m = self._m(p.payload, p.id)
                doc_id, payload = self._payload_out(p.payload, p.id)
                vec = None
                if with_vectors:
                    vec = _unit(p.vector) * np.float32(m)
                hits.append(StoreHit(doc_id, float(p.score), payload, vec, doc_norm=m))
            out.append(hits)
        return out

    def _find(self, ids: Sequence[str], with_vectors: bool) -> dict[str, Any]:
        """Stored points by document id: magretrieve's uuid5 ids, else a ``doc_id`` payload."""
        models = _models()
        ids = [str(i) for i in ids]
        found: dict[str, Any] = {}
        if not ids:
            return found
        for p in self.client.retrieve(
            self.collection,
            ids=[point_uuid(i) for i in ids],
            with_payload=True,
            with_vectors=with_vectors,
        ):
            found[self._payload_out(p.payload, p.id)[0]] = p
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

    def delete(self, ids: Sequence[str]) -> int:
        models = _models()
        found = self._find(ids, with_vectors=False)
        if found:
            self.client.delete(
                self.collection,
                points_selector=models.PointIdsList(points=[p.id for p in found.values()]),
                wait=True,
            )
        return len(found)

    def count(self) -> int:
        return int(self.client.count(self.collection, exact=True).count)

    def get(self, ids: Sequence[str]) -> list[StoreRecord | None]:
        found = self._find(ids, with_vectors=True)
        out: list[StoreRecord | None] = []
        for doc_id in ids:
            p = found.get(str(doc_id))
            if p is None:
                out.append(None)
                continue
            _, payload = self._payload_out(p.payload, p.id)
            vec = _unit(p.vector) * np.float32(self._m(p.payload, p.id))
            out.append(StoreRecord(str(doc_id), vec, payload))
        return out

    def existing(self, ids: Sequence[str]) -> set[str]:
        return set(self._find(ids, with_vectors=False))

    def iter_ids(self) -> Iterator[str]:
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

    def iter_points(self, batch: int = 512) -> Iterator[list[Any]]:
        """Every point (id, unit vector, payload), page by page: what annotate reads."""
        offset = None
        while True:
            points, offset = self.client.scroll(
                self.collection, limit=batch, offset=offset, with_payload=True, with_vectors=True
            )
            if points:
                yield points
            if offset is None:
                return

    def set_magnitudes(self, points: Sequence[Any], magnitudes: np.ndarray) -> None:
        """Write ``m`` (and ``doc_id``/``doc_norm``) into the payload of ``points``; vectors stay."""
        models = _models()
        ops = []
        for p, m in zip(points, magnitudes, strict=True):
            doc_id = self._payload_out(p.payload, p.id)[0]
            ops.append(
                models.SetPayloadOperation(
                    set_payload=models.SetPayload(
                        payload={self.field: float(m), "doc_id": doc_id, "doc_norm": float(m)},
                        points=[p.id],
                    )
                )
            )
        if ops:
            self.client.batch_update_points(self.collection, update_operations=ops, wait=True)

    def read_metadata(self) -> dict[str, Any] | None:
        meta = self.client.get_collection(self.collection).config.metadata or {}
        value = meta.get(META_KEY)
        return dict(value) if value else None

    def write_metadata(self, meta: Mapping[str, Any]) -> None:
        self.client.update_collection(self.collection, metadata={META_KEY: dict(meta)})

    def parameters(self) -> dict[str, Any]:
        return {
            "distance": "Cosine",
            "ranking": f"$score * {self.field} over a cosine prefetch",
            "prefetch": self.prefetch,
            "field": self.field,
            "index": "exact (embedded mode)" if self.embedded else "hnsw",
        }

    def close(self) -> None:
        if self._owns:
            self.client.close()
