"""Qdrant through qdrant-client (≥ 1.20, ``query_points`` API): a server URL or embedded mode.

One code path serves ``QdrantClient(url=...)`` (a server or cluster), ``QdrantClient(path=...)``
(embedded, persisted) and ``QdrantClient(":memory:")``: only the client differs. Embedded mode
searches exactly (brute force) and ignores HNSW/quantization settings; a server builds HNSW.

Rules kept here:

- collections are created with ``Distance.DOT``; an existing collection with Cosine, Euclid or
  Manhattan is refused with an error naming the collection and its distance (under Cosine
  Qdrant normalizes vectors at upload, which would erase the magnitude the model keeps);
- the vector size is checked against the model's dimension;
- point ids are ``uuid5(document id)``, so re-indexing overwrites instead of duplicating;
- the payload carries ``doc_id`` and ``doc_norm`` (the stored vector's norm) next to the
  user's fields, so filters and dashboards see the magnitude without fetching vectors;
- which model built the collection is kept in the collection's ``metadata``.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.adapters import registry
from magretrieve.adapters._qdrant_common import (
    RESERVED,
    build_points,
    check_vector_params,
    existing_ids,
    make_payload,
    mean_doc_norm,
    quantized_query_factors,
    records_in_order,
    scroll_doc_ids,
    search_params,
    split_payload,
    to_hits,
)
from magretrieve.adapters.base import (
    StoreHit,
    StoreRecord,
    VectorStore,
    check_k,
    check_queries,
    point_uuid,
    require,
)
from magretrieve.errors import StoreError

# RESERVED, make_payload, split_payload and quantized_query_factors live in _qdrant_common
# (shared with the Edge store) and stay importable from here.
__all__ = [
    "META_KEY",
    "RESERVED",
    "QdrantStore",
    "make_payload",
    "quantized_query_factors",
    "split_payload",
]

logger = logging.getLogger(__name__)

#: Collection-metadata key under which the building model is recorded.
META_KEY = "magretrieve"


def _models() -> Any:
    return require("qdrant_client.models", "qdrant-client", "qdrant")


class QdrantStore(VectorStore):
    """A Qdrant collection searched by dot product (= inner product of stored vectors)."""

    kind = "qdrant"

    def __init__(
        self,
        client: Any,
        collection: str,
        dimension: int | None = None,
        *,
        hnsw_m: int | None = None,
        ef_construction: int | None = None,
        ef_search: int | None = None,
        quantization: str | None = None,
        oversampling: float = 2.0,
        rescore: bool = True,
        query_scaling: bool = True,
        shard_number: int | None = None,
        replication_factor: int | None = None,
        on_disk: bool | None = None,
        owns_client: bool = False,
        location: str | None = None,
    ) -> None:
        models = _models()
        self.client = client
        self.collection = collection
        self._owns = owns_client
        self._location = location or f"qdrant collection {collection!r}"
        self.ef_search = ef_search
        self.oversampling = float(oversampling)
        self.rescore = bool(rescore)
        self.query_scaling = bool(query_scaling)
        # embedded mode: exact search, no HNSW, and search params only raise warnings
        self.embedded = type(getattr(client, "_client", None)).__name__ == "QdrantLocal"
        self._norm_mean: float | None = None  # mean stored doc_norm, for quantized search
        # a remote client is safe to share between threads; embedded mode gets a lock
        self.thread_safe_search = not self.embedded
        if quantization not in (None, "int8"):
            raise StoreError(f"unknown Qdrant quantization {quantization!r}; use 'int8' or none")
        self._created = False
        if client.collection_exists(collection):
            info = client.get_collection(collection)
            params = info.config.params.vectors
            if isinstance(params, Mapping):
                raise StoreError(
                    f"Qdrant collection {collection!r} has named vectors {sorted(params)}; "
                    "magretrieve uses one unnamed vector per point"
                )
            self._dim = check_vector_params(
                f"Qdrant collection {collection!r}",
                getattr(params.distance, "value", str(params.distance)),
                params.size,
                dimension,
                cosine="normalizes vectors at upload",
                advice=". Create a new collection, or rank this Cosine one by cos·m(d) after "
                "`magretrieve annotate`",
            )
            q = info.config.quantization_config
            self.quantization = "int8" if q is not None else None
            self._hnsw = info.config.hnsw_config
            self._shards = (info.config.params.shard_number, info.config.params.replication_factor)
        else:
            if dimension is None:
                raise StoreError(
                    f"Qdrant collection {collection!r} does not exist; pass a dimension to create it"
                )
            self._dim = int(dimension)
            hnsw = None
            if hnsw_m is not None or ef_construction is not None:
                hnsw = models.HnswConfigDiff(m=hnsw_m, ef_construct=ef_construction)
            quant = None
            if quantization == "int8":
                quant = models.ScalarQuantization(
                    scalar=models.ScalarQuantizationConfig(
                        type=models.ScalarType.INT8, always_ram=True
                    )
                )
            client.create_collection(
                collection,
                vectors_config=models.VectorParams(
                    size=self._dim, distance=models.Distance.DOT, on_disk=on_disk
                ),
                hnsw_config=hnsw,
                quantization_config=quant,
                shard_number=shard_number,
                replication_factor=replication_factor,
            )
            self.quantization = quantization
            self._hnsw = hnsw
            self._shards = (shard_number, replication_factor)
            self._created = True

    @property
    def dimension(self) -> int:
        return self._dim

    @property
    def location(self) -> str:
        return self._location

    def _search_params(self) -> Any:
        if self.embedded:
            return None
        return search_params(
            _models(), self.ef_search, self.quantization, self.rescore, self.oversampling
        )

    # ------------------------------------------------------------------ protocol

    def add(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        payloads: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        models = _models()
        points = build_points(
            ids,
            vectors,
            payloads,
            self._dim,
            self.location,
            lambda uid, vec, pay: models.PointStruct(id=uid, vector=vec, payload=pay),
        )
        if not points:
            return 0
        self.client.upsert(self.collection, points=points, wait=True)
        self._norm_mean = None
        return len(points)

    def _query_factors(self, q: np.ndarray) -> np.ndarray:
        if not self.quantization or self.embedded or not self.query_scaling:
            return np.ones(len(q), dtype=np.float32)
        if self._norm_mean is None:
            points, _ = self.client.scroll(
                self.collection, limit=512, with_payload=["doc_norm"], with_vectors=False
            )
            self._norm_mean = mean_doc_norm(p.payload for p in points)
        return quantized_query_factors(q, self._norm_mean)

    def search(
        self, queries: np.ndarray, k: int, *, with_vectors: bool = True
    ) -> list[list[StoreHit]]:
        models = _models()
        q = check_queries(queries, self._dim, self.location)
        k = check_k(k)
        params = self._search_params()
        factors = self._query_factors(q)
        q = q * factors[:, None]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # embedded mode: "params ignored"
            if len(q) == 1:
                res = [
                    self.client.query_points(
                        self.collection,
                        query=q[0].tolist(),
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
                        models.QueryRequest(
                            query=row.tolist(),
                            limit=k,
                            with_payload=True,
                            with_vector=with_vectors,
                            params=params,
                        )
                        for row in q
                    ],
                )
        return to_hits((response.points for response in res), factors, with_vectors)

    def delete(self, ids: Sequence[str]) -> int:
        models = _models()
        present = self.existing(ids)
        if present:
            self.client.delete(
                self.collection,
                points_selector=models.PointIdsList(points=[point_uuid(i) for i in present]),
                wait=True,
            )
        return len(present)

    def count(self) -> int:
        return int(self.client.count(self.collection, exact=True).count)

    def get(self, ids: Sequence[str]) -> list[StoreRecord | None]:
        ids = list(ids)
        points = self.client.retrieve(
            self.collection, ids=[point_uuid(i) for i in ids], with_payload=True, with_vectors=True
        )
        return records_in_order(ids, points)

    def existing(self, ids: Sequence[str]) -> set[str]:
        return existing_ids(
            ids,
            lambda uuids: self.client.retrieve(
                self.collection, ids=uuids, with_payload=False, with_vectors=False
            ),
        )

    def iter_ids(self) -> Iterator[str]:
        return scroll_doc_ids(
            lambda offset: self.client.scroll(
                self.collection,
                limit=1024,
                offset=offset,
                with_payload=["doc_id"],
                with_vectors=False,
            )
        )

    def foreign_points(self) -> int:
        """An existing collection without magretrieve's metadata: its points are not ours."""
        if self._created or self.read_metadata():
            return 0
        return self.count()

    def read_metadata(self) -> dict[str, Any] | None:
        meta = self.client.get_collection(self.collection).config.metadata or {}
        value = meta.get(META_KEY)
        return dict(value) if value else None

    def write_metadata(self, meta: Mapping[str, Any]) -> None:
        self.client.update_collection(self.collection, metadata={META_KEY: dict(meta)})

    def parameters(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "distance": "Dot",
            "index": "exact (embedded mode)" if self.embedded else "hnsw",
            "quantization": self.quantization,
        }
        if not self.embedded:
            hnsw = self._hnsw
            out["hnsw_m"] = getattr(hnsw, "m", None)
            out["ef_construction"] = getattr(hnsw, "ef_construct", None)
            out["ef_search"] = self.ef_search
            out["shard_number"], out["replication_factor"] = self._shards
            if self.quantization:
                out["rescore"], out["oversampling"] = self.rescore, self.oversampling
        return out

    def close(self) -> None:
        if self._owns:
            self.client.close()


# ----------------------------------------------------------------------------- registry entries

QDRANT_OPTIONS = (
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
    "prefetch",
)
_CLIENT_OPTIONS = ("api_key", "timeout")


def _store_for(
    client: Any,
    collection: str,
    dimension: Any,
    opts: dict,
    *,
    owns: bool,
    where: str | None,
    annotating: bool = False,
) -> Any:
    """QdrantStore, or the plug-in QdrantCosineStore for an existing Cosine collection."""
    info = client.get_collection(collection) if client.collection_exists(collection) else None
    params = getattr(getattr(info, "config", None), "params", None)
    distance = getattr(getattr(params, "vectors", None), "distance", None)
    if getattr(distance, "value", distance) == "Cosine":
        from magretrieve.adapters.qdrant_cosine_store import QdrantCosineStore

        extra = sorted(set(opts) - {"prefetch", "ef_search"})
        if extra:
            raise StoreError(f"option(s) {extra} do not apply to an annotated Cosine collection")
        return QdrantCosineStore(
            client,
            collection,
            dimension,
            owns_client=owns,
            location=where,
            annotating=annotating,
            **opts,
        )
    if annotating:
        raise StoreError(
            f"{where or collection}: annotate is for an existing Cosine collection; this one "
            "is not (a Dot collection written by magretrieve already keeps the magnitude)"
        )
    if "prefetch" in opts:
        raise StoreError("option 'prefetch' applies only to an annotated Cosine collection")
    return QdrantStore(client, collection, dimension, owns_client=owns, location=where, **opts)


def _open_with_client(
    make_client: Any,
    where: str,
    collection: str,
    dimension: Any,
    opts: dict,
    annotating: bool = False,
):
    client_opts = {k: opts.pop(k) for k in _CLIENT_OPTIONS if k in opts}
    client = make_client(
        require("qdrant_client", "qdrant-client", "qdrant").QdrantClient, client_opts
    )
    try:
        return _store_for(
            client, collection, dimension, opts, owns=True, where=where, annotating=annotating
        )
    except StoreError:
        client.close()
        raise
    except Exception as exc:  # connection refused, auth, server-side errors
        client.close()
        raise StoreError(f"{where}: Qdrant request failed ({type(exc).__name__}: {exc})") from exc


def _open_server(
    loc: dict[str, str], dimension: int | None, opts: dict[str, Any], annotating: bool = False
) -> QdrantStore:
    def make(client_cls: Any, client_opts: dict[str, Any]) -> Any:
        client_opts.setdefault("api_key", os.environ.get("QDRANT_API_KEY"))
        return client_cls(url=loc["url"], **client_opts)

    where = f"qdrant:{loc['url']}/{loc['collection']}"
    return _open_with_client(make, where, loc["collection"], dimension, dict(opts), annotating)


def _open_local(
    loc: dict[str, str], dimension: int | None, opts: dict[str, Any], annotating: bool = False
) -> QdrantStore:
    def make(client_cls: Any, client_opts: dict[str, Any]) -> Any:
        Path(loc["path"]).mkdir(parents=True, exist_ok=True)
        try:
            return client_cls(path=loc["path"], force_disable_check_same_thread=True)
        except RuntimeError as exc:  # portalocker: another process holds the folder
            raise StoreError(f"{loc['path']}: cannot open embedded Qdrant ({exc})") from None

    where = f"qdrant-local:{loc['path']}/{loc['collection']}"
    return _open_with_client(make, where, loc["collection"], dimension, dict(opts), annotating)


def _open_memory(
    loc: dict[str, str], dimension: int | None, opts: dict[str, Any], annotating: bool = False
) -> QdrantStore:
    where = f"qdrant-memory:{loc['collection']}"
    return _open_with_client(
        lambda cls, _: cls(":memory:"), where, loc["collection"], dimension, dict(opts), annotating
    )


def _adopts(obj: Any) -> bool:
    return (type(obj).__module__ or "").startswith("qdrant_client")


def _adopt_client(
    client: Any, dimension: int | None, collection: str | None, options: dict[str, Any]
) -> QdrantStore:
    if not collection:
        raise StoreError("a QdrantClient needs collection='name'")
    backend, _ = registry.backend_for("qdrant-memory:x")
    opts = registry.check_options(backend, options, f"Qdrant collection {collection!r}")
    for key in _CLIENT_OPTIONS:
        opts.pop(key, None)
    return _store_for(client, collection, dimension, opts, owns=False, where=None)


#: The openers by spec prefix (``magretrieve annotate`` opens Cosine collections through them).
OPENERS = {"qdrant": _open_server, "qdrant-local": _open_local, "qdrant-memory": _open_memory}


registry.register(
    registry.Backend(
        prefix="qdrant",
        form="qdrant:URL/COLLECTION",
        parse=registry.parse_url_collection,
        open=_open_server,
        options=QDRANT_OPTIONS,
        adopts=_adopts,
        adopt=_adopt_client,
        extra="qdrant",
    )
)
registry.register(
    registry.Backend(
        prefix="qdrant-local",
        form="qdrant-local:DIR/COLLECTION",
        parse=registry.parse_path_collection,
        open=_open_local,
        options=QDRANT_OPTIONS,
        folder=True,
        extra="qdrant",
        examples=lambda tmp: [
            registry.Example("qdrant-local", f"qdrant-local:{tmp / 'qdrant'}/test")
        ],
    )
)
registry.register(
    registry.Backend(
        prefix="qdrant-memory",
        form="qdrant-memory:COLLECTION",
        parse=registry.parse_collection,
        open=_open_memory,
        options=QDRANT_OPTIONS,
        persists=lambda loc: False,
        extra="qdrant",
        examples=lambda tmp: [registry.Example("qdrant-memory", "qdrant-memory:test")],
    )
)
