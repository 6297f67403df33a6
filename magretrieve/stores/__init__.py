"""Vector stores behind one protocol, opened from a short spec string or an existing object.

Specs (the contract; one line per registered backend, in registration order)::

    faiss:DIR                       FAISS in a folder (flat / hnsw / ivf / factory string)
    qdrant:URL/COLLECTION           a Qdrant server or cluster, e.g. qdrant:http://localhost:6333/scifact
    qdrant-local:DIR/COLLECTION     embedded qdrant-client, persisted in DIR
    qdrant-memory:COLLECTION        embedded qdrant-client, in memory (tests, notebooks)
    qdrant-edge:DIR                 Qdrant Edge shard in DIR (embedded engine with HNSW)
    memory:[DIR]                    exact numpy search (the reference), optionally persisted
    pgvector:POSTGRES_URI#TABLE     PostgreSQL with pgvector, e.g. pgvector:postgresql://u@host/db#docs
    milvus:PATH.db/COLLECTION       Milvus Lite in a file, or milvus:http://HOST:PORT/COLLECTION
    chroma:PATH/COLLECTION          embedded Chroma in PATH, or chroma:http://HOST:PORT/COLLECTION
    lancedb:PATH/TABLE              embedded LanceDB in PATH
    scann:DIR                       Google ScaNN in a folder (exact until optimize() builds it)

Objects: a :class:`VectorStore`, a FAISS index (metric must be inner product), a
``qdrant_client.QdrantClient``, a ``psycopg`` connection or a ``pymilvus.MilvusClient`` (the
last three with ``collection=``); ``registry.adopted_objects()`` lists them.

Every backend is an entry of :mod:`magretrieve.stores.registry` (which explains how to add
one); spec parsing, option checking and opening below are derived from it. Backends import
their library only when opened, so ``import magretrieve.stores`` is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.stores import registry
from magretrieve.stores.annotation import AnnotatableStore
from magretrieve.stores.base import (
    METRIC,
    StoreHit,
    StoreRecord,
    VectorStore,
    point_uuid,
)

__all__ = [
    "METRIC",
    "AnnotatableStore",
    "SPEC_FORMS",
    "StoreHit",
    "StoreRecord",
    "VectorStore",
    "open_store",
    "parse_spec",
    "point_uuid",
]


def __getattr__(name: str) -> Any:
    if name == "SPEC_FORMS":  # derived from the registry on first use
        return registry.spec_forms()
    raise AttributeError(name)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split a spec into its backend prefix and location parts; errors list the accepted forms."""
    backend, loc = registry.backend_for(spec)
    return backend.prefix, loc


def open_store(
    spec_or_object: str | Any,
    *,
    dimension: int | None = None,
    collection: str | None = None,
    **options: Any,
) -> VectorStore:
    """Open (or create, when ``dimension`` is given) the store a spec or object names.

    ``options`` are backend knobs (``index_type``, ``hnsw_m``, ``ef_construction``,
    ``ef_search``, ``nlist``, ``nprobe``, ``target_recall``, ``quantization``,
    ``shard_number``, ``replication_factor``, ...; see ``registry.OPTIONS``), or
    ``options=IndexOptions(...)`` (:mod:`magretrieve.stores.options`); ``None`` values
    are ignored, values out of range and options that do not apply to the backend are an error
    raised before any backend library is called. ``tuning_queries`` (query vectors, e.g. the
    user's queries encoded with the model's query graph) are what an ANN store tunes
    ``target_recall`` on instead of its synthetic sample (:func:`use_tuning_queries`).
    """
    tuning = options.pop("tuning_queries", None)
    _expand_typed(options)
    obj = spec_or_object
    if isinstance(obj, VectorStore):
        store = obj
    elif isinstance(obj, Path):
        raise StoreError(f"{obj}: give a store spec such as 'faiss:{obj}'")
    elif not isinstance(obj, str):
        store = registry.open_object(obj, dimension, collection, options)
    else:
        store = registry.open_spec(obj, dimension, options)
    if tuning is not None:
        try:
            use_tuning_queries(store, tuning)
        except BaseException:
            if store is not obj:
                store.close()
            raise
    return store


def _expand_typed(options: dict[str, Any]) -> None:
    """``options=IndexOptions(...)`` (or another option class) as the keywords it stands for."""
    from magretrieve.stores.options import StoreOptions

    typed = options.pop("options", None)
    if typed is None:
        return
    if not isinstance(typed, StoreOptions):
        raise StoreError(
            f"options= takes an option class of magretrieve.stores.options (IndexOptions, "
            f"HnswOptions, ...), got {type(typed).__name__}"
        )
    for key, value in typed.as_keywords().items():
        if value is None:
            continue
        if options.get(key) is not None:
            raise StoreError(f"{key} is given twice: in options= and as a keyword")
        options[key] = value


def use_tuning_queries(store: VectorStore, tuning: Any) -> None:
    """Tune ``store`` on these query vectors from now on (``TuningQueries`` or an array of
    the user's query vectors); an ANN index already built is re-measured (and re-tuned to
    its ``target_recall``) on them at once, in memory."""
    from magretrieve.stores._ann_recall import USER, TuningQueries

    if isinstance(tuning, str | Path):
        raise StoreError(
            f"{tuning}: open_store takes tuning query vectors; Retriever.load(..., "
            "tuning_queries=FILE) or `magretrieve index --tuning-queries FILE` encodes a file"
        )
    if not isinstance(tuning, TuningQueries):
        try:
            tuning = TuningQueries(np.asarray(tuning, dtype=np.float32), USER)
        except (TypeError, ValueError) as exc:
            raise StoreError(f"{store.location}: tuning_queries: {exc}") from None
    if tuning.vectors.shape[1] != store.dimension:
        raise StoreError(
            f"{store.location}: tuning queries have {tuning.vectors.shape[1]} dimensions, "
            f"the store {store.dimension}"
        )
    store.tuning_queries = tuning
    if store.describe()["parameters"].get("recall"):
        store.measure_recall(target_recall=getattr(store, "target_recall", None))
