"""The small client interface the one Qdrant store runs on, and its two implementations.

:class:`~magretrieve.stores.qdrant_store.QdrantStore` holds every rule (Dot only, size
checks, uuid5 ids, ``doc_id``/``doc_norm`` payload, int8 query scaling, recall measurement);
what differs between qdrant-client (server, cluster, embedded on disk or in memory) and
Qdrant Edge (an in-process shard) is only *how* a handful of calls are spelled. Each class
here spells them for one library:

=================  =====================================================================
``config()``       the existing collection/shard's vector config, or ``None`` when absent
``create(dim, build)``  create it (Dot, size, HNSW, int8 quantization, backend extras)
``upsert``         write points ``(uuid, vector, payload)``
``query``          top-k per query vector with search params
``delete``         remove points by uuid
``count``          exact number of points
``retrieve``       points by uuid (with payload / vector or not)
``scroll``         one page of points (``offset`` → ``(points, next offset)``)
``read_doc`` / ``write_doc``  magretrieve's own document (model metadata, measured recall)
``flush`` / ``optimize`` / ``close``
=================  =====================================================================

Points returned by both libraries expose ``.id``, ``.payload``, ``.vector`` (and ``.score``
for query results), which is all the store reads.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from magretrieve.core.errors import StoreError, WriterLockHeld
from magretrieve.core.extras import require
from magretrieve.stores._writer_lock import WriterLock, engine_busy, holder_of, open_engine
from magretrieve.stores.base import atomic_write_json

#: Collection-metadata key under which the building model is recorded (qdrant-client).
META_KEY = "magretrieve"
#: Edge: the file next to the shard that holds magretrieve's document.
META_FILE = "magretrieve_store.json"
SHARD_DIR = "shard"


def client_models() -> Any:
    return require("qdrant_client.models")


def edge_module() -> Any:
    return require("qdrant_edge")


class ClientAPI:
    """qdrant-client ≥ 1.20: ``QdrantClient(url=...)``, ``(path=...)`` or ``(":memory:")``."""

    def __init__(
        self,
        client: Any,
        collection: str,
        *,
        owns_client: bool = False,
        location: str | None = None,
    ) -> None:
        self.client = client
        self.collection = collection
        self.owns_client = owns_client
        self.where = location or f"qdrant collection {collection!r}"
        self.label = f"Qdrant collection {collection!r}"
        # embedded mode: exact search, no HNSW, and search params only raise warnings
        self.embedded = type(getattr(client, "_client", None)).__name__ == "QdrantLocal"
        self.thread_safe = not self.embedded  # embedded qdrant-client is not thread-safe
        self.models = client_models()

    def errors(self) -> tuple[type[BaseException], ...]:
        """What qdrant-client raises for server answers, timeouts and embedded-mode faults."""
        exceptions = require("qdrant_client.http.exceptions")
        return (exceptions.ApiException, ValueError, RuntimeError, OSError)

    def config(self) -> dict[str, Any] | None:
        if not self.client.collection_exists(self.collection):
            return None
        info = self.client.get_collection(self.collection)
        params = info.config.params.vectors
        if isinstance(params, Mapping):
            return {"named": sorted(params)}
        hnsw = info.config.hnsw_config
        return {
            "named": None,
            "distance": getattr(params.distance, "value", str(params.distance)),
            "size": params.size,
            "quantized": info.config.quantization_config is not None,
            "hnsw": {
                "m": getattr(hnsw, "m", None),
                "ef_construct": getattr(hnsw, "ef_construct", None),
            },
            "shards": (info.config.params.shard_number, info.config.params.replication_factor),
        }

    def create(self, dimension: int, build: Mapping[str, Any]) -> dict[str, Any]:
        """``build``: ``hnsw_m``, ``ef_construction``, ``quantization`` and the server's
        ``shard_number``, ``replication_factor``, ``on_disk`` (None or absent: its default)."""
        models = self.models
        hnsw_m, ef_construction = build.get("hnsw_m"), build.get("ef_construction")
        shard_number, replication_factor = (
            build.get("shard_number"),
            build.get("replication_factor"),
        )
        hnsw = None
        if hnsw_m is not None or ef_construction is not None:
            hnsw = models.HnswConfigDiff(m=hnsw_m, ef_construct=ef_construction)
        quant = None
        if build.get("quantization") == "int8":
            quant = models.ScalarQuantization(
                scalar=models.ScalarQuantizationConfig(type=models.ScalarType.INT8, always_ram=True)
            )
        self.client.create_collection(
            self.collection,
            vectors_config=models.VectorParams(
                size=int(dimension), distance=models.Distance.DOT, on_disk=build.get("on_disk")
            ),
            hnsw_config=hnsw,
            quantization_config=quant,
            shard_number=shard_number,
            replication_factor=replication_factor,
        )
        return {
            "hnsw": {"m": hnsw_m, "ef_construct": ef_construction},
            "shards": (shard_number, replication_factor),
        }

    def open(self) -> None:
        """The collection is reached through the client: nothing to load."""

    def upsert(self, points: list[tuple[str, list[float], dict[str, Any]]]) -> None:
        structs = [self.models.PointStruct(id=u, vector=v, payload=p) for u, v, p in points]
        self.client.upsert(self.collection, points=structs, wait=True)

    def query(self, rows: list[list[float]], k: int, with_vectors: bool, params: Any) -> list[Any]:
        if self.embedded:
            params = None  # exact search; qdrant-client warns that params are ignored
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            if len(rows) == 1:
                res = [
                    self.client.query_points(
                        self.collection,
                        query=rows[0],
                        limit=k,
                        with_payload=True,
                        with_vectors=with_vectors,
                        search_params=params,
                    )
                ]
            else:
                res = self.client.query_batch_points(
                    self.collection,
                    requests=[
                        self.models.QueryRequest(
                            query=row,
                            limit=k,
                            with_payload=True,
                            with_vector=with_vectors,
                            params=params,
                        )
                        for row in rows
                    ],
                )
        return [r.points for r in res]

    def delete(self, uuids: list[str]) -> None:
        self.client.delete(
            self.collection, points_selector=self.models.PointIdsList(points=uuids), wait=True
        )

    def count(self) -> int:
        return int(self.client.count(self.collection, exact=True).count)

    def retrieve(self, uuids: list[str], with_payload: bool, with_vectors: bool) -> list[Any]:
        return self.client.retrieve(
            self.collection, ids=uuids, with_payload=with_payload, with_vectors=with_vectors
        )

    def scroll(
        self, offset: Any, limit: int, fields: list[str] | None, with_vectors: bool
    ) -> tuple[list[Any], Any]:
        return self.client.scroll(
            self.collection,
            limit=limit,
            offset=offset,
            with_payload=fields if fields is not None else True,
            with_vectors=with_vectors,
        )

    def read_doc(self) -> dict[str, Any]:
        meta = self.client.get_collection(self.collection).config.metadata or {}
        return {
            "metadata": dict(meta[META_KEY]) if meta.get(META_KEY) else None,
            "recall": meta.get(META_KEY + "_recall"),
        }

    def write_doc(self, doc: Mapping[str, Any]) -> None:
        update: dict[str, Any] = {META_KEY: doc.get("metadata") or {}}
        if doc.get("recall") is not None:
            update[META_KEY + "_recall"] = doc["recall"]
        self.client.update_collection(self.collection, metadata=update)

    def flush(self) -> None:
        """Every write waited for the server (``wait=True``): nothing to flush."""

    def optimize(self) -> None:
        """A server builds HNSW in the background; embedded mode has no index."""

    def claim(self) -> bool:
        """Nothing to hold: the server or qdrant-client itself keeps writers apart."""
        return False

    def close(self) -> None:
        if self.owns_client:
            self.client.close()

    def info(self) -> dict[str, Any]:
        return {}


class EdgeAPI:
    """Qdrant Edge (``qdrant-edge-py``): a shard in ``DIR/shard``, our document beside it.

    The folder's writer lock is taken before the shard is created or loaded and held until
    :meth:`close`. Edge locks only its WAL, after a new shard's files are written and not
    through the whole close, so a second process could otherwise load (or create over) a
    shard another one is still writing and read it back damaged.
    """

    embedded = False
    thread_safe = True

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.shard_path = self.path / SHARD_DIR
        self.where = f"qdrant-edge:{self.path}"
        self.label = f"Qdrant Edge shard {self.shard_path}"
        self.models = edge_module()
        self.shard: Any = None
        self._write_lock = threading.Lock()
        self._folder_lock = WriterLock(self.path, self.where, engine="Qdrant Edge")
        self._closed = False

    def claim(self) -> bool:
        """Hold the store folder (idempotent); another process holding it is refused, named.
        True: what exists must be looked up again (it may have been created meanwhile)."""
        self._folder_lock.acquire()
        return True

    def errors(self) -> tuple[type[BaseException], ...]:
        """Qdrant Edge reports faults as plain Python exceptions, some as bare ``Exception``
        (``Service runtime error: ...``): every one is a driver error of this store."""
        return (Exception,)

    def config(self) -> dict[str, Any] | None:
        config_file = self.shard_path / "edge_config.json"
        if not config_file.is_file():
            return None
        try:
            cfg = json.loads(config_file.read_text())
            vectors = cfg.get("vectors", {})
            if set(vectors) != {""}:
                return {"named": sorted(vectors)}
            params = vectors[""]
            size = params["size"]
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"vector size {size!r} is not a positive integer")
            return {
                "named": None,
                "distance": str(params.get("distance")),
                "size": size,
                "quantized": bool(cfg.get("quantization_config")),
                "hnsw": dict(cfg.get("hnsw_config") or {}),
                "indexing_threshold": (cfg.get("optimizers") or {}).get("indexing_threshold"),
                "shards": None,
            }
        except Exception as exc:  # a damaged config: name it, no traceback
            raise StoreError(
                f"{self.shard_path}: cannot open the Qdrant Edge shard ({type(exc).__name__}: {exc})"
            ) from None

    def open(self) -> None:
        """Load the existing shard (after its config passed the store's checks)."""
        self.claim()
        try:  # held by another process (named), or a damaged shard: no traceback
            self.shard = open_engine(
                lambda: self.models.EdgeShard.load(str(self.shard_path)),
                self.shard_path / "wal",
                self.where,
                "Qdrant Edge",
            )
        except WriterLockHeld:
            self._folder_lock.release()
            raise
        except Exception as exc:
            self._folder_lock.release()
            raise StoreError(
                f"{self.shard_path}: cannot open the Qdrant Edge shard ({type(exc).__name__}: {exc})"
            ) from None

    def create(self, dimension: int, build: Mapping[str, Any]) -> dict[str, Any]:
        """``build``: ``hnsw_m``, ``ef_construction``, ``quantization`` and the shard's
        ``full_scan_threshold``, ``indexing_threshold`` (None or absent: Edge's default)."""
        qe = self.models
        full_scan_threshold = build.get("full_scan_threshold")
        indexing_threshold = build.get("indexing_threshold")
        hnsw = {
            "m": int(build.get("hnsw_m") or 16),
            "ef_construct": int(build.get("ef_construction") or 100),
            "full_scan_threshold": int(
                1000 if full_scan_threshold is None else full_scan_threshold
            ),
        }
        quant = (
            qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, always_ram=True)
            if build.get("quantization") == "int8"
            else None
        )
        config = qe.EdgeConfig(
            vectors=qe.EdgeVectorParams(size=int(dimension), distance=qe.Distance.Dot),
            hnsw_config=qe.HnswIndexConfig(**hnsw),
            quantization_config=quant,
            optimizers=(
                qe.EdgeOptimizersConfig(indexing_threshold=int(indexing_threshold))
                if indexing_threshold is not None
                else None
            ),
        )
        self.claim()
        try:
            self.shard = qe.EdgeShard.create(str(self.shard_path), config)
        except Exception:  # another program created it meanwhile (and is locking it)
            self._folder_lock.release()
            for _ in range(20):
                holder = holder_of(self.shard_path / "wal")
                if holder is not None:
                    raise engine_busy(self.where, holder, "Qdrant Edge") from None
                time.sleep(0.05)
            raise
        return {"hnsw": hnsw, "shards": None}

    def upsert(self, points: list[tuple[str, list[float], dict[str, Any]]]) -> None:
        qe = self.models
        with self._write_lock:
            self.shard.update(qe.UpdateOperation.upsert_points([qe.Point(*p) for p in points]))

    def query(self, rows: list[list[float]], k: int, with_vectors: bool, params: Any) -> list[Any]:
        qe = self.models
        requests = [
            qe.QueryRequest(
                limit=k,
                query=qe.Query.Nearest(row),
                with_payload=True,
                with_vector=with_vectors,
                params=params,
            )
            for row in rows
        ]
        if len(requests) == 1:
            return [self.shard.query(requests[0])]
        return list(self.shard.query_batch(qe.QueryBatchRequest(requests)))

    def delete(self, uuids: list[str]) -> None:
        with self._write_lock:
            self.shard.update(self.models.UpdateOperation.delete_points(uuids))

    def count(self) -> int:
        return int(self.shard.count(self.models.CountRequest(exact=True)))

    def retrieve(self, uuids: list[str], with_payload: bool, with_vectors: bool) -> list[Any]:
        return self.shard.retrieve(uuids, with_payload=with_payload, with_vector=with_vectors)

    def scroll(
        self, offset: Any, limit: int, fields: list[str] | None, with_vectors: bool
    ) -> tuple[list[Any], Any]:
        qe = self.models
        return self.shard.scroll(
            qe.ScrollRequest(
                offset=offset,
                limit=limit,
                with_payload=qe.PayloadSelector.Include(fields) if fields is not None else True,
                with_vector=with_vectors,
            )
        )

    def read_doc(self) -> dict[str, Any]:
        f = self.path / META_FILE
        if not f.is_file():
            return {"metadata": None, "recall": None}
        try:
            doc = json.loads(f.read_text())
        except ValueError as exc:  # bad JSON or bad UTF-8
            raise StoreError(f"{f}: unreadable ({exc})") from None
        if not isinstance(doc, dict):
            raise StoreError(f"{f}: unreadable (not a JSON object)")
        meta = doc.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise StoreError(f"{f}: 'metadata' must be a JSON object, got {type(meta).__name__}")
        return {"metadata": meta, "recall": doc.get("recall")}

    def write_doc(self, doc: Mapping[str, Any]) -> None:
        out: dict[str, Any] = {
            "format": "magretrieve-qdrant-edge-store",
            "metadata": doc.get("metadata"),
        }
        if doc.get("recall") is not None:
            out["recall"] = doc["recall"]
        atomic_write_json(self.path / META_FILE, out)

    def flush(self) -> None:
        with self._write_lock:
            self.shard.flush()

    def optimize(self) -> None:
        with self._write_lock:
            self.shard.optimize()
            self.shard.flush()

    def close(self) -> None:
        try:
            if not self._closed and self.shard is not None:
                self.shard.flush()
                self.shard.close()
                self._closed = True
        finally:  # after Edge let go of every file
            self._folder_lock.release()

    def info(self) -> dict[str, Any]:
        info = self.shard.info()
        return {"segments": info.segments_count, "indexed_vectors": info.indexed_vectors_count}
