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

from magretrieve.core.errors import StoreError
from magretrieve.stores import registry
from magretrieve.stores.base import (
    METRIC,
    StoreHit,
    StoreRecord,
    VectorStore,
    point_uuid,
)

__all__ = [
    "METRIC",
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
    ``shard_number``, ``replication_factor``, ...; see ``registry.OPTIONS``); ``None`` values
    are ignored, values out of range and options that do not apply to the backend are an error
    raised before any backend library is called.
    """
    obj = spec_or_object
    if isinstance(obj, VectorStore):
        return obj
    if isinstance(obj, Path):
        raise StoreError(f"{obj}: give a store spec such as 'faiss:{obj}'")
    if not isinstance(obj, str):
        return registry.open_object(obj, dimension, collection, options)
    return registry.open_spec(obj, dimension, options)
