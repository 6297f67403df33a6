"""Milvus through pymilvus: Milvus Lite (embedded, a ``.db`` file) or a Milvus server/cluster.

Specs ``milvus:PATH.db/COLLECTION`` (Milvus Lite, from the ``milvus-lite`` package) and
``milvus:http://HOST:19530/COLLECTION`` (standalone or distributed); one code path serves both,
only the ``MilvusClient`` URI differs.

Rules kept here, as in the other stores:

- collections are created with metric ``IP`` (index ``FLAT`` by default, ``HNSW`` or
  ``IVF_FLAT`` on request); an existing collection indexed with ``COSINE`` or ``L2`` is refused
  (Milvus normalizes under COSINE, erasing the magnitude the model keeps);
- the schema is ``doc_id`` (VARCHAR primary key), ``vector`` (FLOAT_VECTOR), ``payload`` (JSON)
  and ``doc_norm`` (FLOAT, the stored vector's norm);
- which model built the collection is kept in the collection's properties.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError, WriterLockHeld
from magretrieve.core.extras import require
from magretrieve.core.options import option
from magretrieve.core.redact import redact
from magretrieve.stores import _ann_recall, registry
from magretrieve.stores._writer_lock import open_engine
from magretrieve.stores.base import (
    Batch,
    CollectionStore,
    StoreHit,
    StoreRecord,
    metric_refusal,
    missing_store,
    one_line,
)
from magretrieve.stores.options import (
    HnswOptions,
    IndexOptions,
    IndexTypeOptions,
    IvfOptions,
    StoreOptions,
)

#: Collection property under which the building model is recorded (a JSON string).
META_KEY = "magretrieve.metadata"
#: Collection property recording the index's build options (a JSON string): Milvus Lite's
#: describe_index reports the index type but not M, efConstruction or nlist.
INDEX_KEY = "magretrieve.index"
#: Build options: this store's option name -> the Milvus index parameter.
BUILD_PARAMS = {"hnsw_m": "M", "ef_construction": "efConstruction", "nlist": "nlist"}
#: Longest document id (the VARCHAR primary key's max_length).
MAX_ID_LENGTH = 1024
#: Index types this store builds (Milvus names).
INDEX_TYPES = ("FLAT", "HNSW", "IVF_FLAT")
#: A HNSW or IVF_FLAT collection holding fewer points than this is searched with a breadth
#: covering it (ef at least the count, every list probed), so the index answers exactly:
#: below it such a search takes no longer than the default one (docs/stores.md, "Exact
#: below a size").
EXACT_BELOW = 5_000
#: Milvus' largest top-k.
MAX_K = 16384
FIELDS = ("doc_id", "vector", "payload", "doc_norm")
#: Milvus collection names: a letter or underscore, then letters, digits and underscores, at
#: most 255 characters; other names are refused before Milvus sees them.
COLLECTION_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
#: Ids per filter expression (delete/get/existing) so one expression stays small.
IDS_PER_EXPRESSION = 512
#: Ids per page when listing every stored id.
SCAN_PAGE = 1024


#: Loggers of pymilvus and of the gRPC server inside Milvus Lite.
DRIVER_LOGGERS = ("pymilvus", "grpc._server", "milvus_lite")


def pymilvus() -> Any:
    mv = require("pymilvus")
    # pymilvus logs every failed call at ERROR with its own traceback, and Milvus Lite's
    # embedded gRPC server (a child process that inherits this logging setup) logs the calls
    # it does not implement: driver noise, kept out of the user's terminal. magretrieve
    # reports real failures itself, in one line.
    for name in DRIVER_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    return mv


def milvus_string(value: str) -> str:
    """``value`` as a Milvus expression string literal: double-quoted, ``"`` ``\\`` and line
    breaks escaped, so no id can end the literal and add to the expression."""
    escaped = (
        value.replace("\\", "\\\\")
        .replace('"', '\\"')
        .replace("\n", "\\n")
        .replace("\r", "\\r")
        .replace("\t", "\\t")
    )
    return f'"{escaped}"'


def ids_filter(ids: Iterable[str]) -> str:
    """``doc_id in [...]`` with every id escaped (pymilvus' own ``ids=`` pastes them raw)."""
    return "doc_id in [" + ", ".join(milvus_string(i) for i in ids) + "]"


def check_collection_name(name: str, where: str) -> str:
    """Refuse a collection name Milvus would reject or change, naming the rule."""
    if not isinstance(name, str) or not COLLECTION_NAME.fullmatch(name):
        raise StoreError(
            f"{where}: collection name {name!r:.80} is not a Milvus name (a letter or '_', then "
            "letters, digits and '_', at most 255 characters)"
        )
    return name


class MilvusStore(CollectionStore):
    """A Milvus collection searched by inner product (metric ``IP``).

    ``MilvusStore(client, collection, dimension, options=…)``: ``options`` (or its keywords
    ``index_type``, ``hnsw_m``, ``ef_construction``, ``ef_search``, ``nlist``, ``nprobe``) is
    the index built and how it is searched.
    """

    kind = "milvus"
    #: Points below which an HNSW/IVF_FLAT collection is searched exhaustively
    #: (:data:`EXACT_BELOW`).
    exact_below = EXACT_BELOW
    noun = "milvus collection"
    label = "Milvus collection"
    thread_safe_search = False
    persists_beside_search = False  # flush shares the client searches use: keep them apart
    max_id_bytes = MAX_ID_LENGTH
    max_k = MAX_K
    #: The vector index as Milvus describes it, with the recorded build parameters.
    _index: dict[str, Any]
    _lite_path: str | None = None  # set by open_milvus for a Milvus Lite file

    def _index_keywords(self) -> tuple[str, ...]:
        return MILVUS_OPTIONS

    def _configure(self, opts: IndexOptions) -> dict[str, Any]:
        check_collection_name(self.collection, self._location)
        self.ef_search, self.nprobe = opts.hnsw.ef_search, opts.ivf.nprobe
        index = (opts.index_type or "FLAT").upper()
        if index not in INDEX_TYPES:
            raise StoreError(
                f"{self._location}: index_type {opts.index_type!r} is not one of "
                f"{', '.join(INDEX_TYPES)}"
            )
        self._asked = opts.build()
        self._new_index = index
        return self._asked

    @contextmanager
    def _opening(self) -> Iterator[None]:
        try:
            yield
            self.client.load_collection(self.collection)
        except pymilvus().MilvusException as exc:
            raise StoreError(f"{self._location}: Milvus request failed ({one_line(exc)})") from None

    def _exists(self) -> bool:
        return bool(self.client.has_collection(self.collection))

    def _open_existing(self, dimension: int | None) -> int:
        desc = self.client.describe_collection(self.collection)
        fields = {f["name"]: f for f in desc["fields"]}
        missing = [f for f in FIELDS if f not in fields]
        if missing:
            raise StoreError(
                f"{self._location}: collection lacks field(s) {missing}; it was not created by "
                "magretrieve"
            )
        metric = self._metric()
        if metric != "IP":
            raise metric_refusal(
                self._location, f"metric {metric}", "IP", ". Create a new collection"
            )
        return int(fields["vector"]["params"]["dim"])

    def _recorded_build(self) -> dict[str, Any]:
        """The index type from the index itself, its parameters from the collection property
        written at creation. A collection created without that property (by another program,
        or before magretrieve recorded it) has unknown parameters, and any are accepted."""
        props = self.client.describe_collection(self.collection).get("properties") or {}
        try:
            built = json.loads(props.get(INDEX_KEY) or "{}")
        except ValueError:
            built = {}
        built = built if isinstance(built, dict) else {}
        self._index = {**built, **self._index}
        recorded = {"index_type": self._index.get("index_type")}
        recorded.update({k: built.get(p) for k, p in BUILD_PARAMS.items()})
        return recorded

    def _metric(self) -> str:
        for name in self.client.list_indexes(self.collection):
            info = self.client.describe_index(self.collection, name)
            if info.get("field_name") == "vector":
                self._index = info
                return str(info.get("metric_type", "")).upper()
        self._index = {}
        return "IP"  # no index yet: ours is created with IP

    def _create(self, dim: int) -> None:
        index = self._new_index
        hnsw_m, ef_construction = self._asked["hnsw_m"], self._asked["ef_construction"]
        nlist = self._asked["nlist"]
        mv = pymilvus()
        schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("doc_id", mv.DataType.VARCHAR, is_primary=True, max_length=MAX_ID_LENGTH)
        schema.add_field("vector", mv.DataType.FLOAT_VECTOR, dim=dim)
        schema.add_field("payload", mv.DataType.JSON)
        schema.add_field("doc_norm", mv.DataType.FLOAT)
        params: dict[str, int] = {}
        if index == "HNSW":
            params = {"M": hnsw_m or 16, "efConstruction": ef_construction or 200}
        elif index == "IVF_FLAT":
            params = {"nlist": nlist or 128}
        index_params = self.client.prepare_index_params()
        index_params.add_index("vector", index_type=index, metric_type="IP", params=params)
        self.client.create_collection(
            self.collection,
            schema=schema,
            index_params=index_params,
            consistency_level="Strong",
        )
        self.client.alter_collection_properties(
            self.collection, properties={INDEX_KEY: json.dumps({"index_type": index, **params})}
        )
        self._index = {"index_type": index, "metric_type": "IP", **params}

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return (pymilvus().MilvusException,)

    # ------------------------------------------------------------------ primitives

    def _upsert(self, batch: Batch) -> None:
        rows = [
            {"doc_id": i, "vector": v.tolist(), "payload": p, "doc_norm": n}
            for i, v, p, n in batch.rows()
        ]
        self.client.upsert(self.collection, rows)

    def _search_params(self, k: int) -> dict[str, Any]:
        """``ef`` / ``nprobe`` of the index; below :attr:`exact_below` points they cover the
        whole collection (ef at least the count, every IVF list probed), which makes Milvus's
        search over it exhaustive: it has no per-query exact switch."""
        params: dict[str, Any] = {}
        index = str(self._index.get("index_type", "FLAT")).upper()
        if index not in ("HNSW", "IVF_FLAT"):
            return {"metric_type": "IP", "params": params}
        n = self._count()
        if index == "HNSW":
            params["ef"] = max(int(self.ef_search or 64), k)
            if n < self.exact_below:
                params["ef"] = max(params["ef"], n)
        elif n < self.exact_below:
            params["nprobe"] = int(self._index.get("nlist") or 128)
        elif self.nprobe:
            params["nprobe"] = int(self.nprobe)
        return {"metric_type": "IP", "params": params}

    def _query(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        fields = ["doc_id", "payload", "doc_norm"] + (["vector"] if with_vectors else [])
        res = self.client.search(
            self.collection,
            data=[row.tolist() for row in q],
            limit=k,
            output_fields=fields,
            search_params=self._search_params(k),
        )
        out = []
        for hits in res:
            row = []
            for h in hits:
                ent = h.get("entity") or {}
                vec = np.asarray(ent["vector"], dtype=np.float32) if with_vectors else None
                row.append(
                    StoreHit(
                        hit_id(h),
                        float(h["distance"]),
                        dict(ent.get("payload") or {}),
                        vec,
                        doc_norm=float(ent["doc_norm"]),
                    )
                )
            out.append(row)
        return out

    def _query_ids(self, ids: list[str], fields: list[str]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for n in range(0, len(ids), IDS_PER_EXPRESSION):
            chunk = ids[n : n + IDS_PER_EXPRESSION]
            rows.extend(
                self.client.query(self.collection, filter=ids_filter(chunk), output_fields=fields)
            )
        return rows

    def _delete(self, ids: list[str]) -> int:
        present = sorted(self._existing(ids))
        for n in range(0, len(present), IDS_PER_EXPRESSION):
            chunk = present[n : n + IDS_PER_EXPRESSION]
            self.client.delete(self.collection, filter=ids_filter(chunk))
        return len(present)

    def _count(self) -> int:
        res = self.client.query(self.collection, filter="", output_fields=["count(*)"])
        return int(res[0]["count(*)"])

    def _fetch(self, ids: list[str]) -> Iterable[StoreRecord]:
        return [
            StoreRecord(
                str(r["doc_id"]),
                np.asarray(r["vector"], dtype=np.float32),
                dict(r["payload"] or {}),
            )
            for r in self._query_ids(ids, ["doc_id", "vector", "payload"])
        ]

    def _existing(self, ids: list[str]) -> Iterable[str]:
        return [str(r["doc_id"]) for r in self._query_ids(ids, ["doc_id"])]

    def _scan_ids(self) -> Iterator[str]:
        # pages by primary key, ``doc_id > last`` with ``last`` escaped (pymilvus' own
        # query_iterator pastes the last key raw, so an id holding a quote or a line break
        # would break, or extend, its expression); the iterator flags its queries send make
        # Milvus return the smallest keys first
        last: str | None = None
        while True:
            expr = "" if last is None else f"doc_id > {milvus_string(last)}"
            page = self.client.query(
                self.collection,
                filter=expr,
                limit=SCAN_PAGE,
                output_fields=["doc_id"],
                iterator="True",
                reduce_stop_for_best="True",
            )
            ids = sorted(str(r["doc_id"]) for r in page)
            yield from ids
            if len(ids) < SCAN_PAGE:
                return
            last = ids[-1]

    def _read_meta(self) -> dict[str, Any] | None:
        props = self.client.describe_collection(self.collection)
        raw = (props.get("properties") or {}).get(META_KEY)
        return self._recorded_object(raw, f"property {META_KEY}")

    def _write_meta(self, meta: dict[str, Any]) -> None:
        text = json.dumps(meta, sort_keys=True)
        self.client.alter_collection_properties(self.collection, properties={META_KEY: text})

    def persist(self) -> None:
        """Seal what was written (``flush``) so it survives a restart."""
        self._run("flush", lambda: self.client.flush(self.collection))

    def _describe(self) -> dict[str, Any]:
        out = {"metric": "IP", **{k: v for k, v in self._index.items() if k != "metric_type"}}
        out.pop("field_name", None)
        out.pop("index_name", None)
        for key in ("total_rows", "indexed_rows", "pending_index_rows", "state"):
            out.pop(key, None)
        if str(out.get("index_type", "")).upper() == "HNSW":
            out["ef_search"] = self.ef_search or 64
        if str(out.get("index_type", "")).upper() in ("HNSW", "IVF_FLAT"):
            out.update(_ann_recall.search_mode(self._count(), self.exact_below))
        return out

    def close(self) -> None:
        """Close an owned client, then let a Milvus Lite file's embedded server stop."""
        owned = self._owns
        super().close()
        if owned and self._lite_path is not None:
            release_lite(self._lite_path)


def hit_id(hit: Mapping[str, Any]) -> str:
    """A search hit's document id: Milvus Lite names the primary key ``doc_id``, a Milvus
    server returns it as ``id`` (and in the entity when asked for)."""
    for source in (hit, hit.get("entity") or {}):
        for key in ("doc_id", "id"):
            if source.get(key) is not None:
                return str(source[key])
    raise StoreError(f"a Milvus search hit without a primary key ({sorted(hit)})")


def open_milvus(
    location: Mapping[str, str],
    dimension: int | None = None,
    token: str | None = None,
    **options: Any,
) -> MilvusStore:
    """Open (or create) the collection of a parsed ``milvus:`` spec."""
    mv = pymilvus()
    if "url" in location:
        uri = location["url"]
        where = f"milvus:{redact(uri)}/{location['collection']}"
    else:
        path = Path(location["path"])
        where = f"milvus:{path}/{location['collection']}"
        if path.exists() and not path.is_dir():  # Milvus Lite keeps a folder at this path
            raise StoreError(
                f"{where}: {path} is a file, not a Milvus Lite store (Milvus Lite keeps its "
                "data in a folder at this path); is it another program's file? Give another path"
            )
        if dimension is None and not path.is_dir():
            raise missing_store(where, "Milvus Lite store")  # opening would create one
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a parent that is a file, or no permission
            raise StoreError(
                f"{where}: cannot make the folder {path.parent} ({exc.strerror})"
            ) from None
        uri = str(path)
    lite = None if "url" in location else os.path.abspath(uri)
    try:  # connection refused, or a Lite folder another process holds (named)
        token = MilvusOptions.named("token").from_env(token)
        # a token authenticates against a server; Milvus Lite has no users
        if token and not lite:
            client = mv.MilvusClient(uri, token=token)
        elif lite:
            client = open_engine(
                lambda: mv.MilvusClient(uri), Path(lite) / "LOCK", where, "Milvus Lite"
            )
        else:
            client = mv.MilvusClient(uri)
    except WriterLockHeld:
        raise
    except Exception as exc:
        raise StoreError(
            f"{where}: cannot open Milvus ({type(exc).__name__}: {one_line(exc)})"
        ) from None
    if lite is not None:
        _LITE_USERS[lite] = _LITE_USERS.get(lite, 0) + 1
    try:
        store = MilvusStore(
            client, location["collection"], dimension, owns_client=True, location=where, **options
        )
    except BaseException:
        client.close()
        if lite is not None:
            release_lite(lite)
        raise
    store._lite_path = lite
    return store


#: Open stores per Milvus Lite file in this process: its embedded server runs until the last
#: one closes (then another process can open the file).
_LITE_USERS: dict[str, int] = {}


def release_lite(path: str) -> None:
    """One user of a Milvus Lite file is done; stop its embedded server after the last one."""
    left = _LITE_USERS.get(path, 0) - 1
    if left > 0:
        _LITE_USERS[path] = left
        return
    _LITE_USERS.pop(path, None)
    try:
        from milvus_lite.server_manager import server_manager_instance
    except ImportError:  # pragma: no cover - a server URL needs no milvus-lite
        return
    server_manager_instance.release_server(path)


# ----------------------------------------------------------------------------- registry entry

FORM = "milvus:PATH.db/COLLECTION"


def parse_milvus(rest: str, spec: str = "") -> dict[str, str]:
    """``PATH.db/COLLECTION`` -> {"path", "collection"}; ``URL/COLLECTION`` -> {"url", ...}."""
    scheme, sep, after = rest.partition("://")
    if sep:
        host, _, collection = after.rstrip("/").rpartition("/")
        if host and collection:
            check_collection_name(collection, f"store spec {spec or 'milvus:' + rest!r}")
            return {"url": f"{scheme}://{host}", "collection": collection}
    else:
        base, _, collection = rest.rstrip("/").rpartition("/")
        if base.endswith(".db") and collection:
            check_collection_name(collection, f"store spec {spec or 'milvus:' + rest!r}")
            return {"path": base, "collection": collection}
    raise StoreError(
        f"store spec {spec or 'milvus:' + rest!r}: expected {FORM} (Milvus Lite) or "
        "milvus:http://HOST:19530/COLLECTION (a Milvus server), e.g. milvus:indexes/milvus.db/scifact"
    )


@dataclass(frozen=True)
class MilvusOptions(StoreOptions):
    """How the client authenticates against a Milvus server."""

    token: str | None = option(
        "Milvus server token, 'user:password' or an API key (default $MILVUS_TOKEN).",
        env="MILVUS_TOKEN",
    )


#: The index option classes a Milvus collection takes.
MILVUS_INDEX = (IndexTypeOptions, HnswOptions, IvfOptions)
MILVUS_OPTIONS = tuple(k for group in MILVUS_INDEX for k in group.keywords())


registry.register(
    registry.Backend(
        form=FORM,
        parse=parse_milvus,
        open=open_milvus,
        options=MILVUS_INDEX,
        client_options=(MilvusOptions,),
        index_types="FLAT (default), HNSW, IVF_FLAT",
        adopts=("pymilvus", "MilvusClient"),
        adopt=MilvusStore,
        adopted="a pymilvus MilvusClient (collection=NAME)",
        extra="milvus",
    )
)
