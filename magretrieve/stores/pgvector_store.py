"""PostgreSQL + pgvector: a table searched by inner product, vectors kept unnormalized.

Spec ``pgvector:POSTGRES_URI#TABLE`` (the URI as libpq takes it, e.g.
``postgresql://user@host:5432/db`` or ``postgresql://user@/db?host=/run/postgresql`` for a unix
socket; the table after ``#``, optionally ``schema.table``), or an open ``psycopg.Connection``
with ``collection="table"``.

Rules kept here, as in the other stores:

- the table is ``(doc_id text primary key, embedding vector(dim), payload jsonb, doc_norm real)``;
  ``doc_norm`` is the stored vector's norm, so SQL filters and dashboards see the magnitude;
- search is ``ORDER BY embedding <#> q`` (pgvector's *negative* inner product, so ascending
  order is best first; the score returned is its negation), served by an HNSW index with
  ``vector_ip_ops`` (default), an IVFFlat index with ``vector_ip_ops``, or an exact scan
  (``index_type="flat"``);
- a new table's index is built after the first rows, as pgvector advises: inside
  :meth:`~magretrieve.stores.base.VectorStore.bulk_load` (``magretrieve index``) by
  ``optimize()`` at the end of the load, in one pass over every row; otherwise after the first
  write, so rows added one batch at a time are indexed as they arrive;
- an existing table whose vector column is indexed with ``vector_cosine_ops`` or
  ``vector_l2_ops`` is refused (such an index ranks by another metric than the model's) unless
  it was annotated for the plug-in path (see :mod:`magretrieve.stores.pgvector_cosine_store`);
- which model built the table is recorded as JSON in the table's ``COMMENT``.

Every batch is validated (ids, dimension, NaN/inf, JSON payloads) before one row is written,
and written in one transaction, so a failed batch leaves the table as it was.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.extras import require
from magretrieve.core.redact import redact
from magretrieve.core.text import lone_surrogate
from magretrieve.stores import _ann_recall, registry
from magretrieve.stores._pgvector_sql import (
    META_KEY,
    PgConnection,
    _quote,
    _sql,
    as_array,
    column_dimension,
    psycopg,
    read_comment,
    register_vector,
    vector_indexes,
)
from magretrieve.stores.base import (
    Batch,
    StoreHit,
    StoreRecord,
    VectorStore,
    closed_on_failure,
    metric_refusal,
    one_line,
)
from magretrieve.stores.options import AnnotatedOptions, IndexOptions

logger = logging.getLogger(__name__)

#: COMMENT key of the last recall measurement (with the ef_search it tuned to).
RECALL_KEY = "magretrieve.recall"
#: COMMENT key of the build options given at creation (the index type, which no index tells
#: for an exact-scan table or an IVFFlat index not built yet, and its parameters).
INDEX_KEY = "magretrieve.index"
#: Index types this store builds.
INDEX_TYPES = ("hnsw", "ivfflat", "flat")
#: A table holding fewer rows than this is searched by a sequential scan (``SET LOCAL
#: enable_indexscan = off`` for the query), not its HNSW/IVFFlat index: below it one exact
#: query takes no longer than one index query (docs/stores.md, "Exact below a size").
EXACT_BELOW = 1_000
#: pgvector's defaults of the index parameters a definition leaves out.
INDEX_DEFAULTS = {"hnsw": {"m": 16, "ef_construction": 64}, "ivfflat": {"lists": 100}}
#: pgvector operator classes that rank by another metric than the inner product.
OTHER_OPCLASSES = {
    "vector_cosine_ops": "cosine distance",
    "vector_l2_ops": "L2 distance",
    "vector_l1_ops": "L1 distance",
    "halfvec_cosine_ops": "cosine distance",
    "halfvec_l2_ops": "L2 distance",
}


#: PostgreSQL keeps identifiers of at most NAMEDATALEN - 1 bytes and truncates longer ones
#: silently (two long names sharing their first 63 bytes would name one table).
MAX_IDENTIFIER_BYTES = 63


def split_table(name: str, where: str) -> tuple[str, ...]:
    """``table`` or ``schema.table`` as identifier parts; anything else is refused.

    Names PostgreSQL would change are refused too: a part over 63 bytes (truncated) or one
    holding a NUL character (not storable).
    """
    parts = tuple(name.split("."))
    if not name or len(parts) > 2 or not all(parts):
        raise StoreError(f"{where}: table name {name!r} must be TABLE or SCHEMA.TABLE")
    for part in parts:
        size = len(part.encode("utf-8", "surrogatepass"))
        if size > MAX_IDENTIFIER_BYTES:
            raise StoreError(
                f"{where}: table name {part[:20]!r}... is {size} bytes; PostgreSQL keeps at most "
                f"{MAX_IDENTIFIER_BYTES} bytes per identifier and would truncate it silently"
            )
        if "\x00" in part or lone_surrogate(part) is not None:
            raise StoreError(f"{where}: table name {part!r} holds a NUL or invalid character")
    return parts


def connect(uri: str, where: str) -> Any:
    """A new autocommit connection with the ``vector`` extension created and registered."""
    pg = psycopg()
    try:
        conn = pg.connect(uri, autocommit=True)
    except pg.Error as exc:
        raise StoreError(f"{where}: cannot connect to PostgreSQL ({one_line(exc)})") from None
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(conn)
    except pg.Error as exc:
        conn.close()
        raise StoreError(
            f"{where}: the pgvector extension is not available ({one_line(exc)})"
        ) from None
    return conn


def index_parameters(conn: Any, table: tuple[str, ...], column: str) -> dict[str, dict[str, int]]:
    """{access method: its build parameters} of the indexes on ``table.column``, pgvector's
    defaults filled in where the definition leaves one out (``m``, ``lists``, ...)."""
    rows = conn.execute(
        """
        SELECT am.amname, ic.reloptions
        FROM pg_index ix
        JOIN pg_class ic ON ic.oid = ix.indexrelid
        JOIN pg_am am ON am.oid = ic.relam
        JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = ix.indkey[0]
        WHERE ix.indrelid = %s::regclass AND a.attname = %s
        """,
        (".".join(_quote(p) for p in table), column),
    ).fetchall()
    out: dict[str, dict[str, int]] = {}
    for method, reloptions in rows:
        params = dict(INDEX_DEFAULTS.get(str(method), {}))
        for item in reloptions or ():
            key, _, value = str(item).partition("=")
            if value.isdigit():
                params[key] = int(value)
        out[str(method)] = params
    return out


def table_exists(conn: Any, table: tuple[str, ...]) -> bool:
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (".".join(_quote(p) for p in table),)
    ).fetchone()
    return bool(row[0])


class PgVectorStore(PgConnection):
    """A pgvector table searched by inner product (``<#>``), one row per document.

    ``PgVectorStore(conn, table, dimension, options=…)``: ``options`` (or its keywords
    ``index_type``, ``hnsw_m``, ``ef_construction``, ``ef_search``, ``nlist``, ``nprobe``,
    ``target_recall``) is the index built and how it is searched and tuned.
    """

    kind = "pgvector"
    #: Rows below which the table is searched exactly (:data:`EXACT_BELOW`).
    exact_below = EXACT_BELOW
    #: The primary key's btree holds at most ~2.7 kB per entry; a longer id fails mid-batch
    #: (ProgramLimitExceeded) or only when it does not compress, so it is refused up front.
    max_id_bytes = 2048
    thread_safe_search = False  # one connection: the Retriever serializes searches

    def _configure(self, opts: IndexOptions) -> dict[str, Any]:
        self.recall: dict[str, Any] | None = None
        self._name = split_table(self.collection, self._location)
        self._table = _sql().Identifier(*self._name)
        self.ef_search, self.nprobe = opts.hnsw.ef_search, opts.ivf.nprobe
        if opts.index_type is not None and opts.index_type not in INDEX_TYPES:
            raise StoreError(
                f"{self._location}: index_type {opts.index_type!r} is not one of "
                f"{', '.join(INDEX_TYPES)}"
            )
        self._asked = opts.build()
        #: (access method, build parameters) of the index recorded at creation and not built
        #: yet; IVFFlat lists of None are chosen from the row count when it is built
        self._pending: tuple[str, dict[str, int | None]] | None = None
        return self._asked

    def _opened(self, opts: IndexOptions) -> None:
        recall = self._tx(lambda: read_comment(self.conn, self._name)).get(RECALL_KEY)
        if isinstance(recall, dict):
            self.recall = recall
            if self.ef_search is None and recall.get("ef_search"):
                self.ef_search = int(recall["ef_search"])  # the value --target-recall chose

    # ------------------------------------------------------------------ setup

    def _exists(self) -> bool:
        return table_exists(self.conn, self._name)

    def _open_existing(self, dimension: int | None) -> int:
        cols = {
            r[0]
            for r in self.conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass "
                "AND attnum > 0 AND NOT attisdropped",
                (".".join(_quote(p) for p in self._name),),
            ).fetchall()
        }
        missing = sorted({"doc_id", "embedding", "payload", "doc_norm"} - cols)
        if missing:
            raise StoreError(
                f"{self._location}: table lacks column(s) {missing}; it was not created by "
                "magretrieve (annotate an existing cosine table with `magretrieve annotate`)"
            )
        dim = column_dimension(self.conn, self._name, "embedding")
        self._check_indexes()
        if dim is None:  # pragma: no cover - excluded by the column check above
            raise StoreError(f"{self._location}: no embedding column")
        return dim

    def _recorded_build(self) -> dict[str, Any]:
        """The build options the table was built with: an index's parameters from its definition, the index type (and the lists of an IVFFlat index
        optimize() has not built yet) from the COMMENT written at creation. A table without
        that record (created before magretrieve wrote it, or by another program) and without
        an index has unknown options, and any are accepted."""
        built = read_comment(self.conn, self._name).get(INDEX_KEY)
        built = built if isinstance(built, dict) else {}
        indexes = index_parameters(self.conn, self._name, "embedding")
        recorded: dict[str, Any] = {"index_type": built.get("index_type")}
        if "hnsw" in indexes:
            hnsw = indexes["hnsw"]
            recorded.update(
                index_type="hnsw", hnsw_m=hnsw.get("m"), ef_construction=hnsw.get("ef_construction")
            )
        elif "ivfflat" in indexes:
            recorded.update(index_type="ivfflat", nlist=indexes["ivfflat"].get("lists"))
        elif built.get("index_type") == "hnsw":
            recorded.update(
                hnsw_m=built.get("hnsw_m"), ef_construction=built.get("ef_construction")
            )
            # created, written inside a bulk load that did not reach optimize(): still to build
            self._pending = (
                "hnsw",
                {
                    "m": self._asked.get("hnsw_m") or built.get("hnsw_m"),
                    "ef_construction": self._asked.get("ef_construction")
                    or built.get("ef_construction"),
                },
            )
        elif built.get("index_type") == "ivfflat":
            recorded["nlist"] = built.get("nlist")
            # the index is still to build: optimize() builds it, as it would have before
            self._pending = ("ivfflat", {"lists": self._asked.get("nlist") or built.get("nlist")})
        return recorded

    def _check_indexes(self) -> None:
        for name, method, opclass in vector_indexes(self.conn, self._name, "embedding"):
            if opclass in OTHER_OPCLASSES:
                raise metric_refusal(
                    self._location,
                    f"index {name!r} ({method}, {opclass}, ranking by {OTHER_OPCLASSES[opclass]})",
                    "vector_ip_ops",
                    ". Create a new table",
                )

    def _create(self, dim: int) -> None:
        sql = _sql()
        index_type = self._asked["index_type"] or "hnsw"
        hnsw_m, ef_construction = self._asked["hnsw_m"], self._asked["ef_construction"]
        nlist = self._asked["nlist"]
        if dim < 1 or dim > 16000:
            raise StoreError(f"{self._location}: pgvector dimension must be 1..16000, got {dim}")
        self.conn.execute(
            sql.SQL(
                "CREATE TABLE {} (doc_id text PRIMARY KEY, embedding vector({}) NOT NULL, "
                "payload jsonb NOT NULL DEFAULT '{{}}', doc_norm real NOT NULL)"
            ).format(self._table, sql.Literal(dim))
        )
        built = {
            "index_type": index_type,
            "hnsw_m": hnsw_m,
            "ef_construction": ef_construction,
            "nlist": nlist,
        }
        self.conn.execute(
            sql.SQL("COMMENT ON TABLE {} IS {}").format(
                self._table, sql.Literal(json.dumps({INDEX_KEY: built}, sort_keys=True))
            )
        )
        if index_type == "hnsw":
            # built over the first rows (see the module docstring), not grown row by row
            self._pending = ("hnsw", {"m": hnsw_m, "ef_construction": ef_construction})
        elif index_type == "ivfflat":
            # IVFFlat lists are trained on the rows present when the index is built:
            # it is built by optimize(), after the bulk load
            self._pending = ("ivfflat", {"lists": nlist})

    def _create_index(self, method: str, params: Mapping[str, int | None]) -> None:
        sql = _sql()
        given = {k: int(v) for k, v in params.items() if v is not None}
        with_clause = sql.SQL("")
        if given:
            with_clause = sql.SQL(" WITH ({})").format(
                sql.SQL(", ").join(
                    sql.SQL("{} = {}").format(sql.SQL(k), sql.Literal(v)) for k, v in given.items()
                )
            )
        self.conn.execute(
            sql.SQL("CREATE INDEX ON {} USING {} (embedding vector_ip_ops){}").format(
                self._table, sql.SQL(method), with_clause
            )
        )

    # ------------------------------------------------------------------ properties

    def _run(self, what: str, fn: Any) -> Any:
        with self._driver(what):
            return self._tx(fn)

    # ------------------------------------------------------------------ primitives

    def _upsert(self, batch: Batch) -> None:
        sql = _sql()
        types = require("psycopg.types.json")
        rows = [(i, v, types.Jsonb(p), n) for i, v, p, n in batch.rows()]
        stmt = sql.SQL(
            "INSERT INTO {} (doc_id, embedding, payload, doc_norm) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (doc_id) DO UPDATE SET embedding = EXCLUDED.embedding, "
            "payload = EXCLUDED.payload, doc_norm = EXCLUDED.doc_norm"
        ).format(self._table)

        def write() -> None:
            with self.conn.cursor() as cur:
                cur.executemany(stmt, rows)

        self._tx(write)
        # an HNSW graph takes rows as they come; IVFFlat lists are trained by optimize()
        if self._pending is not None and self._pending[0] == "hnsw" and not self.bulk_loading:
            self._build_pending()

    def _build_pending(self) -> None:
        """Build the index recorded at creation over the rows stored now (IVFFlat lists not
        given: 4·√rows, at most 4,096). An advisory lock on the table's name makes a second
        writer doing the same find it built."""
        assert self._pending is not None
        method, params = self._pending
        name = ".".join(_quote(p) for p in self._name)
        if method == "ivfflat" and not params.get("lists"):
            params = {"lists": max(1, min(int(4 * np.sqrt(max(self.count(), 1))), 4096))}

        def build() -> None:
            self.conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (name,))
            if not any(
                m == method for _, m, _ in vector_indexes(self.conn, self._name, "embedding")
            ):
                self._create_index(method, params)

        def forward(diag: Any) -> None:
            # pgvector says when the graph outgrows maintenance_work_mem (a much slower build)
            if "maintenance_work_mem" in str(diag.message_primary or ""):
                logger.warning("%s: %s", self._location, diag.message_primary)

        self.conn.add_notice_handler(forward)
        try:
            self._run("index build", build)
        finally:
            self.conn.remove_notice_handler(forward)
        self._pending = None

    def _below_exact(self, cur: Any) -> bool:
        """Whether the table holds fewer rows than :attr:`exact_below` (counted up to it
        only, so a large table costs no full count)."""
        stmt = _sql().SQL("SELECT count(*) FROM (SELECT 1 FROM {} LIMIT %s) AS head")
        cur.execute(stmt.format(self._table), (int(self.exact_below),))
        return int(cur.fetchone()[0]) < self.exact_below

    def _search_settings(self, cur: Any, k: int) -> None:
        # SET LOCAL lasts until the end of the surrounding transaction; values are integers
        # (checked options), bound as literals
        sql = _sql()
        if self._below_exact(cur):
            cur.execute("SET LOCAL enable_indexscan = off")
            return
        ef = min(max(int(self.ef_search or 40), k), 1000)
        cur.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(ef)))
        if self.nprobe is not None:
            cur.execute(
                sql.SQL("SET LOCAL ivfflat.probes = {}").format(sql.Literal(int(self.nprobe)))
            )

    def _query(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        sql = _sql()
        cols = sql.SQL("doc_id, payload, doc_norm, -(embedding <#> %s) AS score")
        if with_vectors:
            cols = sql.SQL("{}, embedding").format(cols)
        stmt = sql.SQL("SELECT {} FROM {} ORDER BY embedding <#> %s LIMIT %s").format(
            cols, self._table
        )

        def run() -> list[list[StoreHit]]:
            out = []
            with self.conn.cursor() as cur:
                self._search_settings(cur, k)
                for row in q:
                    cur.execute(stmt, (row, row, k))
                    out.append([self._hit(r, with_vectors) for r in cur.fetchall()])
            return out

        return self._tx(run)

    @staticmethod
    def _hit(r: Sequence[Any], with_vectors: bool) -> StoreHit:
        vec = as_array(r[4]) if with_vectors else None
        return StoreHit(str(r[0]), float(r[3]), dict(r[1] or {}), vec, doc_norm=float(r[2]))

    def _delete(self, ids: list[str]) -> int:
        stmt = _sql().SQL("DELETE FROM {} WHERE doc_id = ANY(%s)").format(self._table)
        return self._changed_rows(stmt, (ids,))

    def _count(self) -> int:
        return int(self._first_value(_sql().SQL("SELECT count(*) FROM {}").format(self._table)))

    def _fetch(self, ids: list[str]) -> Iterable[StoreRecord]:
        stmt = _sql().SQL("SELECT doc_id, embedding, payload FROM {} WHERE doc_id = ANY(%s)")
        rows = self._tx(lambda: self.conn.execute(stmt.format(self._table), (ids,)).fetchall())
        return [StoreRecord(str(r[0]), as_array(r[1]), dict(r[2] or {})) for r in rows]

    def _existing(self, ids: list[str]) -> Iterable[str]:
        stmt = _sql().SQL("SELECT doc_id FROM {} WHERE doc_id = ANY(%s)").format(self._table)
        return [str(r[0]) for r in self._tx(lambda: self.conn.execute(stmt, (ids,)).fetchall())]

    def _scan_ids(self) -> Iterator[str]:
        stmt = (
            _sql()
            .SQL("SELECT doc_id FROM {} WHERE doc_id > %s ORDER BY doc_id LIMIT 4096")
            .format(self._table)
        )
        last = ""
        while True:
            rows = self._tx(lambda last=last: self.conn.execute(stmt, (last,)).fetchall())
            if not rows:
                return
            for r in rows:
                yield str(r[0])
            last = str(rows[-1][0])

    def _read_meta(self) -> dict[str, Any] | None:
        value = self._tx(lambda: read_comment(self.conn, self._name)).get(META_KEY)
        return dict(value) if isinstance(value, dict) and value else None

    def _write_meta(self, meta: dict[str, Any]) -> None:
        """Record ``meta`` under the COMMENT's ``magretrieve`` key, keeping the COMMENT's other
        keys; a COMMENT that is not a JSON object is someone's text and is never replaced."""
        self._write_comment_key(META_KEY, meta)

    def _write_comment_key(self, key: str, meta: dict[str, Any]) -> None:
        sql = _sql()

        def write() -> None:
            row = self.conn.execute(
                "SELECT obj_description(%s::regclass, 'pg_class')",
                (".".join(_quote(p) for p in self._name),),
            ).fetchone()
            current = row[0] if row else None
            try:
                doc = json.loads(current) if current else {}
            except ValueError:
                doc = None
            if not isinstance(doc, dict):
                raise StoreError(
                    f"{self._location}: the table's COMMENT is text magretrieve did not write "
                    f"({len(current or '')} characters), and magretrieve records its model "
                    "there; it is left as it is. Clear it (COMMENT ON TABLE ... IS NULL) or use "
                    "another table"
                )
            text = json.dumps({**doc, key: meta}, sort_keys=True)
            self.conn.execute(
                sql.SQL("COMMENT ON TABLE {} IS {}").format(self._table, sql.Literal(text))
            )

        self._tx(write)

    def optimize(self) -> None:
        """Build a pending HNSW or IVFFlat index (lists trained on the rows now stored), then
        ANALYZE and tune to the target recall."""
        sql = _sql()
        if self._pending is not None:
            self._build_pending()
        self._run("analyze", lambda: self.conn.execute(sql.SQL("ANALYZE {}").format(self._table)))
        self.measure_recall(target_recall=self.target_recall)

    def _recall_knob(self) -> Any:
        """``hnsw.ef_search`` (at most pgvector's 1,000) of an HNSW index; the recall is kept
        in the table's COMMENT."""
        indexes = self._tx(lambda: vector_indexes(self.conn, self._name, "embedding"))
        if not any(m == "hnsw" for _, m, _ in indexes):
            return None
        if self._count() < self.exact_below:
            return None  # searched by a sequential scan: nothing approximate to measure

        def set_ef(value: int) -> None:
            self.ef_search = int(value)

        values = sorted({v for v in _ann_recall.HNSW_EF if v <= 1000} | {1000})
        return _ann_recall.Knob("ef_search", values, set_ef, int(self.ef_search or 40))

    def _keep_recall(self, recall: dict[str, Any], knob: Any) -> None:
        self.ef_search = knob.current
        self.recall = recall
        self._write_comment_key(RECALL_KEY, recall)

    def _describe(self) -> dict[str, Any]:
        indexes = self._tx(lambda: vector_indexes(self.conn, self._name, "embedding"))
        out: dict[str, Any] = {
            "operator": "<#> (negative inner product)",
            "index": ", ".join(f"{m} ({o})" for _, m, o in indexes) or "exact (sequential scan)",
        }
        if indexes:
            out.update(_ann_recall.search_mode(self._count(), self.exact_below))
        if any(m == "hnsw" for _, m, _ in indexes):
            out["ef_search"] = self.ef_search or 40
            if self.recall:
                out["recall"] = self.recall
        if any(m == "ivfflat" for _, m, _ in indexes):
            out["nprobe"] = self.nprobe or 1
        if self._pending is not None:
            method = self._pending[0]
            out["index_pending"] = (
                f"{method} (built by "
                + ("the next write or " if method == "hnsw" else "")
                + "optimize())"
            )
        return out


def open_pgvector(
    uri: str, table: str, dimension: int | None = None, annotating: bool = False, **options: Any
) -> VectorStore:
    """Connect to ``uri`` and open (or create) ``table`` (the ``pgvector:`` spec's opener)."""
    where = f"pgvector:{redact(uri)}#{table}"
    with closed_on_failure(connect(uri, where)) as conn:
        return store_for(
            conn, table, dimension, options, owns=True, where=where, annotating=annotating
        )


def store_for(
    conn: Any,
    table: str,
    dimension: int | None,
    options: dict[str, Any],
    *,
    owns: bool,
    where: str | None,
    annotating: bool = False,
) -> VectorStore:
    """PgVectorStore, or the plug-in PgCosineStore for an existing table ranked by cosine."""
    from magretrieve.stores import pgvector_cosine_store as plugin

    name = split_table(table, where or "pgvector")
    with conn.transaction():
        plugin_table = table_exists(conn, name) and plugin.is_plugin_table(conn, name)
    if plugin_table or annotating:
        with conn.transaction():
            exists = table_exists(conn, name)
            ip = exists and any(
                o == "vector_ip_ops" for _, _, o in vector_indexes(conn, name, "embedding")
            )
        if not exists:
            raise StoreError(f"{where or table}: no such table to annotate")
        if ip and not plugin_table:
            raise StoreError(
                f"{where or table}: annotate is for an existing table ranked by cosine; this one "
                "is searched by inner product already (a magretrieve table keeps the magnitude)"
            )
        extra = sorted(set(options) - {"prefetch", "ef_search"})
        if extra:
            raise StoreError(f"option(s) {extra} do not apply to an annotated cosine table")
        return plugin.PgCosineStore(
            conn,
            name,
            dimension,
            owns_connection=owns,
            location=where,
            annotating=annotating,
            **options,
        )
    if "prefetch" in options:
        raise StoreError("option 'prefetch' applies only to an annotated cosine table")
    return PgVectorStore(conn, table, dimension, owns_connection=owns, location=where, **options)


# ----------------------------------------------------------------------------- registry entry


def parse_pgvector(rest: str, spec: str) -> dict[str, str]:
    """``POSTGRES_URI#TABLE`` -> {"uri", "table"}; a missing table is refused naming the form."""
    uri, sep, name = rest.rpartition("#")
    if not sep or not uri or not name:
        raise StoreError(
            f"store spec {redact(spec)!r}: expected {FORM}, e.g. "
            "pgvector:postgresql://user@localhost:5432/db#scifact"
        )
    return {"uri": uri, "table": name}


def _open(loc: dict[str, str], dimension: int | None, **options: Any) -> VectorStore:
    return open_pgvector(loc["uri"], loc["table"], dimension, **options)


def _adopt(conn: Any, table: str, dimension: int | None, **options: Any) -> VectorStore:
    register_vector(conn)
    return store_for(conn, table, dimension, options, owns=False, where=None)


FORM = "pgvector:POSTGRES_URI#TABLE"

registry.register(
    registry.Backend(
        form=FORM,
        parse=parse_pgvector,
        open=_open,
        options=(IndexOptions, AnnotatedOptions),
        index_types="hnsw (default), ivfflat (built by optimize), flat",
        adopts=("psycopg", ""),
        adopt=_adopt,
        adopted="a psycopg connection (collection=TABLE)",
        extra="pgvector",
    )
)
