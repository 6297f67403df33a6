"""Chroma collections searched by inner product: embedded (``PersistentClient``) or a server.

Specs ``chroma:PATH/COLLECTION`` (embedded, persisted in the folder ``PATH``) and
``chroma:http://HOST:PORT/COLLECTION`` (a ``chroma run`` server). One code path serves both;
only the client differs.

Rules kept here, as in the other stores:

- collections are created with HNSW space ``ip``; Chroma reports the distance ``1 − q·d``,
  which the store turns back into the inner product. An existing collection in space ``l2``
  or ``cosine`` is refused (cosine ranks by angle alone, erasing the magnitude the model
  keeps; l2 ranks by distance);
- each record's metadata holds ``payload`` (the JSON payload as a string) and ``doc_norm``
  (the stored vector's norm); which model built the collection is recorded in the
  collection's own metadata;
- Chroma always searches its HNSW graph: ``hnsw_m``/``ef_construction`` (creation) and
  ``ef_search`` pass through, and after ``optimize()`` recall@10 is measured against exact
  search. Chroma applies a changed ``ef_search`` only when it loads the collection again, so
  tuning to ``target_recall`` reopens the embedded client for each value it tries; a server
  reloads on its own schedule, so there ``target_recall`` is refused (give ``ef_search``);
- Chroma's embedded engine is not safe for two writing processes, so an embedded folder takes
  the folder writer lock (:mod:`._writer_lock`) at its first write, as ``faiss:`` does, and
  reloads the folder then (another writer may have committed since it was opened); searching
  beside a writer needs no lock;
- a read-only open (no dimension) of a missing folder or collection creates nothing; reopening
  with ``hnsw_m``/``ef_construction`` other than the collection's is refused.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.extras import require
from magretrieve.core.redact import redact
from magretrieve.stores import _ann_recall, _generation, registry
from magretrieve.stores._writer_lock import WriterLock
from magretrieve.stores.base import (
    Batch,
    CollectionStore,
    StoreHit,
    StoreRecord,
    StoreVersion,
    closed_on_failure,
    missing_store,
)
from magretrieve.stores.options import HnswOptions, IndexOptions, RecallOptions

#: Collection metadata key under which the building model is recorded (a JSON string).
META_KEY = "magretrieve.metadata"
#: Collection metadata key under which the last recall measurement is kept (a JSON string).
RECALL_KEY = "magretrieve.recall"
#: Chroma collection names: 3-512 characters of [a-zA-Z0-9._-], alphanumeric at both ends.
COLLECTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{1,510}[A-Za-z0-9]")
#: Records per Chroma request (its batch limit is larger; this keeps requests small).
PAGE = 1000
#: Results (queries × k) per Chroma query request: it reads them back with one SQL statement,
#: and SQLite binds at most 32,766 variables.
QUERY_RESULTS = 10_000
#: A collection holding fewer records than this is searched exactly (its vectors read back
#: and scored by numpy), not through its HNSW graph: below it one exact query takes no longer
#: than one HNSW query (docs/stores.md, "Exact below a size").
EXACT_BELOW = 1_000
FORM = "chroma:PATH/COLLECTION"


def chromadb() -> Any:
    mod = require("chromadb")
    logging.getLogger("chromadb").setLevel(logging.ERROR)
    return mod


def _space(collection: Any) -> str:
    """The collection's distance space (configuration first, legacy ``hnsw:space`` metadata)."""
    config = getattr(collection, "configuration", None) or {}
    for key in ("hnsw", "spann"):
        section = config.get(key) if isinstance(config, Mapping) else None
        if isinstance(section, Mapping) and section.get("space"):
            return str(section["space"]).lower()
    meta = collection.metadata or {}
    return str(meta.get("hnsw:space", "l2")).lower()  # Chroma's default space is l2


class ChromaStore(_generation.MarkerGeneration, CollectionStore):
    """A Chroma collection in space ``ip``; scores are inner products (``1 − distance``).

    ``options`` (or its keywords ``hnsw_m``, ``ef_construction``, ``ef_search``,
    ``target_recall``): the HNSW graph Chroma builds, and how it is searched and tuned.
    """

    kind = "chroma"
    #: Records below which the collection is searched exactly (:data:`EXACT_BELOW`).
    exact_below = EXACT_BELOW
    noun = "chroma collection"
    label = "Chroma collection"
    thread_safe_search = True

    def __init__(
        self,
        *args: Any,
        reopen: Any = None,
        writer: WriterLock | None = None,
        version: StoreVersion | None = None,
        **kwargs: Any,
    ) -> None:
        """Over ``client`` and ``collection`` (see :class:`CollectionStore`); ``reopen`` makes
        a fresh embedded client, ``writer`` is the embedded folder's writer lock, and
        ``version`` its marker as read before the client loaded it (all None for a server,
        which serializes writes and applies a new ef_search itself)."""
        self._writer = writer
        self._version = version
        self._reopen = reopen
        #: (folder generation, ids, vectors) the exact search last read (embedded only)
        self._scanned: tuple[StoreVersion, list[str], np.ndarray] | None = None
        super().__init__(*args, **kwargs)

    def _index_keywords(self) -> tuple[str, ...]:
        return CHROMA_OPTIONS

    def _configure(self, opts: IndexOptions) -> dict[str, Any]:
        if opts.target_recall is not None and self._reopen is None:
            raise StoreError(
                f"{self._location}: --target-recall needs the embedded Chroma (a server applies a "
                "new ef_search only when it reloads the collection); give --ef-search instead"
            )
        if not COLLECTION_NAME.fullmatch(self.collection):
            raise StoreError(
                f"{self._location}: Chroma collection names are 3-512 characters of "
                "letters, digits, '.', '_' and '-', starting and ending with a letter or digit"
            )
        self._asked = {"hnsw_m": opts.hnsw.m, "ef_construction": opts.hnsw.ef_construction}
        self._new_ef = opts.hnsw.ef_search
        return self._asked

    def _opened(self, opts: IndexOptions) -> None:
        if self._new_ef is not None and not self.created_here:
            self._set_ef(self._new_ef)

    def _exists(self) -> bool:
        return self.collection in self._run("list collections", lambda: self._names())

    def _create(self, dimension: int) -> None:
        hnsw: dict[str, Any] = {"space": "ip"}
        for key, value in (
            ("max_neighbors", self._asked["hnsw_m"]),
            ("ef_construction", self._asked["ef_construction"]),
            ("ef_search", self._new_ef),
        ):
            if value is not None:
                hnsw[key] = int(value)
        self.col = self._run(
            "create",
            lambda: self.client.create_collection(
                self.collection,
                configuration={"hnsw": hnsw},
                metadata={"magretrieve.dimension": dimension},
                embedding_function=None,
            ),
        )

    def _recorded_build(self) -> dict[str, Any]:
        built = (self.col.configuration or {}).get("hnsw") or {}
        return {
            "hnsw_m": built.get("max_neighbors"),
            "ef_construction": built.get("ef_construction"),
        }

    def _names(self) -> set[str]:
        cols = self.client.list_collections()
        return {c if isinstance(c, str) else c.name for c in cols}

    def _open_existing(self, dimension: int | None) -> int:
        self.col = self._run("open", lambda: self.client.get_collection(self.collection))
        space = _space(self.col)
        if space != "ip":
            raise StoreError(
                f"{self._location} uses distance space {space!r}; magretrieve needs 'ip' (cosine "
                "ranks by angle and erases document magnitude; l2 ranks by distance). Create a "
                "new collection"
            )
        meta = self.col.metadata or {}
        dim = meta.get("magretrieve.dimension")
        if dim is None:  # a collection created elsewhere: its first stored vector tells
            first = self._run("read", lambda: self.col.get(limit=1, include=["embeddings"]))
            emb = first.get("embeddings")
            dim = len(emb[0]) if emb is not None and len(emb) else dimension
        if dim is None:
            raise StoreError(f"{self._location}: empty collection of unknown dimension")
        return int(dim)

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        # chromadb's own errors, and what its HTTP client raises for an unreachable server
        return (chromadb().errors.ChromaError, ValueError, RuntimeError, OSError)

    # ------------------------------------------------------------------ properties

    @property
    def ef_search(self) -> int | None:
        hnsw = (self.col.configuration or {}).get("hnsw") or {}
        return hnsw.get("ef_search")

    def _begin_write(self) -> None:
        """Before the first write of this object: take the folder's writer lock, then load the
        folder again (its engine keeps what it read at open; another writer may have
        committed since)."""
        if self._writer is None or self._writer.held:
            return
        self._writer.acquire()
        self._version = _generation.read_version(self._writer.folder)
        if self._reopen is not None:
            self.client.close()
            self.client = self._reopen()
            if hasattr(self, "col"):
                self.col = self._run("open", lambda: self.client.get_collection(self.collection))

    @property
    def reloads_in_place(self) -> bool:  # type: ignore[override]
        # every PersistentClient of a folder in one process shares one engine, which keeps
        # the HNSW segment it loaded: only dropping the last client reads the disk again
        return self._reopen is not None

    def reload(self) -> None:
        """Drop the embedded client and open the folder again (another process wrote)."""
        version = self.disk_version()
        self.client.close()
        self.client = self._reopen()
        self.col = self._run("open", lambda: self.client.get_collection(self.collection))
        self._version = version
        self._scanned = None  # the vectors kept for exact search were the old state's

    def _set_ef(self, value: int) -> None:
        if self.ef_search == int(value):
            return
        self._begin_write()  # Chroma keeps ef_search in the collection's configuration
        self._run(
            "set ef_search",
            lambda: self.col.modify(configuration={"hnsw": {"ef_search": int(value)}}),
        )
        self._committed()
        if self._reopen is not None:  # the loaded index keeps its ef until it is loaded again
            self.client.close()
            self.client = self._reopen()
            self.col = self._run("open", lambda: self.client.get_collection(self.collection))

    # ------------------------------------------------------------------ primitives

    def _upsert(self, batch: Batch) -> None:
        self._begin_write()
        metas = [
            {"payload": json.dumps(payload, allow_nan=False), "doc_norm": norm}
            for _, _, payload, norm in batch.rows()
        ]
        for start in range(0, len(batch.ids), PAGE):
            end = start + PAGE
            self.col.upsert(
                ids=batch.ids[start:end],
                embeddings=batch.vectors[start:end],
                metadatas=metas[start:end],
            )
        self._committed()

    def _query(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        n = self._count()
        if n == 0 or len(q) == 0:
            return [[] for _ in range(len(q))]
        k = min(k, n)
        if n < self.exact_below:
            return self._exact_hits(q, k, with_vectors)
        step = max(1, QUERY_RESULTS // k)  # Chroma binds every result id in one SQL statement
        if len(q) > step:
            return [
                row
                for start in range(0, len(q), step)
                for row in self._query(q[start : start + step], k, with_vectors)
            ]
        include = ["metadatas", "distances"] + (["embeddings"] if with_vectors else [])
        res = self.col.query(query_embeddings=q, n_results=k, include=include)
        out = []
        for row in range(len(q)):
            hits = []
            embs = res["embeddings"][row] if with_vectors else None
            for j, doc_id in enumerate(res["ids"][row]):
                meta = res["metadatas"][row][j] or {}
                vec = np.asarray(embs[j], dtype=np.float32) if embs is not None else None
                hits.append(
                    StoreHit(
                        str(doc_id),
                        1.0 - float(res["distances"][row][j]),  # Chroma's ip distance: 1 − q·d
                        json.loads(meta.get("payload") or "{}"),
                        vec,
                        doc_norm=float(meta["doc_norm"]) if "doc_norm" in meta else None,
                    )
                )
            out.append(hits)
        return out

    def _query_exact(
        self, q: np.ndarray, k: int, with_vectors: bool
    ) -> list[list[StoreHit]] | None:
        """The rows Chroma's HNSW search in space ``ip`` answered short of ``k`` hits (it
        can, at any ef_search), answered by :meth:`_exact_hits`."""
        return self._exact_hits(q, k, with_vectors)

    def _exact_hits(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        """Top-``k`` by an exact scan of the stored vectors: every search of a collection
        below :attr:`exact_below`, and the rows its graph answered short."""
        ids, vectors = self._scan()
        if not ids:
            return [[] for _ in range(len(q))]
        scores = q.astype(np.float32) @ vectors.T
        k_row = min(k, len(ids))
        tops = []
        for row in scores:
            top = np.argpartition(-row, k_row - 1)[:k_row]
            tops.append(top[np.lexsort((top, -row[top]))])
        chosen = sorted({ids[int(i)] for top in tops for i in top})
        got = self._get(chosen, ["metadatas"])
        metas = {str(i): m or {} for i, m in zip(got["ids"], got["metadatas"], strict=True)}
        return [
            [
                StoreHit(
                    ids[int(i)],
                    float(row[int(i)]),
                    json.loads(metas.get(ids[int(i)], {}).get("payload") or "{}"),
                    vectors[int(i)].copy() if with_vectors else None,
                    doc_norm=float(np.linalg.norm(vectors[int(i)].astype(np.float64))),
                )
                for i in top
            ]
            for row, top in zip(scores, tops, strict=True)
        ]

    def _scan(self) -> tuple[list[str], np.ndarray]:
        """Every stored (id, vector) for the exact search. An embedded folder's are kept
        until its marker moves (every write bumps the generation, in any process; a rebuilt
        folder has another id), so a small
        collection is read from Chroma once per write, not once per search; a server's are
        read each time (other clients write without a marker)."""
        if self._writer is None:
            return self._stored_vectors()
        version = self.disk_version()  # id and generation: a rebuilt folder is another store
        kept = self._scanned
        if kept is not None and version is not None and kept[0] == version:
            return kept[1], kept[2]
        ids, vectors = self._stored_vectors()
        if version is not None:
            self._scanned = (version, ids, vectors)
        return ids, vectors

    def _delete(self, ids: list[str]) -> int:
        self._begin_write()
        present = sorted(self._existing(ids))
        for start in range(0, len(present), PAGE):
            self.col.delete(ids=present[start : start + PAGE])
        if present:
            self._committed()
        return len(present)

    def _count(self) -> int:
        return int(self.col.count())

    def _get(self, ids: list[str], include: list[str]) -> dict[str, Any]:
        out: dict[str, list[Any]] = {"ids": [], "embeddings": [], "metadatas": []}
        for start in range(0, len(ids), PAGE):
            got = self.col.get(ids=ids[start : start + PAGE], include=include)
            out["ids"].extend(got["ids"])
            for key in ("embeddings", "metadatas"):
                if key in include:
                    out[key].extend(list(got[key]))
        return out

    def _fetch(self, ids: list[str]) -> Iterable[StoreRecord]:
        got = self._get(ids, ["embeddings", "metadatas"])
        return [
            StoreRecord(
                str(doc_id),
                np.asarray(vec, dtype=np.float32),
                json.loads((meta or {}).get("payload") or "{}"),
            )
            for doc_id, vec, meta in zip(
                got["ids"], got["embeddings"], got["metadatas"], strict=True
            )
        ]

    def _existing(self, ids: list[str]) -> Iterable[str]:
        return [str(i) for i in self._get(ids, [])["ids"]]

    def _scan_ids(self) -> Iterator[str]:
        offset = 0
        while True:
            page = self.col.get(limit=PAGE, offset=offset, include=[])
            if not page["ids"]:
                return
            yield from (str(i) for i in page["ids"])
            offset += len(page["ids"])

    def _stored_vectors(self) -> tuple[list[str], np.ndarray]:
        ids: list[str] = []
        vecs: list[np.ndarray] = []
        offset = 0
        while True:
            page = self._run(
                "read",
                lambda o=offset: self.col.get(limit=PAGE, offset=o, include=["embeddings"]),
            )
            if not page["ids"]:
                break
            ids.extend(str(i) for i in page["ids"])
            vecs.append(np.asarray(page["embeddings"], dtype=np.float32))
            offset += len(page["ids"])
        arr = np.concatenate(vecs) if vecs else np.zeros((0, self._dim), dtype=np.float32)
        return ids, arr

    def _meta_value(self, key: str) -> dict[str, Any] | None:
        self.col = self._run("read", lambda: self.client.get_collection(self.collection))
        raw = (self.col.metadata or {}).get(key)
        return self._recorded_object(raw, f"collection metadata {key}")

    def _write_meta_value(self, key: str, value: Mapping[str, Any] | None) -> None:
        """Set one key of the collection's metadata, keeping the others (Chroma's ``modify``
        replaces the whole mapping). Legacy ``hnsw:*`` keys are left out: Chroma refuses a
        ``modify`` that carries ``hnsw:space``, and it keeps those settings in the collection's
        configuration, which stays as it is."""
        self._begin_write()
        current = {
            k: v
            for k, v in (
                self._run("read", lambda: self.client.get_collection(self.collection)).metadata
                or {}
            ).items()
            if not k.startswith("hnsw:")
        }
        current[key] = json.dumps(dict(value or {}), sort_keys=True)
        self._run("write metadata", lambda: self.col.modify(metadata=current))
        self._committed()

    def _read_meta(self) -> dict[str, Any] | None:
        return self._meta_value(META_KEY)

    def _write_meta(self, meta: dict[str, Any]) -> None:
        self._write_meta_value(META_KEY, meta)

    def foreign_points(self) -> int:
        meta = self.col.metadata or {}
        if "magretrieve.dimension" in meta or self.read_metadata() is not None:
            return 0
        return self.count()

    @property
    def recall(self) -> dict[str, Any] | None:
        """The last recall@10 measurement, kept in the collection's metadata."""
        return self._meta_value(RECALL_KEY)

    def optimize(self) -> None:
        """Measure the HNSW graph's recall (tuning ``ef_search`` to ``target_recall``)."""
        self.measure_recall(target_recall=self.target_recall)

    def _recall_knob(self) -> Any:
        if self._count() < self.exact_below:
            return None  # searched exactly: nothing approximate to measure
        return _ann_recall.Knob(
            "ef_search", _ann_recall.HNSW_EF, self._set_ef, int(self.ef_search or 100)
        )

    def _tune(self, run: Any, knob: Any, target: float | None) -> dict[str, Any]:
        """Without a target, a graph below the warning line at the settings given gets its
        ef_search raised until it is not."""
        before = knob.current
        recall = run(knob, target, warn=target is not None)
        value = recall[f"recall_at_{recall['k']}"]
        if target is None and value < _ann_recall.WARN_BELOW:
            recall = run(knob, _ann_recall.WARN_BELOW)
            recall["raised_from"] = {"ef_search": before, f"recall_at_{recall['k']}": value}
        return dict(recall)

    def _keep_recall(self, recall: dict[str, Any], knob: Any) -> None:
        self._set_ef(knob.current)
        self._write_meta_value(RECALL_KEY, recall)

    def _describe(self) -> dict[str, Any]:
        hnsw = dict((self.col.configuration or {}).get("hnsw") or {})
        out: dict[str, Any] = {
            "space": "ip",
            "index": "hnsw",
            "hnsw_m": hnsw.get("max_neighbors"),
            "ef_construction": hnsw.get("ef_construction"),
            "ef_search": hnsw.get("ef_search"),
            **_ann_recall.search_mode(self._count(), self.exact_below),
        }
        recall = self.recall
        if recall:
            out["recall"] = recall
        return out

    def close(self) -> None:
        """Release the client (an embedded folder's engine stops with its last client)."""
        if self.client is not None:
            self.client.close()
            self.client = None
        super().close()


# ----------------------------------------------------------------------------- registry entry


def parse_chroma(rest: str, spec: str = "") -> dict[str, str]:
    """``PATH/COLLECTION`` -> {"path", "collection"}; ``URL/COLLECTION`` -> {"url", ...}."""
    if "://" in rest:
        return registry.parse_url_collection(rest, spec or f"chroma:{rest}")
    return registry.parse_path_collection(rest, spec or f"chroma:{rest}")


def open_chroma(
    location: Mapping[str, str], dimension: int | None = None, **options: Any
) -> ChromaStore:
    """Open (or create) the collection of a parsed ``chroma:`` spec."""
    mod = chromadb()
    settings = mod.Settings(anonymized_telemetry=False)
    if "url" in location:
        url = location["url"]
        where = f"chroma:{url}/{location['collection']}"
        scheme, _, hostport = url.partition("://")
        host, _, port = hostport.rpartition(":")
        if "@" in host:  # Chroma's client takes credentials as settings, not in the URL
            raise StoreError(
                f"{redact(where)}: user and password in the URL are not sent to a Chroma "
                "server; give chroma:http://HOST:PORT/COLLECTION (a server behind auth is not "
                "supported by this store)"
            )
        if not host or not port.isdigit():
            raise StoreError(f"{where}: expected chroma:http://HOST:PORT/COLLECTION")
        try:
            client = mod.HttpClient(
                host=host, port=int(port), ssl=scheme == "https", settings=settings
            )
        except Exception as exc:  # connection refused, wrong server
            raise StoreError(f"{where}: cannot reach the Chroma server ({exc})") from None
    else:
        path = Path(location["path"])
        where = f"chroma:{path}/{location['collection']}"
        if dimension is None and not (path / "chroma.sqlite3").is_file():
            raise missing_store(where, "Chroma folder")  # PersistentClient would create one
        version = _generation.read_version(path)  # before the client loads what it counts

        def reopen() -> Any:
            try:
                return mod.PersistentClient(path=str(path), settings=settings)
            except Exception as exc:
                raise StoreError(f"{where}: cannot open the Chroma folder ({exc})") from None

        writer = WriterLock(path, where)
        if not (path / "chroma.sqlite3").is_file():
            # the first client of a folder creates Chroma's tables, which two processes at
            # once cannot: creating is writing, so it takes the writer lock first
            writer.acquire()
        try:
            with closed_on_failure(reopen()) as client:
                return ChromaStore(
                    client,
                    location["collection"],
                    dimension,
                    location=where,
                    reopen=reopen,
                    writer=writer,
                    version=version,
                    **options,
                )
        except BaseException:
            writer.release()  # a store that failed to open holds nothing
            raise
    with closed_on_failure(client):
        return ChromaStore(client, location["collection"], dimension, location=where, **options)


#: The index option classes a Chroma collection takes: its HNSW graph and a recall target.
CHROMA_INDEX = (HnswOptions, RecallOptions)
CHROMA_OPTIONS = (*HnswOptions.keywords(), *RecallOptions.keywords())


registry.register(
    registry.Backend(
        form=FORM,
        parse=parse_chroma,
        open=open_chroma,
        options=CHROMA_INDEX,
        extra="chroma",
    )
)
