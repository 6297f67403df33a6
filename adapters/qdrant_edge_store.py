"""Qdrant Edge (``qdrant-edge-py``): Qdrant's storage and HNSW engine in-process, no server.

Layout of a store folder ``DIR``::

    DIR/shard/                    the Edge shard (edge_config.json, WAL, segments)
    DIR/magretrieve_store.json    which model built the store (written atomically)

Same rules as :mod:`magretrieve.adapters.qdrant_store`: ``Distance.Dot`` only (an existing
shard with another distance is refused, naming it), size checked, ``uuid5`` point ids,
``doc_id``/``doc_norm`` in the payload. Unlike embedded qdrant-client, Edge builds a real
HNSW index; :meth:`QdrantEdgeStore.optimize` builds it after a bulk load (segments below
the indexing threshold are searched exactly). Updates go through Edge's write-ahead log, so
every ``add`` that returned survives a crash.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.adapters import _ann_recall, registry
from magretrieve.adapters._qdrant_common import (
    build_points,
    check_vector_params,
    existing_ids,
    mean_doc_norm,
    quantized_query_factors,
    records_in_order,
    scroll_doc_ids,
    search_params,
    to_hits,
)
from magretrieve.adapters.base import (
    StoreHit,
    StoreRecord,
    VectorStore,
    atomic_write_json,
    check_k,
    check_queries,
    point_uuid,
    require,
    state_metadata,
)
from magretrieve.errors import StoreError

META_FILE = "magretrieve_store.json"
SHARD_DIR = "shard"


def _edge() -> Any:
    return require("qdrant_edge", "qdrant-edge-py", "qdrant-edge")


class QdrantEdgeStore(VectorStore):
    """An Edge shard in a folder, searched by dot product with HNSW."""

    kind = "qdrant-edge"
    thread_safe_search = True

    def __init__(
        self,
        path: str | Path,
        dimension: int | None = None,
        *,
        hnsw_m: int | None = None,
        ef_construction: int | None = None,
        ef_search: int | None = None,
        full_scan_threshold: int = 1000,
        indexing_threshold: int | None = None,
        quantization: str | None = None,
        oversampling: float = 2.0,
        rescore: bool = True,
        query_scaling: bool = True,
        target_recall: float | None = None,
    ) -> None:
        qe = _edge()
        self._path = Path(path)
        self.target_recall = target_recall
        self._shard_path = self._path / SHARD_DIR
        self.ef_search = ef_search
        self.oversampling = float(oversampling)
        self.rescore = bool(rescore)
        self.query_scaling = bool(query_scaling)
        self._write_lock = threading.Lock()
        self._norm_mean: float | None = None  # mean stored doc_norm, for quantized search
        if quantization not in (None, "int8"):
            raise StoreError(f"unknown quantization {quantization!r}; use 'int8' or none")
        config_file = self._shard_path / "edge_config.json"
        if config_file.is_file():
            try:
                cfg = json.loads(config_file.read_text())
                vectors = cfg.get("vectors", {})
                if set(vectors) != {""}:
                    raise StoreError(
                        f"{self._shard_path}: Edge shard has named vectors {sorted(vectors)}; "
                        "magretrieve uses one unnamed vector"
                    )
                params = vectors[""]
                self._dim = check_vector_params(
                    f"Qdrant Edge shard {self._shard_path}",
                    params.get("distance"),
                    params["size"],
                    dimension,
                )
                self._hnsw = cfg.get("hnsw_config") or {}
                self.quantization = "int8" if cfg.get("quantization_config") else None
                self.shard = qe.EdgeShard.load(str(self._shard_path))
            except StoreError:
                raise
            except Exception as exc:  # a damaged config or shard: name it, no traceback
                raise StoreError(
                    f"{self._shard_path}: cannot open the Qdrant Edge shard "
                    f"({type(exc).__name__}: {exc})"
                ) from None
        else:
            if dimension is None:
                raise StoreError(
                    f"{self._path}: no Qdrant Edge store here; pass a dimension to create one"
                )
            self._dim = int(dimension)
            self._hnsw = {
                "m": int(hnsw_m or 16),
                "ef_construct": int(ef_construction or 100),
                "full_scan_threshold": int(full_scan_threshold),
            }
            quant = (
                qe.ScalarQuantizationConfig(type=qe.ScalarType.Int8, always_ram=True)
                if quantization == "int8"
                else None
            )
            config = qe.EdgeConfig(
                vectors=qe.EdgeVectorParams(size=self._dim, distance=qe.Distance.Dot),
                hnsw_config=qe.HnswIndexConfig(
                    m=self._hnsw["m"],
                    ef_construct=self._hnsw["ef_construct"],
                    full_scan_threshold=self._hnsw["full_scan_threshold"],
                ),
                quantization_config=quant,
                optimizers=(
                    qe.EdgeOptimizersConfig(indexing_threshold=int(indexing_threshold))
                    if indexing_threshold is not None
                    else None
                ),
            )
            self._path.mkdir(parents=True, exist_ok=True)
            self.shard = qe.EdgeShard.create(str(self._shard_path), config)
            self.quantization = quantization
        self._closed = False
        if self.ef_search is None and self.recall and "target" in self.recall:
            self.ef_search = self.recall.get("hnsw_ef")  # the value --target-recall chose

    @property
    def dimension(self) -> int:
        return self._dim

    @property
    def location(self) -> str:
        return f"qdrant-edge:{self._path}"

    def _params(self) -> Any:
        return search_params(
            _edge(), self.ef_search, self.quantization, self.rescore, self.oversampling
        )

    # ------------------------------------------------------------------ protocol

    def add(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        payloads: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        qe = _edge()
        points = build_points(ids, vectors, payloads, self._dim, self.location, qe.Point)
        if not points:
            return 0
        with self._write_lock:
            self.shard.update(qe.UpdateOperation.upsert_points(points))
            self._norm_mean = None
        return len(points)

    def _query_factors(self, q: np.ndarray) -> np.ndarray:
        """See :func:`~magretrieve.adapters.qdrant_store.quantized_query_factors`."""
        if not self.quantization or not self.query_scaling:
            return np.ones(len(q), dtype=np.float32)
        if self._norm_mean is None:
            qe = _edge()
            records, _ = self.shard.scroll(
                qe.ScrollRequest(
                    limit=512,
                    with_payload=qe.PayloadSelector.Include(["doc_norm"]),
                    with_vector=False,
                )
            )
            self._norm_mean = mean_doc_norm(r.payload for r in records)
        return quantized_query_factors(q, self._norm_mean)

    def search(
        self, queries: np.ndarray, k: int, *, with_vectors: bool = True
    ) -> list[list[StoreHit]]:
        qe = _edge()
        q = check_queries(queries, self._dim, self.location)
        k = check_k(k)
        params = self._params()
        factors = self._query_factors(q)
        q = q * factors[:, None]
        requests = [
            qe.QueryRequest(
                limit=k,
                query=qe.Query.Nearest(row.tolist()),
                with_payload=True,
                with_vector=with_vectors,
                params=params,
            )
            for row in q
        ]
        if len(requests) == 1:
            results = [self.shard.query(requests[0])]
        else:
            results = self.shard.query_batch(qe.QueryBatchRequest(requests))
        return to_hits(results, factors, with_vectors)

    def delete(self, ids: Sequence[str]) -> int:
        qe = _edge()
        present = self.existing(ids)
        if present:
            with self._write_lock:
                self.shard.update(
                    qe.UpdateOperation.delete_points([point_uuid(i) for i in present])
                )
        return len(present)

    def count(self) -> int:
        return int(self.shard.count(_edge().CountRequest(exact=True)))

    def get(self, ids: Sequence[str]) -> list[StoreRecord | None]:
        ids = list(ids)
        records = self.shard.retrieve(
            [point_uuid(i) for i in ids], with_payload=True, with_vector=True
        )
        return records_in_order(ids, records)

    def existing(self, ids: Sequence[str]) -> set[str]:
        return existing_ids(
            ids, lambda uuids: self.shard.retrieve(uuids, with_payload=False, with_vector=False)
        )

    def iter_ids(self) -> Iterator[str]:
        qe = _edge()
        return scroll_doc_ids(
            lambda offset: self.shard.scroll(
                qe.ScrollRequest(
                    offset=offset,
                    limit=1024,
                    with_payload=qe.PayloadSelector.Include(["doc_id"]),
                    with_vector=False,
                )
            )
        )

    def read_metadata(self) -> dict[str, Any] | None:
        f = self._path / META_FILE
        if not f.is_file():
            return None
        try:
            return state_metadata(json.loads(f.read_text()), str(f))
        except (ValueError, AttributeError) as exc:  # bad JSON, bad UTF-8, not an object
            raise StoreError(f"{f}: unreadable ({exc})") from None

    def _meta_doc(self) -> dict[str, Any]:
        f = self._path / META_FILE
        try:
            doc = json.loads(f.read_text()) if f.is_file() else {}
        except (OSError, ValueError):
            doc = {}
        return doc if isinstance(doc, dict) else {}

    def write_metadata(self, meta: Mapping[str, Any]) -> None:
        recall = self._meta_doc().get("recall")
        self._write_meta_doc(dict(meta), recall)

    def _write_meta_doc(self, meta: dict[str, Any] | None, recall: Any) -> None:
        doc: dict[str, Any] = {"format": "magretrieve-qdrant-edge-store", "metadata": meta}
        if recall is not None:
            doc["recall"] = recall
        atomic_write_json(self._path / META_FILE, doc)

    @property
    def recall(self) -> dict[str, Any] | None:
        """The last recall@10 measurement (kept in magretrieve_store.json)."""
        return self._meta_doc().get("recall")

    def measure_recall(
        self, queries: np.ndarray | None = None, target_recall: float | None = None
    ) -> dict[str, Any] | None:
        """recall@10 of the HNSW search against exact search (tuning hnsw_ef to a target).

        See :mod:`magretrieve.adapters._ann_recall`; the result is kept in
        ``magretrieve_store.json`` and reported by ``describe()``.
        """
        if target_recall is not None:
            target_recall = registry.OPTIONS["target_recall"].check(target_recall, self.location)
        if not self.count():
            return None
        qe = _edge()
        ids: list[str] = []
        vecs: list[np.ndarray] = []
        offset = None
        while True:
            records, offset = self.shard.scroll(
                qe.ScrollRequest(
                    offset=offset,
                    limit=2048,
                    with_payload=qe.PayloadSelector.Include(["doc_id"]),
                    with_vector=True,
                )
            )
            for r in records:
                ids.append(str(r.payload["doc_id"]))
                vecs.append(np.asarray(r.vector, dtype=np.float32))
            if offset is None:
                break

        def set_ef(value: int) -> None:
            self.ef_search = int(value)

        knob = _ann_recall.Knob(
            "hnsw_ef",
            _ann_recall.HNSW_EF,
            set_ef,
            int(self.ef_search or self._hnsw.get("ef_construct", 100)),
        )

        def search(q: np.ndarray, k: int) -> list[list[str]]:
            return [[h.id for h in row] for row in self.search(q, k, with_vectors=False)]

        recall = _ann_recall.measure(
            search,
            ids,
            np.stack(vecs),
            knob=knob if (target_recall is not None or self.ef_search) else None,
            target=target_recall,
            queries=queries,
            where=self.location,
        )
        if knob.current and (target_recall is not None or self.ef_search):
            self.ef_search = knob.current
        meta = self.read_metadata()
        self._write_meta_doc(meta, recall)
        return recall

    def persist(self) -> None:
        with self._write_lock:
            self.shard.flush()

    def optimize(self) -> None:
        """Build the HNSW index (and quantized vectors) over everything added so far."""
        with self._write_lock:
            self.shard.optimize()
            self.shard.flush()
        if self.count():
            self.measure_recall(target_recall=self.target_recall)

    def parameters(self) -> dict[str, Any]:
        info = self.shard.info()
        return {
            "distance": "Dot",
            "index": "hnsw",
            "hnsw_m": self._hnsw.get("m"),
            "ef_construction": self._hnsw.get("ef_construct"),
            "ef_search": self.ef_search,
            "quantization": self.quantization,
            "segments": info.segments_count,
            "indexed_vectors": info.indexed_vectors_count,
            **({"recall": self.recall} if self.recall else {}),
        }

    def close(self) -> None:
        if not self._closed:
            self.shard.flush()
            self.shard.close()
            self._closed = True


# ----------------------------------------------------------------------------- registry entry

EDGE_OPTIONS = (
    "hnsw_m",
    "ef_construction",
    "ef_search",
    "quantization",
    "oversampling",
    "rescore",
    "query_scaling",
    "full_scan_threshold",
    "indexing_threshold",
    "target_recall",
)

registry.register(
    registry.Backend(
        prefix="qdrant-edge",
        form="qdrant-edge:DIR",
        parse=registry.parse_dir,
        open=lambda loc, dimension, options: QdrantEdgeStore(loc["path"], dimension, **options),
        options=EDGE_OPTIONS,
        folder=True,
        extra="qdrant-edge",
        examples=lambda tmp: [registry.Example("qdrant-edge", f"qdrant-edge:{tmp / 'edge'}")],
    )
)
