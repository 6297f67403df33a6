"""Vector stores behind one protocol, opened from a short spec string or an existing object.

Specs (the contract)::

    faiss:DIR                       FAISS in a folder (flat / hnsw / ivf / factory string)
    qdrant:URL/COLLECTION           a Qdrant server or cluster, e.g. qdrant:http://localhost:6333/scifact
    qdrant-local:DIR/COLLECTION     embedded qdrant-client, persisted in DIR
    qdrant-memory:COLLECTION        embedded qdrant-client, in memory (tests, notebooks)
    qdrant-edge:DIR                 Qdrant Edge shard in DIR (embedded engine with HNSW)
    memory:  /  memory:DIR          exact numpy search (the reference), optionally persisted

Objects: a :class:`VectorStore`, a ``qdrant_client.QdrantClient`` (with ``collection=``), or a
FAISS index object (metric must be inner product).

Backends import their library only when opened, so ``import magretrieve.adapters`` is cheap.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from magretrieve.adapters.base import (
    METRIC,
    StoreHit,
    StoreRecord,
    VectorStore,
    point_uuid,
    require,
)
from magretrieve.errors import StoreError

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

SPEC_FORMS = (
    "faiss:DIR",
    "qdrant:URL/COLLECTION",
    "qdrant-local:DIR/COLLECTION",
    "qdrant-memory:COLLECTION",
    "qdrant-edge:DIR",
    "memory:[DIR]",
)

#: Which open_store options each backend understands.
_OPTIONS = {
    "faiss": {"index_type", "hnsw_m", "ef_construction", "ef_search", "nlist", "nprobe"},
    "qdrant": {
        "hnsw_m",
        "ef_construction",
        "ef_search",
        "quantization",
        "oversampling",
        "rescore",
        "query_scaling",
        "shard_number",
        "replication_factor",
        "on_disk",
        "api_key",
        "timeout",
    },
    "qdrant-edge": {
        "hnsw_m",
        "ef_construction",
        "ef_search",
        "quantization",
        "oversampling",
        "rescore",
        "query_scaling",
        "full_scan_threshold",
        "indexing_threshold",
    },
    "memory": set(),
}
_OPTIONS["qdrant-local"] = _OPTIONS["qdrant"]
_OPTIONS["qdrant-memory"] = _OPTIONS["qdrant"]


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """Split a spec into its backend and location parts; errors list the accepted forms."""
    if not isinstance(spec, str) or ":" not in spec:
        raise StoreError(f"store spec {spec!r} not understood; use one of: {', '.join(SPEC_FORMS)}")
    kind, rest = spec.split(":", 1)
    kind = kind.lower()
    if kind in ("pgvector", "milvus"):  # TEMPORARY until the registry lands
        return kind, {"rest": rest}
    if kind == "faiss" and rest:
        return kind, {"path": rest}
    if kind == "qdrant-edge" and rest:
        return kind, {"path": rest}
    if kind == "memory":
        return kind, {"path": rest}
    if kind == "qdrant-memory" and rest:
        return kind, {"collection": rest}
    if kind == "qdrant-local":
        base, _, collection = rest.rstrip("/").rpartition("/")
        if base and collection:
            return kind, {"path": base, "collection": collection}
    if kind == "qdrant":
        # the collection is the last path segment *after* the host: "http://h:6333" alone
        # has none (rpartition would otherwise take "h:6333" for a collection name)
        scheme, sep, after = rest.partition("://")
        host, _, collection = (after if sep else rest).rstrip("/").rpartition("/")
        if host and collection and (sep or ":" in host):
            return kind, {"url": f"{scheme}{sep}{host}", "collection": collection}
    if kind in ("qdrant", "qdrant-local", "qdrant-memory"):
        form = next(f for f in SPEC_FORMS if f.startswith(kind + ":"))
        raise StoreError(
            f"store spec {spec!r}: missing collection name (expected {form}, e.g. "
            f"{form.replace('COLLECTION', 'scifact')}); use one of: {', '.join(SPEC_FORMS)}"
        )
    raise StoreError(f"store spec {spec!r} not understood; use one of: {', '.join(SPEC_FORMS)}")


def _options(kind: str, options: dict[str, Any]) -> dict[str, Any]:
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - _OPTIONS[kind])
    if unknown:
        raise StoreError(f"option(s) {unknown} do not apply to {kind} stores")
    return given


def open_store(
    spec_or_object: str | Any,
    *,
    dimension: int | None = None,
    collection: str | None = None,
    **options: Any,
) -> VectorStore:
    """Open (or create, when ``dimension`` is given) the store a spec or object names.

    ``options`` are backend knobs (``index_type``, ``hnsw_m``, ``ef_construction``,
    ``ef_search``, ``nlist``, ``nprobe``, ``quantization``, ``shard_number``,
    ``replication_factor``, ...); ``None`` values are ignored, options that do not apply to
    the backend are an error.
    """
    obj = spec_or_object
    if isinstance(obj, VectorStore):
        return obj
    if isinstance(obj, Path):
        raise StoreError(f"{obj}: give a store spec such as 'faiss:{obj}'")
    if not isinstance(obj, str):
        return _open_object(obj, dimension, collection, options)
    kind, loc = parse_spec(obj)
    if kind == "pgvector":  # TEMPORARY until the registry lands
        from magretrieve.adapters.pgvector_store import open_spec

        return open_spec(loc["rest"], dimension, options)
    if kind == "milvus":  # TEMPORARY until the registry lands
        from magretrieve.adapters.milvus_store import open_milvus, parse_milvus

        parsed = parse_milvus(loc["rest"])
        if parsed is None:
            raise StoreError(f"store spec {obj!r}: expected milvus:PATH.db/COLLECTION or milvus:URL/COLLECTION")
        return open_milvus(parsed, dimension, **{k: v for k, v in options.items() if v is not None})
    opts = _options(kind, options)
    if kind == "faiss":
        from magretrieve.adapters.faiss_store import FaissStore

        return FaissStore.open(loc["path"], dimension, **opts)
    if kind == "memory":
        from magretrieve.adapters.memory_store import MemoryStore

        if loc["path"]:
            return MemoryStore.open(loc["path"], dimension)
        if dimension is None:
            raise StoreError("memory: store needs a dimension")
        return MemoryStore(dimension)
    if kind == "qdrant-edge":
        from magretrieve.adapters.qdrant_edge_store import QdrantEdgeStore

        return QdrantEdgeStore(loc["path"], dimension, **opts)
    # qdrant-client backends
    from magretrieve.adapters.qdrant_store import QdrantStore

    QdrantClient = require("qdrant_client", "qdrant-client", "qdrant").QdrantClient
    client_opts = {k: opts.pop(k) for k in ("api_key", "timeout") if k in opts}
    if kind == "qdrant":
        client_opts.setdefault("api_key", os.environ.get("QDRANT_API_KEY"))
        client = QdrantClient(url=loc["url"], **client_opts)
        where = f"qdrant:{loc['url']}/{loc['collection']}"
    elif kind == "qdrant-local":
        Path(loc["path"]).mkdir(parents=True, exist_ok=True)
        try:
            client = QdrantClient(path=loc["path"], force_disable_check_same_thread=True)
        except RuntimeError as exc:  # portalocker: another process holds the folder
            raise StoreError(f"{loc['path']}: cannot open embedded Qdrant ({exc})") from None
        where = f"qdrant-local:{loc['path']}/{loc['collection']}"
    else:
        client = QdrantClient(":memory:")
        where = f"qdrant-memory:{loc['collection']}"
    try:
        return QdrantStore(
            client, loc["collection"], dimension, owns_client=True, location=where, **opts
        )
    except StoreError:
        client.close()
        raise
    except Exception as exc:  # connection refused, auth, server-side errors
        client.close()
        raise StoreError(f"{where}: Qdrant request failed ({type(exc).__name__}: {exc})") from exc


def _open_object(
    obj: Any, dimension: int | None, collection: str | None, options: dict[str, Any]
) -> VectorStore:
    module = type(obj).__module__ or ""
    if module.startswith("psycopg"):  # TEMPORARY until the registry lands
        from magretrieve.adapters.pgvector_store import PgVectorStore

        return PgVectorStore(obj, collection or "", dimension, **{k: v for k, v in options.items() if v is not None})
    if module.startswith("qdrant_client"):
        from magretrieve.adapters.qdrant_store import QdrantStore

        if not collection:
            raise StoreError("a QdrantClient needs collection='name'")
        opts = _options("qdrant", options)
        opts.pop("api_key", None)
        opts.pop("timeout", None)
        return QdrantStore(obj, collection, dimension, **opts)
    if module.startswith("faiss") and hasattr(obj, "metric_type"):
        from magretrieve.adapters.faiss_store import FaissStore

        path = options.pop("path", None)
        opts = _options("faiss", options)
        if dimension is not None and int(obj.d) != int(dimension):
            raise StoreError(
                f"FAISS index has dimension {obj.d}, but the model produces dimension {dimension}"
            )
        return FaissStore(int(obj.d), path, index=obj, **opts)
    raise StoreError(
        f"cannot use a {type(obj).__name__} as a store; pass a spec ({', '.join(SPEC_FORMS)}), "
        "a VectorStore, a QdrantClient or a FAISS index"
    )
