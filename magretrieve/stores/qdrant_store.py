"""One Qdrant store over a small client interface: qdrant-client (server, cluster, embedded
on disk or in memory) and Qdrant Edge run the same code; only :mod:`._qdrant_clients` differs.

Rules kept here, for every client:

- collections/shards are created with ``Distance.DOT``; an existing one with Cosine, Euclid or
  Manhattan is refused with an error naming it and its distance (under Cosine Qdrant
  normalizes vectors at upload, which would erase the magnitude the model keeps);
- the vector size is checked against the model's dimension;
- point ids are ``uuid5(document id)``, so re-indexing overwrites instead of duplicating;
- the payload carries ``doc_id`` and ``doc_norm`` (the stored vector's norm) next to the
  user's fields, so hits report ``doc_norm`` without fetching vectors, and filters and
  dashboards see the magnitude;
- int8-quantized search scales each query to the stored norms (see ``_qdrant_common``);
- after ``optimize()`` an HNSW index's recall@10 is measured against exact search and
  ``hnsw_ef`` can be tuned to ``target_recall`` (see ``_ann_recall``);
- which model built the collection is kept in the collection's metadata (Edge: a file beside
  the shard); a non-empty collection without it is *foreign* and is written only with force.

Embedded qdrant-client searches exactly (brute force) and ignores HNSW/quantization settings.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.extras import require
from magretrieve.core.options import option
from magretrieve.core.redact import redact
from magretrieve.stores import _ann_recall, registry
from magretrieve.stores._qdrant_clients import META_KEY, ClientAPI
from magretrieve.stores._qdrant_common import (
    RESERVED,
    check_vector_params,
    existing_ids,
    make_payload,
    mean_doc_norm,
    point_payload,
    quantized_query_factors,
    records_in_order,
    scroll_doc_ids,
    search_params,
    split_payload,
    to_hits,
)
from magretrieve.stores._writer_lock import open_engine
from magretrieve.stores.base import (
    Batch,
    StoreHit,
    StoreRecord,
    VectorStore,
    closed_on_failure,
    missing_store,
    one_line,
    point_uuid,
)
from magretrieve.stores.options import (
    AnnotatedOptions,
    HnswOptions,
    IndexOptions,
    RecallOptions,
    StoreOptions,
)

# RESERVED, make_payload, split_payload and quantized_query_factors live in _qdrant_common
# and stay importable from here.
__all__ = [
    "META_KEY",
    "RESERVED",
    "QdrantStore",
    "make_payload",
    "quantized_query_factors",
    "split_payload",
]

logger = logging.getLogger(__name__)


#: The index keywords a Qdrant collection or Edge shard takes: its HNSW graph, a recall target.
INDEX_KEYWORDS = (*HnswOptions.keywords(), *RecallOptions.keywords())
#: A collection (or Edge shard) holding fewer points than this is searched with Qdrant's
#: ``exact=True`` (a plain scan of the full vectors), not its HNSW graph: below it one exact
#: query takes no longer than one HNSW query (docs/stores.md, "Exact below a size").
EXACT_BELOW = 5_000


class QdrantStore(VectorStore):
    """A Qdrant collection (or Edge shard) searched by dot product.

    ``QdrantStore(client, collection, dimension, ...)`` wraps a ``qdrant_client.QdrantClient``;
    :class:`~magretrieve.stores.qdrant_edge_store.QdrantEdgeStore` passes an Edge shard
    through the same class (:meth:`over`).
    """

    kind = "qdrant"
    #: Points below which the collection is searched exactly (:data:`EXACT_BELOW`).
    exact_below = EXACT_BELOW
    #: persist is Edge's shard flush under its write lock (searches do not take it) or a no-op
    persists_beside_search = True

    def __init__(
        self,
        client: Any = None,
        collection: str | None = None,
        dimension: int | None = None,
        *,
        owns_client: bool = False,
        location: str | None = None,
        api: Any = None,
        options: IndexOptions | None = None,
        quantization: str | None = None,
        oversampling: float = 2.0,
        rescore: bool = True,
        query_scaling: bool = True,
        **knobs: Any,
    ) -> None:
        """Over ``client`` and ``collection``, or over ``api``: any object implementing the
        client interface of :mod:`._qdrant_clients` (the Edge shard's). ``options`` (or its
        keywords ``hnsw_m``, ``ef_construction``, ``ef_search``, ``target_recall``): the HNSW
        index; the other keywords are creation options of the client (``shard_number``, ...)."""
        if api is None:
            api = ClientAPI(client, str(collection), owns_client=owns_client, location=location)
        self.client, self.collection = client, collection
        self.api = api
        index = {k: knobs.pop(k) for k in INDEX_KEYWORDS if k in knobs}
        opts = IndexOptions.of(options, index, api.where, INDEX_KEYWORDS)
        create_options = knobs
        self.ef_search = opts.hnsw.ef_search
        self.oversampling = float(oversampling)
        self.rescore = bool(rescore)
        self.query_scaling = bool(query_scaling)
        self.target_recall = opts.target_recall
        self.embedded = bool(api.embedded)
        self.thread_safe_search = bool(api.thread_safe)
        self._norm_mean: float | None = None  # mean stored doc_norm, for quantized search
        if quantization not in (None, "int8"):
            raise StoreError(f"unknown Qdrant quantization {quantization!r}; use 'int8' or none")
        self.quantization = quantization
        self._asked = {
            "hnsw_m": opts.hnsw.m,
            "ef_construction": opts.hnsw.ef_construction,
            "quantization": quantization,
            **create_options,
        }
        what = "Qdrant Edge store" if hasattr(api, "shard_path") else api.label
        self._open_or_create(dimension, what, self._asked)
        if not self.created_here:
            api.open()  # after every check: an Edge shard is held from here on
        if self.ef_search is None:
            recall = self._doc().get("recall") or {}
            if "target" in recall:
                self.ef_search = recall.get("hnsw_ef")  # the value --target-recall chose

    @classmethod
    def over(cls, api: Any, dimension: int | None, **options: Any) -> QdrantStore:
        """The store over any object implementing the client interface of _qdrant_clients."""
        return cls(dimension=dimension, api=api, **options)

    def _before_create(self) -> bool:
        return self.api.claim()

    def _exists(self) -> bool:
        self._config = self.api.config()
        return self._config is not None

    def _open_existing(self, dimension: int | None) -> int:
        cfg, api = self._config, self.api
        if cfg["named"] is not None:
            raise StoreError(
                f"{api.label} has named vectors {cfg['named']}; magretrieve uses one "
                "unnamed vector per point"
            )
        edge = api.__class__.__name__ == "EdgeAPI"
        dim = check_vector_params(
            api.label,
            cfg["distance"],
            cfg["size"],
            dimension,
            advice=""
            if edge
            else ". Create a new collection, or rank this Cosine one by cos·m(d) after "
            "`magretrieve annotate`",
        )
        self.quantization = "int8" if cfg["quantized"] else None
        self._hnsw, self._shards = cfg["hnsw"] or {}, cfg["shards"]
        return dim

    def _recorded_build(self) -> dict[str, Any]:
        """What the collection or shard was built with (its own config records it). Embedded
        qdrant-client builds no index and reports its defaults whatever was asked, so it has
        nothing recorded to compare."""
        cfg = self._config
        if self.embedded or cfg is None:
            return {}
        hnsw = cfg["hnsw"] or {}
        recorded: dict[str, Any] = {
            "hnsw_m": hnsw.get("m"),
            "ef_construction": hnsw.get("ef_construct"),
            "quantization": "int8" if cfg["quantized"] else "none",
            "full_scan_threshold": hnsw.get("full_scan_threshold"),
            "indexing_threshold": cfg.get("indexing_threshold"),
        }
        if cfg["shards"] is not None:
            recorded["shard_number"], recorded["replication_factor"] = cfg["shards"]
        return recorded

    def _create(self, dimension: int) -> None:
        made = self.api.create(dimension, self._asked)
        self._hnsw, self._shards = made["hnsw"], made["shards"]

    @property
    def location(self) -> str:
        return self.api.where

    @property
    def shard(self) -> Any:
        """The Qdrant Edge shard (Edge stores only)."""
        return getattr(self.api, "shard", None)

    def _search_params(self) -> Any:
        if self.embedded:
            return None
        return search_params(
            self.api.models,
            self.ef_search,
            self.quantization,
            self.rescore,
            self.oversampling,
            exact=self._searches_exactly(),
        )

    def _searches_exactly(self) -> bool:
        """Whether the collection holds fewer points than :attr:`exact_below` (searched with
        ``exact=True``; embedded qdrant-client always searches exactly)."""
        return not self.embedded and self.api.count() < self.exact_below

    def _doc(self) -> dict[str, Any]:
        return self.api.read_doc()

    # ------------------------------------------------------------------ protocol

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return self.api.errors()

    def _upsert(self, batch: Batch) -> None:
        self.api.upsert(
            [(point_uuid(i), v.tolist(), point_payload(i, p, n)) for i, v, p, n in batch.rows()]
        )
        self._norm_mean = None

    def _query_factors(self, q: np.ndarray) -> np.ndarray:
        if not self.quantization or self.embedded or not self.query_scaling:
            return np.ones(len(q), dtype=np.float32)
        if self._norm_mean is None:
            points, _ = self.api.scroll(None, 512, ["doc_norm"], False)
            self._norm_mean = mean_doc_norm(p.payload for p in points)
        return quantized_query_factors(q, self._norm_mean)

    def _query(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        factors = self._query_factors(q)
        q = q * factors[:, None]
        results = self.api.query(
            [row.tolist() for row in q], k, with_vectors, self._search_params()
        )
        return to_hits(results, factors, with_vectors)

    def _delete(self, ids: list[str]) -> int:
        present = list(self._existing(ids))
        if present:
            self.api.delete([point_uuid(i) for i in present])
        return len(present)

    def _count(self) -> int:
        return self.api.count()

    def _fetch(self, ids: list[str]) -> Iterable[StoreRecord]:
        return [
            r
            for r in records_in_order(
                ids, self.api.retrieve([point_uuid(i) for i in ids], True, True)
            )
            if r is not None
        ]

    def _existing(self, ids: list[str]) -> Iterable[str]:
        return existing_ids(ids, lambda uuids: self.api.retrieve(uuids, False, False))

    def _scan_ids(self) -> Iterator[str]:
        return scroll_doc_ids(lambda offset: self.api.scroll(offset, 1024, ["doc_id"], False))

    def _read_meta(self) -> dict[str, Any] | None:
        meta = self._doc().get("metadata")
        return dict(meta) if meta else None

    def _write_meta(self, meta: dict[str, Any]) -> None:
        doc = self._doc()
        self.api.write_doc({"metadata": meta, "recall": doc.get("recall")})

    @property
    def recall(self) -> dict[str, Any] | None:
        """The last recall@10 measurement, kept with the model metadata."""
        return self._doc().get("recall")

    def persist(self) -> None:
        self.api.flush()

    def optimize(self) -> None:
        """Build the HNSW index (Edge), then measure its recall (tuned to ``target_recall``)."""
        self.api.optimize()
        self.measure_recall(target_recall=self.target_recall)

    def _recall_knob(self) -> Any:
        """``hnsw_ef`` of the HNSW index (None: the search is exact, embedded qdrant-client
        or a collection below :attr:`exact_below`)."""
        if self.embedded or self._searches_exactly():
            return None

        def set_ef(value: int) -> None:
            self.ef_search = int(value)

        start = int(self.ef_search or self._hnsw.get("ef_construct") or 100)
        return _ann_recall.Knob("hnsw_ef", _ann_recall.HNSW_EF, set_ef, start)

    def _stored_vectors(self) -> tuple[list[str], np.ndarray]:
        ids: list[str] = []
        vecs: list[np.ndarray] = []
        offset = None
        while True:
            points, offset = self.api.scroll(offset, 2048, ["doc_id"], True)
            for p in points:
                ids.append(str(p.payload["doc_id"]))
                vecs.append(np.asarray(p.vector, dtype=np.float32))
            if offset is None:
                break
        return ids, np.stack(vecs) if vecs else np.zeros((0, self._dim), dtype=np.float32)

    def _tune(self, run: Any, knob: Any, target: float | None) -> dict[str, Any]:
        """hnsw_ef is tuned for a target, and re-measured at a value given."""
        tune = target is not None or self.ef_search is not None
        recall = dict(run(knob if tune else None, target))
        if tune:
            self.ef_search = knob.current
        return recall

    def _keep_recall(self, recall: dict[str, Any], knob: Any) -> None:
        """Kept beside the model metadata."""
        self.api.write_doc({"metadata": self.read_metadata(), "recall": recall})

    def _describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "distance": "Dot",
            "index": "exact (embedded mode)" if self.embedded else "hnsw",
            "quantization": self.quantization,
        }
        if not self.embedded:
            out["hnsw_m"] = self._hnsw.get("m")
            out["ef_construction"] = self._hnsw.get("ef_construct")
            out["ef_search"] = self.ef_search
            out.update(_ann_recall.search_mode(self.api.count(), self.exact_below))
            if self._shards is not None:
                out["shard_number"], out["replication_factor"] = self._shards
            if self.quantization:
                out["rescore"], out["oversampling"] = self.rescore, self.oversampling
            out.update(self.api.info())
            recall = self.recall
            if recall:
                out["recall"] = recall
        return out

    def close(self) -> None:
        self.api.close()


# ----------------------------------------------------------------------------- registry entries


@dataclass(frozen=True)
class QdrantQuantizationOptions(StoreOptions):
    """Quantized search, shared with Qdrant Edge: int8 vectors, searched with rescoring."""

    quantization: str | None = option(
        "Qdrant / Edge scalar quantization (searched with rescoring).",
        flag="--quantization",
        choices=("int8",),
    )
    oversampling: float | None = option("Qdrant quantized search oversampling.", minimum=1.0)
    rescore: bool | None = option("Qdrant quantized search rescoring with full vectors.")
    query_scaling: bool | None = option("Scale int8-quantized queries to the stored norms.")


@dataclass(frozen=True)
class QdrantServerOptions(StoreOptions):
    """How a Qdrant server lays a new collection out."""

    shard_number: int | None = option("Qdrant server: shards.", flag="--shard-number", minimum=1)
    replication_factor: int | None = option(
        "Qdrant server: replicas.", flag="--replication-factor", minimum=1
    )
    on_disk: bool | None = option("Qdrant server: keep vectors on disk.")


@dataclass(frozen=True)
class QdrantClientOptions(StoreOptions):
    """How the client reaches a Qdrant server (not options of the collection)."""

    api_key: str | None = option(
        "Qdrant server API key (default $QDRANT_API_KEY).", env="QDRANT_API_KEY"
    )
    timeout: int | None = option("Qdrant server request timeout in seconds.", minimum=1)


#: The option classes of a Qdrant collection (the client's are QdrantClientOptions).
_COLLECTION_OPTIONS = (
    RecallOptions,
    HnswOptions,
    QdrantQuantizationOptions,
    QdrantServerOptions,
    AnnotatedOptions,
)
QDRANT_OPTIONS = (*_COLLECTION_OPTIONS, QdrantClientOptions)
_CLIENT_OPTIONS = QdrantClientOptions.keywords()


def _store_for(
    client: Any,
    collection: str,
    dimension: Any,
    opts: dict[str, Any],
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
        from magretrieve.stores.qdrant_cosine_store import QdrantCosineStore

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
    if annotating and info is None:
        raise StoreError(f"{where or collection}: no such collection to annotate")
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
    opts: dict[str, Any],
    annotating: bool = False,
) -> VectorStore:
    client_opts = {k: opts.pop(k) for k in _CLIENT_OPTIONS if k in opts}
    client_cls = require("qdrant_client").QdrantClient
    try:
        client = make_client(client_cls, client_opts)
    except StoreError:
        raise
    except Exception as exc:  # a URL or option the client cannot use
        raise StoreError(
            f"{where}: cannot open Qdrant ({type(exc).__name__}: {one_line(exc)})"
        ) from None
    with closed_on_failure(client):
        try:
            return _store_for(
                client, collection, dimension, opts, owns=True, where=where, annotating=annotating
            )
        except StoreError:
            raise
        except Exception as exc:  # connection refused, auth, server-side errors
            raise StoreError(
                f"{where}: Qdrant request failed ({type(exc).__name__}: {one_line(exc)})"
            ) from None


def _open_server(
    loc: dict[str, str], dimension: int | None, annotating: bool = False, **opts: Any
) -> VectorStore:
    def make(client_cls: Any, client_opts: dict[str, Any]) -> Any:
        client_opts["api_key"] = QdrantClientOptions.named("api_key").from_env(
            client_opts.get("api_key")
        )
        return client_cls(url=loc["url"], **client_opts)

    where = f"qdrant:{redact(loc['url'])}/{loc['collection']}"
    return _open_with_client(make, where, loc["collection"], dimension, dict(opts), annotating)


def _open_local(
    loc: dict[str, str], dimension: int | None, annotating: bool = False, **opts: Any
) -> VectorStore:
    def make(client_cls: Any, client_opts: dict[str, Any]) -> Any:
        if (
            dimension is None
            and not (Path(loc["path"]) / "collection" / loc["collection"]).is_dir()
        ):
            raise missing_store(where, f"Qdrant collection {loc['collection']!r}")
        Path(loc["path"]).mkdir(parents=True, exist_ok=True)
        try:  # portalocker refuses a folder another process holds
            return open_engine(
                lambda: client_cls(path=loc["path"], force_disable_check_same_thread=True),
                Path(loc["path"]) / ".lock",
                where,
                "embedded Qdrant",
            )
        except RuntimeError as exc:
            raise StoreError(f"{loc['path']}: cannot open embedded Qdrant ({exc})") from None

    where = f"qdrant-local:{loc['path']}/{loc['collection']}"
    return _open_with_client(make, where, loc["collection"], dimension, dict(opts), annotating)


def _open_memory(
    loc: dict[str, str], dimension: int | None, annotating: bool = False, **opts: Any
) -> VectorStore:
    where = f"qdrant-memory:{loc['collection']}"
    return _open_with_client(
        lambda cls, _: cls(":memory:"), where, loc["collection"], dimension, dict(opts), annotating
    )


#: Characters a Qdrant collection name may not hold (the server refuses them; embedded Qdrant
#: on disk would use the name as a folder name).
FORBIDDEN_IN_NAMES = set('<>:"/\\|?*\x00')
#: Longest collection name Qdrant accepts.
MAX_COLLECTION_NAME = 255


def check_collection_name(name: str, where: str) -> str:
    """Refuse a collection name Qdrant would reject or store under another name."""
    bad = sorted(set(name) & FORBIDDEN_IN_NAMES)
    if (
        not name
        or bad
        or name in (".", "..")
        or name != name.strip()
        or len(name) > MAX_COLLECTION_NAME
    ):
        raise StoreError(
            f"{where}: collection name {name[:60]!r} is not a Qdrant name (1-"
            f"{MAX_COLLECTION_NAME} characters, no surrounding spaces, none of "
            "< > : \" / \\ | ? * NUL, not '.' or '..')"
        )
    return name


def parse_server(rest: str, spec: str) -> dict[str, str]:
    """``URL/COLLECTION`` with a URL Qdrant's client can use; anything else is one line."""
    from urllib.parse import urlsplit

    loc = registry.parse_url_collection(rest, spec)
    url = loc["url"]
    shown = redact(spec)
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise StoreError(
            f"store spec {shown!r}: {redact(url)!r} is not a Qdrant server URL (expected "
            "qdrant:http(s)://HOST[:PORT]/COLLECTION, e.g. qdrant:http://localhost:6333/scifact)"
        )
    check_collection_name(loc["collection"], f"store spec {shown!r}")
    return loc


def parse_local(rest: str, spec: str) -> dict[str, str]:
    loc = registry.parse_path_collection(rest, spec)
    check_collection_name(loc["collection"], f"store spec {spec!r}")
    return loc


def parse_memory(rest: str, spec: str) -> dict[str, str]:
    loc = registry.parse_collection(rest, spec)
    check_collection_name(loc["collection"], f"store spec {spec!r}")
    return loc


def _adopt_client(client: Any, collection: str, dimension: int | None, **options: Any) -> Any:
    return _store_for(client, collection, dimension, options, owns=False, where=None)


#: The openers by spec prefix (``magretrieve annotate`` opens Cosine collections through them).
OPENERS = {"qdrant": _open_server, "qdrant-local": _open_local, "qdrant-memory": _open_memory}


#: What the three Qdrant entries share: the collection's options, the client's, the extra.
_entry = partial(
    registry.Backend,
    options=_COLLECTION_OPTIONS,
    client_options=(QdrantClientOptions,),
    extra="qdrant",
)
registry.register(
    _entry(
        form="qdrant:URL/COLLECTION",
        parse=parse_server,
        open=_open_server,
        adopts=("qdrant_client", ""),
        adopt=_adopt_client,
        adopted="a QdrantClient (collection=NAME)",
    )
)
registry.register(_entry("qdrant-local:DIR/COLLECTION", _open_local, parse_local, folder=True))
registry.register(
    _entry(
        "qdrant-memory:COLLECTION",
        _open_memory,
        parse_memory,
        persists=lambda loc: False,
    )
)
