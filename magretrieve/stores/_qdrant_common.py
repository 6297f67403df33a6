"""What the two Qdrant backends (qdrant-client and Qdrant Edge) share, written once.

Both store the same points (``uuid5`` ids, ``doc_id``/``doc_norm`` payload), refuse the same
collection layouts, scale int8-quantized queries the same way and read the same point objects
back (``.id``, ``.payload``, ``.vector``, ``.score``); only the client calls differ. Each helper
here takes the client-specific part as an argument (an API module, a factory or a callable),
so a rule changed here changes in both backends at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.stores.base import (
    StoreHit,
    StoreRecord,
    check_payload_keys,
    json_safe,
    metric_refusal,
    point_uuid,
)

#: Payload keys owned by magretrieve in Qdrant points.
RESERVED = ("doc_id", "doc_norm")


def make_payload(doc_id: str, vector: np.ndarray, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The point payload: the user's fields plus ``doc_id`` and the stored vector's norm."""
    check_payload_keys(payload, RESERVED, doc_id)
    out = json_safe(dict(payload), doc_id)
    out["doc_id"] = doc_id
    out["doc_norm"] = float(np.linalg.norm(vector))
    return out


def point_payload(doc_id: str, payload: dict[str, Any], norm: float) -> dict[str, Any]:
    """The point payload of a checked batch row (reserved keys already refused)."""
    return {**payload, "doc_id": doc_id, "doc_norm": float(norm)}


def split_payload(payload: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    """(document id, the user's payload) from a stored point payload."""
    doc_id, user, _ = split_payload_norm(payload)
    return doc_id, user


def split_payload_norm(
    payload: Mapping[str, Any] | None,
) -> tuple[str, dict[str, Any], float | None]:
    """(document id, the user's payload, the stored ``doc_norm``) from a point payload."""
    payload = dict(payload or {})
    doc_id = payload.pop("doc_id", None)
    norm = payload.pop("doc_norm", None)
    if doc_id is None:
        raise StoreError("a point without a 'doc_id' payload: not written by magretrieve")
    return str(doc_id), payload, (float(norm) if isinstance(norm, (int, float)) else None)


def quantized_query_factors(queries: np.ndarray, doc_norm_mean: float | None) -> np.ndarray:
    """Per-query factors that bring unit-norm queries to the stored vectors' scale.

    Qdrant's int8 scalar quantization quantizes the *query* with the stored vectors' value
    range. When documents keep their magnitude (norms ≫ 1) and queries are unit-norm, a query
    falls into one or two int8 levels and the quantized dot product is mostly noise, which
    rescoring cannot fully repair. Scaling each query to the mean stored norm changes no
    ranking (a positive factor per query), restores int8 precision, and the scores are
    divided by the same factor on the way back.
    """
    if doc_norm_mean is None or not np.isfinite(doc_norm_mean) or doc_norm_mean <= 0:
        return np.ones(len(queries), dtype=np.float32)
    qn = np.linalg.norm(queries, axis=1)
    return (doc_norm_mean / np.maximum(qn, 1e-12)).astype(np.float32)


def mean_doc_norm(payloads: Iterable[Mapping[str, Any] | None]) -> float:
    """Mean ``doc_norm`` over a sample of stored payloads (1.0 when none carries one)."""
    norms = [p["doc_norm"] for p in payloads if "doc_norm" in (p or {})]  # type: ignore[index]
    return float(np.mean(norms)) if norms else 1.0


def check_vector_params(
    where: str,
    distance: Any,
    size: Any,
    dimension: int | None,
    *,
    advice: str = "",
) -> int:
    """Refuse a collection/shard that is not searched by Dot or has the wrong size.

    ``distance`` is the distance's name as Qdrant spells it ("Dot", "Cosine", ...). Returns
    the collection's vector size.
    """
    if distance != "Dot":
        raise metric_refusal(where, f"distance {distance}", "Dot", advice)
    if dimension is not None and int(size) != int(dimension):
        raise StoreError(
            f"{where} has vector size {size}, but the model produces dimension {dimension}"
        )
    return int(size)


def search_params(
    api: Any,
    ef_search: int | None,
    quantization: str | None,
    rescore: bool,
    oversampling: float,
    exact: bool = False,
) -> Any:
    """``api.SearchParams`` for ef_search and quantized rescoring, or None when neither is set;
    ``exact``: Qdrant's exact search (``exact=True``: no HNSW graph, no quantized vectors).

    ``api`` is ``qdrant_client.models`` or the ``qdrant_edge`` module: both spell these
    classes and their keywords the same way.
    """
    if exact:
        ignore = api.QuantizationSearchParams(ignore=True) if quantization else None
        return api.SearchParams(exact=True, quantization=ignore)
    quant = (
        api.QuantizationSearchParams(rescore=rescore, oversampling=oversampling)
        if quantization
        else None
    )
    if ef_search is None and quant is None:
        return None
    return api.SearchParams(hnsw_ef=ef_search, quantization=quant)


def to_hits(
    results: Iterable[Iterable[Any]], factors: np.ndarray, with_vectors: bool
) -> list[list[StoreHit]]:
    """Scored points per query -> hits, each score divided back by its query's factor."""
    out = []
    for points, factor in zip(results, factors, strict=True):
        hits = []
        for p in points:
            doc_id, payload, norm = split_payload_norm(p.payload)
            vec = np.asarray(p.vector, dtype=np.float32) if with_vectors else None
            if norm is None and vec is not None:
                norm = float(np.linalg.norm(vec))
            hits.append(StoreHit(doc_id, float(p.score) / float(factor), payload, vec, norm))
        out.append(hits)
    return out


def records_in_order(ids: Sequence[str], points: Iterable[Any]) -> list[StoreRecord | None]:
    """Retrieved points -> records in the order of ``ids`` (None where one is not stored)."""
    found = {}
    for p in points:
        doc_id, payload = split_payload(p.payload)
        found[doc_id] = StoreRecord(doc_id, np.asarray(p.vector, dtype=np.float32), payload)
    return [found.get(i) for i in ids]


def existing_ids(ids: Sequence[str], retrieve: Callable[[list[str]], Iterable[Any]]) -> set[str]:
    """The stored subset of ``ids``; ``retrieve(uuids)`` fetches points without payload."""
    ids = list(ids)
    if not ids:
        return set()
    by_uuid = {point_uuid(i): i for i in ids}
    return {by_uuid[str(p.id)] for p in retrieve(list(by_uuid))}


def scroll_doc_ids(scroll: Callable[[Any], tuple[Iterable[Any], Any]]) -> Iterator[str]:
    """Every stored ``doc_id``, page by page; ``scroll(offset)`` returns (points, next offset)."""
    offset = None
    while True:
        points, offset = scroll(offset)
        for p in points:
            yield str(p.payload["doc_id"])
        if offset is None:
            return
