"""Does a framework's vector store keep the documents' magnitude? Read from the store object.

A magnitude-keeping export scores ``q · d = ‖q‖ · ‖d‖ · cos θ``: a store that ranks by cosine
(or by Euclidean distance) ranks by something else and throws ``‖d‖`` away without an error.
:func:`check_vector_store` reads the setting that decides it from the store objects of
LangChain, LlamaIndex and Haystack (or a retriever, index or writer holding one), without
importing any framework, and warns with :class:`MagnitudeWarning` when the store would drop the
magnitude. The table of stores and their settings is docs/integrations.md.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["INNER_PRODUCT", "MagnitudeWarning", "check_vector_store", "store_ranking"]

INNER_PRODUCT = "inner_product"
COSINE = "cosine"
EUCLIDEAN = "euclidean"
UNKNOWN = "unknown"

#: Attributes through which a retriever, index, writer or storage context holds its store.
_HOLDERS = ("vectorstore", "vector_store", "document_store", "_vector_store", "_document_store")


class MagnitudeWarning(UserWarning):
    """A vector store that ranks by cosine or distance would drop the documents' magnitude."""


def _name(value: Any) -> str:
    """An enum's value or a string, lower-cased (``Distance.DOT`` → ``"dot"``)."""
    value = getattr(value, "value", value)
    return str(value).lower() if value is not None else ""


_METRICS = {
    "dot": INNER_PRODUCT,
    "dot_product": INNER_PRODUCT,
    "inner": INNER_PRODUCT,
    "inner_product": INNER_PRODUCT,
    "max_inner_product": INNER_PRODUCT,
    "ip": INNER_PRODUCT,
    "cosine": COSINE,
    "cosine_distance": COSINE,
    "cosine_similarity": COSINE,
    "cos": COSINE,
    "euclid": EUCLIDEAN,
    "euclidean": EUCLIDEAN,
    "l2": EUCLIDEAN,
    "l2_distance": EUCLIDEAN,
    "manhattan": EUCLIDEAN,
}


def _metric(value: Any) -> str:
    """The ranking a setting names: by its value, else (an enum) by its member name."""
    found = _METRICS.get(_name(value), UNKNOWN)
    if found == UNKNOWN and isinstance(getattr(value, "name", None), str):
        found = _METRICS.get(value.name.lower(), UNKNOWN)
    return found


def _qdrant_collection_metric(client: Any, collection: str, vector_name: str | None) -> str:
    """The distance of an existing Qdrant collection's dense vector (unknown if unreadable)."""
    try:
        vectors = client.get_collection(collection).config.params.vectors
    except Exception:  # the collection may not exist yet, or the server be unreachable
        return UNKNOWN
    if isinstance(vectors, dict):
        vectors = vectors.get(vector_name or "") or (
            next(iter(vectors.values())) if len(vectors) == 1 else None
        )
    return _metric(getattr(vectors, "distance", None))


def store_ranking(store: Any, _depth: int = 0) -> tuple[str, str]:
    """(``inner_product`` | ``cosine`` | ``euclidean`` | ``unknown``, the setting read)."""
    for attr in _HOLDERS if _depth < 3 else ():  # a retriever / index / writer: its store
        inner = getattr(store, attr, None)
        if inner is not None and inner is not store and not callable(inner):
            return store_ranking(inner, _depth + 1)
    cls = type(store).__name__
    module = type(store).__module__ or ""
    # LangChain
    if cls == "InMemoryVectorStore" and module.startswith("langchain_core"):
        return COSINE, "InMemoryVectorStore always ranks by cosine similarity"
    if cls == "QdrantVectorStore" and module.startswith("langchain_qdrant"):
        return _metric(getattr(store, "distance", None)), f"distance={_name(store.distance)}"
    if module.startswith("langchain_postgres"):
        strategy = getattr(store, "_distance_strategy", None) or getattr(
            store, "distance_strategy", None
        )
        if strategy is None:  # the v2 PGVectorStore wraps an AsyncPGVectorStore
            inner = getattr(store, "_PGVectorStore__vs", None)
            strategy = getattr(inner, "distance_strategy", None)
        return _metric(strategy), f"distance_strategy={getattr(strategy, 'name', strategy)}"
    # LlamaIndex
    if cls == "SimpleVectorStore" and module.startswith("llama_index"):
        return COSINE, "SimpleVectorStore ranks by cosine similarity (no other setting)"
    if cls == "QdrantVectorStore" and module.startswith("llama_index"):
        dense = getattr(store, "_dense_config", None)
        if dense is not None:
            return _metric(dense.distance), f"dense_config.distance={_name(dense.distance)}"
        client = getattr(store, "_client", None) or getattr(store, "client", None)
        found = (
            _qdrant_collection_metric(
                client, store.collection_name, getattr(store, "dense_vector_name", None)
            )
            if client is not None
            else UNKNOWN
        )
        if found != UNKNOWN:
            return found, f"collection {store.collection_name!r} distance"
        return COSINE, "a new collection is created with Distance.COSINE unless dense_config says"
    # Haystack
    if cls == "InMemoryDocumentStore" and module.startswith("haystack"):
        fn = getattr(store, "embedding_similarity_function", None)
        return _metric(fn), f"embedding_similarity_function={_name(fn)}"
    if cls == "QdrantDocumentStore" and module.startswith("haystack_integrations"):
        sim = getattr(store, "similarity", None)
        return _metric(sim), f"similarity={_name(sim)}"
    if cls == "PgvectorDocumentStore" and module.startswith("haystack_integrations"):
        fn = getattr(store, "vector_function", None)
        return _metric(fn), f"vector_function={_name(fn)}"
    return UNKNOWN, f"{module}.{cls} is not a store magretrieve knows"


def check_vector_store(store: Any, *, warn: bool = True) -> str:
    """How ``store`` ranks (see :func:`store_ranking`); a :class:`MagnitudeWarning` when it
    ranks by cosine or distance (the documents' magnitude then plays no part)."""
    ranking, how = store_ranking(store)
    if warn and ranking in (COSINE, EUCLIDEAN):
        warnings.warn(
            f"{type(store).__name__} ranks by {ranking} ({how}): the documents' magnitude, "
            "which this model uses as relevance, is dropped; use a store that ranks by inner "
            "product (docs/integrations.md)",
            MagnitudeWarning,
            stacklevel=2,
        )
    return ranking
