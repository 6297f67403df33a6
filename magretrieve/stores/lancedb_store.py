"""LanceDB tables searched by dot product: ``lancedb:PATH/TABLE`` (embedded, a folder).

Rules kept here, as in the other stores:

- every search uses distance ``dot``; LanceDB reports ``1 − q·d``, which the store turns back
  into the inner product;
- exact scan by default (no vector index); ``index_type`` builds a LanceDB vector index in
  ``optimize()`` (after the bulk load), whose recall@10 is then measured against exact search
  (``refine_factor``, ``nprobe`` and ``ef_search`` tuned to ``target_recall`` when one is
  given, see :meth:`LanceDBStore._tune`). The quantized kinds (``*_SQ``, ``*_PQ``) always
  re-rank their candidates by the full vectors (``refine_factor`` at least 1): without it the
  reported scores are the quantized ones, not the inner product, and no ``ef_search`` lifts
  recall past what the quantization loses (on 384-d magnitude-keeping vectors IVF_HNSW_SQ stops
  near 0.994 at any ``ef_search``, and at 0.9995 with a factor of 2); a batch of queries is one
  LanceDB query (its ``query_index`` column). An index whose
  measured recall is below :data:`~magretrieve.stores._ann_recall.WARN_BELOW` — IVF_PQ on
  magnitude-keeping vectors, typically — is dropped and refused with the number, unless
  ``force`` (``magretrieve index --force``) keeps it;
- the table is ``doc_id`` (string), ``vector`` (fixed-size float32 list), ``payload`` (the JSON
  payload as a string) and ``doc_norm`` (float32, the stored vector's norm); which model built
  it, the index settings and the last recall measurement are kept in the ``vector`` field's
  metadata, so they travel with the table's versions;
- each add is one ``merge_insert`` on ``doc_id`` (an atomic new table version): a crash leaves
  the previous version or the new one;
- two processes merging into one table can both insert the same new id (each commit is atomic,
  the pair is not), so the folder takes the writer lock of :mod:`._writer_lock` at its first
  write, as ``faiss:`` does, and reads the newest table version then; searching beside a writer
  needs no lock;
- a read-only open (no dimension) of a missing table creates nothing; reopening with index
  options other than the recorded ones is refused;
- LanceDB's Rust log (``LANCEDB_LOG``) stays at ``error`` unless debug logging is on
  (``magretrieve -v``) or the variable is set.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.extras import require
from magretrieve.core.options import option
from magretrieve.stores import _ann_recall, _generation, registry
from magretrieve.stores._writer_lock import WriterLock
from magretrieve.stores.base import (
    Batch,
    CollectionStore,
    StoreHit,
    StoreRecord,
    missing_store,
)
from magretrieve.stores.options import IndexOptions, StoreOptions

FORM = "lancedb:PATH/TABLE"
#: Keys of the ``vector`` field's metadata.
META_KEY, RECALL_KEY, INDEX_KEY = "magretrieve.metadata", "magretrieve.recall", "magretrieve.index"
#: Index types this store builds (LanceDB names); ``flat`` is the exact scan (no index).
INDEX_TYPES = (
    "FLAT",
    "IVF_HNSW_SQ",
    "IVF_HNSW_FLAT",
    "IVF_FLAT",
    "IVF_SQ",
    "IVF_PQ",
    "IVF_HNSW_PQ",
)
FIELDS = ("doc_id", "vector", "payload", "doc_norm")
#: Ids per filter expression (get/existing/delete).
IDS_PER_EXPRESSION = 512


def lancedb() -> Any:
    if not logging.getLogger().isEnabledFor(logging.DEBUG):  # read when the module loads
        os.environ.setdefault("LANCEDB_LOG", "error")
    mod = require("lancedb")
    logging.getLogger("lancedb").setLevel(logging.ERROR)
    return mod


#: ef_search while refine_factor and nprobe of an IVF_HNSW index are tuned (then ef_search is
#: tuned at those).
PROBE_EF = 256
#: refine_factor values tried for the quantized kinds when tuning to a target: the index's
#: best ``k × factor`` candidates are re-ranked by the full vectors. Untuned searches use 1
#: (re-ranking only the ``k`` returned makes their scores exact inner products, nothing more);
#: tuning starts at 2, because 1 can pass on the synthetic sample and still lose real queries
#: (perturbed real passages, 100,000 vectors: factor 1 measured 0.9945 on the sample and
#: delivered 0.981 on real scifact queries; tuned on those queries the store chose 2).
REFINE = (2, 4, 8, 16, 32)
#: Queries per LanceDB query (one vector search over a batch; memory is k rows per query).
QUERIES_PER_CALL = 256
#: A table holding fewer rows than this is searched by LanceDB's exact scan
#: (``bypass_vector_index``; its index is still built, for when it grows): below it one exact
#: query takes no longer than one index query (docs/stores.md, "Exact below a size").
EXACT_BELOW = 5_000


def quantized(kind: str) -> bool:
    """Whether ``kind`` (a LanceDB index type) searches compressed vectors (SQ, PQ)."""
    return kind.upper().endswith(("_SQ", "_PQ"))


def _way_out(kind: str, target: float | None, nprobe: int | None, nlist: int) -> str:
    """What can bring an index over the bar, naming only options that exist for ``kind``."""
    ways = []
    if target is None and (quantized(kind) or (nlist and (nprobe or 0) < nlist)):
        tuned = ["refine_factor"] if quantized(kind) else []
        tuned.append(f"nprobe, now {nprobe or 'default'}, of {nlist} partitions")
        if "HNSW" in kind:
            tuned.append("ef_search")
        ways.append(f"--target-recall 0.99 (tunes {', '.join(tuned)})")
    elif nlist and (nprobe or 0) < nlist:
        ways.append(f"--nprobe up to {nlist} (every partition probed)")
    ways.append("--force keeps this index as it is")
    ways.append("leaving --faiss-index out searches the table exactly")
    return "; ".join(ways)


def sql_string(value: str) -> str:
    """``value`` as a SQL string literal (single quotes doubled), so no id ends the literal."""
    return "'" + value.replace("'", "''") + "'"


def _in_list(ids: Sequence[str]) -> str:
    return f"doc_id IN ({', '.join(sql_string(i) for i in ids)})"


class LanceDBStore(_generation.MarkerGeneration, CollectionStore):
    """A LanceDB table searched by dot product (exact scan unless an index was asked for).

    ``LanceDBStore(db, table, dimension, options=…)``: ``options`` (or its keywords
    ``index_type``, ``hnsw_m``, ``ef_construction``, ``ef_search``, ``nlist``, ``nprobe``,
    ``target_recall``) is the vector index ``optimize()`` builds, and how it is searched and
    tuned. A table holds no handle (every write is a version): closing releases the folder's
    writer lock.
    """

    kind = "lancedb"
    #: Rows below which the table is searched exactly (:data:`EXACT_BELOW`).
    exact_below = EXACT_BELOW
    noun = "lancedb table"
    label = "LanceDB table"
    thread_safe_search = True

    def __init__(
        self, *args: Any, force: bool = False, writer: WriterLock | None = None, **kwargs: Any
    ) -> None:
        """``force`` keeps an index below the recall bar; ``writer`` is the folder's writer
        lock (None: the caller serializes writes)."""
        self.force = force
        self._writer = writer
        #: The folder's generation marker as read before the table was opened (a table
        #: object keeps reading the version it opened; a newer marker means reopen).
        self._version = _generation.read_version(writer.folder) if writer is not None else None
        super().__init__(*args, **kwargs)

    def _configure(self, opts: IndexOptions) -> dict[str, Any]:
        self.ef_search, self.nprobe = opts.hnsw.ef_search, opts.ivf.nprobe
        #: Tuned re-ranking factor of a quantized index (None: 1, see :meth:`_refine`).
        self.refine_factor: int | None = None
        self._build: dict[str, Any] = {}
        asked = opts.build()
        if opts.index_type is not None:
            kind = asked["index_type"] = opts.index_type.upper()
            if kind not in INDEX_TYPES:
                raise StoreError(
                    f"{self._location}: index_type {opts.index_type!r} is not one of "
                    f"{', '.join(t.lower() if t == 'FLAT' else t for t in INDEX_TYPES)}"
                )
            self._build = dict(asked)
        return asked

    def _opened(self, opts: IndexOptions) -> None:
        recorded = self._field_meta(INDEX_KEY) or {}
        if recorded:
            self._build = recorded  # reopened: the index the table was built with
        if recorded.get("tuned") and opts.hnsw.ef_search is None and opts.ivf.nprobe is None:
            self.ef_search, self.nprobe = recorded.get("ef_search"), recorded.get("nprobe")
            self.refine_factor = recorded.get("refine_factor")

    def _exists(self) -> bool:
        return self.collection in self._run("list tables", self._table_names)

    def _create(self, dimension: int) -> None:
        pa = require("pyarrow")
        schema = pa.schema(
            [
                pa.field("doc_id", pa.string(), nullable=False),
                pa.field("vector", pa.list_(pa.float32(), dimension)),
                pa.field("payload", pa.string()),
                pa.field("doc_norm", pa.float32()),
            ]
        )
        self.tbl = self._run(
            "create", lambda: self.client.create_table(self.collection, schema=schema)
        )

    def _recorded_build(self) -> dict[str, Any]:
        recorded = self._field_meta(INDEX_KEY) or {}
        return {
            "index_type": recorded.get("index_type"),
            "hnsw_m": recorded.get("m", recorded.get("hnsw_m")),
            "ef_construction": recorded.get("ef_construction"),
            "nlist": recorded.get("nlist"),
        }

    def _begin_write(self) -> None:
        """Before the first write of this object: take the folder's writer lock, then read the
        newest table version (another writer may have committed since it was opened)."""
        if self._writer is None or self._writer.held:
            return
        self._writer.acquire()
        self._version = _generation.read_version(self._writer.folder)
        if hasattr(self, "tbl"):
            self.tbl = self._run("open", lambda: self.client.open_table(self.collection))

    def _table_names(self) -> list[str]:
        listed = self.client.list_tables() if hasattr(self.client, "list_tables") else None
        names = getattr(listed, "tables", listed)
        if names is None:
            names = self.client.table_names()
        return list(names)

    def _open_existing(self, dimension: int | None) -> int:
        self.tbl = self._run("open", lambda: self.client.open_table(self.collection))
        schema = self.tbl.schema
        missing = [f for f in FIELDS if f not in schema.names]
        if missing:
            raise StoreError(
                f"{self._location}: table lacks field(s) {missing}; it was not created by magretrieve"
            )
        dim = getattr(schema.field("vector").type, "list_size", None)
        if not dim or dim < 1:
            raise StoreError(f"{self._location}: 'vector' is not a fixed-size float list")
        for idx in self._run("read indexes", self.tbl.list_indices):
            if "vector" in list(getattr(idx, "columns", [])):
                details = getattr(idx, "index_details", None) or {}
                metric = str(details.get("metric_type", "DOT")).upper()
                if metric != "DOT":
                    raise StoreError(
                        f"{self._location}: its vector index uses metric {metric}; magretrieve "
                        "needs dot (cosine erases document magnitude; l2 ranks by distance). "
                        "Drop that index or create a new table"
                    )
        return int(dim)

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        # lance raises OSError/ValueError/RuntimeError; pyarrow its ArrowException
        arrow = require("pyarrow")
        return (OSError, ValueError, RuntimeError, arrow.ArrowException)

    # ------------------------------------------------------------------ field metadata

    def _field_meta(self, key: str) -> dict[str, Any] | None:
        meta = self.tbl.schema.field("vector").metadata or {}
        raw = meta.get(key.encode())
        return self._recorded_object(raw, f"vector field metadata {key}")

    def _write_field_meta(self, key: str, value: Mapping[str, Any] | None) -> None:
        self._begin_write()
        text = json.dumps(dict(value), sort_keys=True) if value else None  # None deletes the key
        self._run(
            "write metadata",
            lambda: self.tbl.update_field_metadata({"path": "vector", "metadata": {key: text}}),
        )
        self._committed()

    # ------------------------------------------------------------------ properties

    def _index(self) -> Any:
        for idx in self.tbl.list_indices():
            if "vector" in list(getattr(idx, "columns", [])):
                return idx
        return None

    # ------------------------------------------------------------------ primitives

    def _upsert(self, batch: Batch) -> None:
        self._begin_write()
        pa = require("pyarrow")
        data = pa.table(
            {
                "doc_id": batch.ids,
                "vector": pa.FixedSizeListArray.from_arrays(
                    pa.array(batch.vectors.ravel()), self._dim
                ),
                "payload": [json.dumps(p, allow_nan=False) for p in batch.payloads],
                "doc_norm": batch.norms.astype(np.float32),
            },
            schema=self.tbl.schema,
        )
        # one merge_insert = one new table version: all of the batch or none of it
        self.tbl.merge_insert(
            "doc_id"
        ).when_matched_update_all().when_not_matched_insert_all().execute(data)
        self._committed()

    def _refine(self) -> int | None:
        """The re-ranking factor searches use: the tuned one, else 1 for a quantized index
        (exact scores), else None (the index holds the full vectors)."""
        if not quantized(str(self._build.get("index_type", ""))):
            return None
        return int(self.refine_factor or 1)

    def _search(self, q: np.ndarray, k: int, columns: list[str], exact: bool) -> Any:
        """One LanceDB query for the rows of ``q`` (2-d: one ``query_index`` a row)."""
        # LanceDB's limit is a 32-bit count: ask for at most the rows there are
        n = int(self.tbl.count_rows())
        k = max(1, min(k, n))
        s = self.tbl.search(q).distance_type("dot").limit(k).select([*columns, "_distance"])
        if exact or n < self.exact_below or self._index() is None:
            return s.bypass_vector_index()
        refine = self._refine()
        if refine:
            s = s.refine_factor(refine)
        if self.nprobe:
            s = s.nprobes(int(self.nprobe))
        if self.ef_search and "HNSW" in str(self._build.get("index_type", "")):
            # LanceDB refuses an ef below the candidates it is asked for (k × refine_factor)
            s = s.ef(max(int(self.ef_search), k * (refine or 1)))
        return s

    def _query(
        self, q: np.ndarray, k: int, with_vectors: bool, exact: bool = False
    ) -> list[list[StoreHit]]:
        """Top-``k`` per row, :data:`QUERIES_PER_CALL` rows a LanceDB query (one query per
        row cost the tuning sweep most of its time)."""
        columns = ["doc_id", "payload", "doc_norm"] + (["vector"] if with_vectors else [])
        out: list[list[StoreHit]] = []
        for start in range(0, len(q), QUERIES_PER_CALL):
            block = np.asarray(q[start : start + QUERIES_PER_CALL], dtype=np.float32)
            res = self._search(block, k, columns, exact=exact).to_arrow()
            cols = {name: res[name].to_pylist() for name in res.column_names}
            rows: list[list[StoreHit]] = [[] for _ in block]
            which = cols.get("query_index") or [0] * len(cols["doc_id"])
            for j, doc_id in enumerate(cols["doc_id"]):
                vec = np.asarray(cols["vector"][j], dtype=np.float32) if with_vectors else None
                rows[int(which[j])].append(
                    StoreHit(
                        str(doc_id),
                        1.0 - float(cols["_distance"][j]),  # LanceDB's dot distance: 1 − q·d
                        json.loads(cols["payload"][j] or "{}"),
                        vec,
                        doc_norm=float(cols["doc_norm"][j]),
                    )
                )
            for row in rows:
                row.sort(key=lambda h: -h.score)  # best first within each query (stable)
            out.extend(rows)
        return out

    def _query_exact(
        self, q: np.ndarray, k: int, with_vectors: bool
    ) -> list[list[StoreHit]] | None:
        """Rows a vector index answered short (too few partitions probed): the exact scan."""
        return self._query(q, k, with_vectors, exact=True)

    def _rows(self, ids: Sequence[str], columns: list[str]) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}
        unique = sorted(set(ids))
        for start in range(0, len(unique), IDS_PER_EXPRESSION):
            chunk = unique[start : start + IDS_PER_EXPRESSION]
            res = self.tbl.search().where(_in_list(chunk)).select(columns).limit(len(chunk))
            for rec in res.to_arrow().to_pylist():
                found[str(rec["doc_id"])] = rec
        return found

    def _delete(self, ids: list[str]) -> int:
        self._begin_write()
        present = sorted(self._existing(ids))
        for start in range(0, len(present), IDS_PER_EXPRESSION):
            self.tbl.delete(_in_list(present[start : start + IDS_PER_EXPRESSION]))
        if present:
            self._committed()
        return len(present)

    def _count(self) -> int:
        return int(self.tbl.count_rows())

    def _fetch(self, ids: list[str]) -> Iterable[StoreRecord]:
        found = self._rows(ids, ["doc_id", "vector", "payload"])
        return [
            StoreRecord(
                i, np.asarray(r["vector"], dtype=np.float32), json.loads(r["payload"] or "{}")
            )
            for i, r in found.items()
        ]

    def _existing(self, ids: list[str]) -> Iterable[str]:
        return list(self._rows(ids, ["doc_id"]))

    def _scan(self, columns: list[str]) -> Any:
        n = self.count()
        return self._run(
            "read", lambda: self.tbl.search().select(columns).limit(max(n, 1)).to_arrow()
        )

    def _scan_ids(self) -> Iterator[str]:
        return iter([str(i) for i in self._scan(["doc_id"])["doc_id"].to_pylist()])

    def _read_meta(self) -> dict[str, Any] | None:
        return self._field_meta(META_KEY)

    def _write_meta(self, meta: dict[str, Any]) -> None:
        self._write_field_meta(META_KEY, meta)

    # ------------------------------------------------------------------ index and recall

    @property
    def recall(self) -> dict[str, Any] | None:
        """The last recall@10 measurement of the vector index (None for the exact scan)."""
        return self._field_meta(RECALL_KEY)

    def optimize(self) -> None:
        """Build the requested vector index (if any), then measure and check its recall."""
        kind = self._build.get("index_type")
        if not kind or kind == "FLAT" or not self.count():
            return
        self._begin_write()
        if self._index() is None:
            self._create_index(kind)
        self.measure_recall(target_recall=self.target_recall)

    def _create_index(self, kind: str) -> None:
        n = self.count()
        nlist = self._build.get("nlist") or max(1, min(256, int(round(np.sqrt(n) / 2))))
        args: dict[str, Any] = {"distance_type": "dot", "num_partitions": int(nlist)}
        if "HNSW" in kind:
            args["m"] = int(self._build.get("hnsw_m") or 20)
            args["ef_construction"] = int(self._build.get("ef_construction") or 300)
        if kind.endswith("PQ"):
            args["num_sub_vectors"] = max(1, self._dim // 4 if self._dim % 4 == 0 else 1)
        config_class = "".join(part.capitalize() for part in kind.split("_"))  # IVF_PQ -> IvfPq
        config = getattr(require("lancedb.index"), config_class)(**args)
        self._run(f"build {kind} index", lambda: self.tbl.create_index("vector", config=config))
        self._write_field_meta(INDEX_KEY, {"index_type": kind, "nlist": int(nlist), **args})
        self._build = self._field_meta(INDEX_KEY) or {}

    def _recall_knob(self) -> Any:
        """``ef_search`` of the HNSW kinds, ``nprobe`` of the others (None: exact scan)."""
        if self._index() is None or self.count() < self.exact_below:
            return None
        if "HNSW" in str(self._build.get("index_type", "")):

            def set_ef(value: int) -> None:
                self.ef_search = int(value)

            return _ann_recall.Knob("ef_search", _ann_recall.HNSW_EF, set_ef, self.ef_search or 0)
        return self._nprobe_knob()

    def _refine_knob(self) -> Any:
        def set_refine(value: int) -> None:
            self.refine_factor = int(value)

        return _ann_recall.Knob("refine_factor", REFINE, set_refine, self._refine() or 1)

    def _nprobe_knob(self) -> Any:
        def set_nprobe(value: int) -> None:
            self.nprobe = int(value)

        nlist = int(self._build.get("nlist") or 1)
        return _ann_recall.Knob(
            "nprobe", _ann_recall.nprobe_values(nlist), set_nprobe, self.nprobe or 0
        )

    def _stored_vectors(self) -> tuple[list[str], np.ndarray]:
        scan = self._scan(["doc_id", "vector"])
        ids = [str(i) for i in scan["doc_id"].to_pylist()]
        return ids, np.asarray(scan["vector"].to_pylist(), dtype=np.float32)

    def _tune(self, run: Any, knob: Any, target: float | None) -> dict[str, Any]:
        """Each setting is raised only as far as the target needs, cheapest lever first:

        1. quantized kinds: ``refine_factor`` (a neighbour the compressed distance ranks just
           below the cut is missed at any ef or nprobe; re-ranking a few more candidates by
           the full vectors finds it);
        2. IVF_HNSW_*: ``nprobe`` (a partition left unprobed is missed at any ef), both at a
           generous ef; ``refine_factor`` is tuned again at that nprobe when it could not
           reach the target at the default one (a missing partition, not the quantization,
           was then what held it back);
        3. the kind's own knob (``ef_search`` of the HNSW kinds, ``nprobe`` of the others),
           whose pass measures the recall that is reported.

        The losses of the levers add up in the last pass, so the earlier passes aim at a
        stricter target (half the gap left to 1.0 closed again: 0.995 for 0.99, so a bar of
        0.9975), leaving the last lever most of the error budget.

        Without a target the settings given are measured as they are."""
        kind = str(self._build.get("index_type", ""))
        if target is not None:
            strict = target + (1.0 - target) / 2
            chosen_ef = self.ef_search
            if "HNSW" in kind:
                self.ef_search = max(int(self.ef_search or 0), PROBE_EF)
            refined = True
            if quantized(kind):
                refined = run(self._refine_knob(), strict, warn=False)[
                    "target_met_on_tuning_queries"
                ]
            if "HNSW" in kind:
                run(self._nprobe_knob(), strict, warn=False)
                if not refined:
                    run(self._refine_knob(), strict, warn=False)
            self.ef_search = chosen_ef
        recall = dict(run(knob if target is not None else None, target))
        recall["index_type"] = kind
        if "HNSW" in kind and self.nprobe:
            recall["nprobe"] = int(self.nprobe)
        if self._refine():
            recall["refine_factor"] = self._refine()
        self._tuned = target is not None
        return recall

    def _keep_recall(self, recall: dict[str, Any], knob: Any) -> None:
        """Keep it with the index settings; an index below the bar is dropped and refused
        (unless ``force``), with the measured recall and the ways out."""
        kind = recall["index_type"]
        value = recall[f"recall_at_{recall['k']}"]
        if value < _ann_recall.WARN_BELOW and not self.force:
            self._begin_write()
            nlist = int(self._build.get("nlist") or 0)
            self._run("drop index", lambda: self.tbl.drop_index(self._index().name))
            self._write_field_meta(INDEX_KEY, None)
            self._write_field_meta(RECALL_KEY, None)
            self._build = {}
            raise StoreError(
                f"{self._location}: {kind} measured recall@{recall['k']} {value:.3f} against "
                f"exact search (< {_ann_recall.WARN_BELOW}) on these magnitude-keeping vectors; "
                "the index was dropped and the table is searched exactly. Ways out: "
                f"{_way_out(kind, recall.get('target'), self.nprobe, nlist)}"
            )
        index_meta = dict(self._field_meta(INDEX_KEY) or {"index_type": kind})
        index_meta.update(
            {
                "ef_search": self.ef_search,
                "nprobe": self.nprobe,
                "refine_factor": self.refine_factor,
                "tuned": self._tuned,
            }
        )
        self._write_field_meta(INDEX_KEY, index_meta)
        self._write_field_meta(RECALL_KEY, recall)

    def _describe(self) -> dict[str, Any]:
        idx = self._index()
        out: dict[str, Any] = {"distance": "dot", "index": "exact scan" if idx is None else ""}
        if (self._build.get("index_type") or "FLAT") != "FLAT":
            out.update(_ann_recall.search_mode(self.count(), self.exact_below))
        if idx is not None:
            out["index"] = str(self._build.get("index_type") or idx.index_type)
            out["nlist"] = self._build.get("nlist")
            if "HNSW" in out["index"]:
                out["hnsw_m"] = self._build.get("m", self._build.get("hnsw_m"))
                out["ef_construction"] = self._build.get("ef_construction")
                out["ef_search"] = self.ef_search
            out["nprobe"] = self.nprobe
            if self._refine():
                out["refine_factor"] = self._refine()
            recall = self.recall
            if recall:
                out["recall"] = recall
        return out


# ----------------------------------------------------------------------------- registry entry


def open_lancedb(
    location: Mapping[str, str], dimension: int | None = None, **options: Any
) -> LanceDBStore:
    """Open (or create) the table of a parsed ``lancedb:`` spec."""
    mod = lancedb()
    path = Path(location["path"])
    where = f"lancedb:{path}/{location['collection']}"
    if dimension is None and not (path / f"{location['collection']}.lance").is_dir():
        raise missing_store(where, f"LanceDB table {location['collection']!r}")
    try:
        db = mod.connect(str(path))
    except Exception as exc:
        raise StoreError(f"{where}: cannot open the LanceDB folder ({exc})") from None
    return LanceDBStore(
        db,
        location["collection"],
        dimension,
        location=where,
        writer=WriterLock(path, where),
        **options,
    )


@dataclass(frozen=True)
class LanceDBOptions(StoreOptions):
    """Whether to keep an index below the recall bar: the backend's own option, set by
    ``Retriever.load(force=True)`` (``magretrieve index --force``)."""

    force: bool | None = option(
        "LanceDB: keep a vector index whose measured recall is below the bar (IVF_PQ on "
        "magnitude-keeping vectors); set by --force of magretrieve index.",
    )


registry.register(
    registry.Backend(
        form=FORM,
        parse=registry.parse_path_collection,
        open=open_lancedb,
        options=(IndexOptions, LanceDBOptions),
        index_types="IVF_HNSW_SQ, IVF_PQ, ... (built after indexing, recall measured; exact "
        "scan when absent)",
        extra="lancedb",
    )
)
