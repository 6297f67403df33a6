"""The plug-in path for an existing pgvector table ranked by cosine: ``cos·m(d)`` in SQL.

Most pgvector deployments hold a table such as ``items(id bigserial primary key, content text,
embedding vector(384))`` with an HNSW ``vector_cosine_ops`` index, and will not rebuild it.
``magretrieve annotate --store pgvector:URI#items`` adds one column (``magretrieve_m real``
unless ``--field`` names another that does not exist yet), records the recipe in that column's
COMMENT together with an ``incomplete`` marker, fills the column with each row's magnitude
``m(d)``, and removes the marker last. The column magretrieve owns is the one whose COMMENT
holds its record. Search is then one statement::

    SELECT ... FROM (SELECT ..., 1 - (embedding <=> q) AS cos FROM items
                     ORDER BY embedding <=> q LIMIT prefetch) c     -- the cosine index
    ORDER BY cos * coalesce(magretrieve_m, 1) DESC LIMIT k

The table's own columns are never changed: the id is its single-column primary key (as text),
the vector its ``vector(n)`` column, the payload every other column (``to_jsonb(row)``). Rows
are written by the user's pipeline, so ``add`` is refused; rows added later have no ``m``: they
are scored with ``m = 1`` and :meth:`PgCosineStore.describe` counts them in a warning until
``magretrieve annotate`` runs again. While the column's COMMENT holds the ``incomplete``
marker, search ranks by plain cosine (one logged warning). Seen through the
:class:`~magretrieve.stores.base.VectorStore` protocol a row's vector is ``m(d)·d̂``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.stores.base import (
    StoreHit,
    StoreRecord,
    VectorStore,
    check_k,
    check_queries,
)
from magretrieve.stores.pgvector_store import (
    META_KEY,
    _quote,
    _sql,
    as_array,
    column_dimension,
    psycopg,
    read_comment,
    register_vector,
    run_in_transaction,
    vector_indexes,
)
from magretrieve.stores.qdrant_cosine_store import (
    ANNOTATION_KEY,
    DEFAULT_PREFETCH,
    INCOMPLETE_KEY,
    annotation_warnings,
    fallback_warning,
    is_incomplete,
)

#: The column annotate adds.
DEFAULT_COLUMN = "magretrieve_m"


@dataclass
class Row:
    """One row as annotate reads it."""

    id: str
    vector: np.ndarray
    payload: dict[str, Any]


def table_layout(conn: Any, ref: str) -> tuple[str, str, list[str]]:
    """(primary-key column, vector column, all column names) of an existing table."""
    pk = conn.execute(
        """
        SELECT a.attname FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
        WHERE i.indrelid = %s::regclass AND i.indisprimary
        """,
        (ref,),
    ).fetchall()
    cols = conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (ref,),
    ).fetchall()
    vectors = [str(c[0]) for c in cols if str(c[1]).startswith("vector(")]
    if len(pk) != 1:
        raise StoreError(f"{ref}: needs a single-column primary key to identify rows")
    if len(vectors) != 1:
        raise StoreError(f"{ref}: needs exactly one vector(n) column, found {vectors}")
    return str(pk[0][0]), vectors[0], [str(c[0]) for c in cols]


#: Columns of a table magretrieve creates for inner-product search (see pgvector_store).
OWN_TABLE_COLUMNS = frozenset({"doc_id", "embedding", "payload", "doc_norm"})


def annotated_column(conn: Any, table: tuple[str, ...]) -> str | None:
    """The column whose COMMENT holds magretrieve's annotation record (or marker), if any."""
    ref = ".".join(_quote(p) for p in table)
    rows = conn.execute(
        "SELECT attname, col_description(attrelid, attnum) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (ref,),
    ).fetchall()
    for name, comment in rows:
        try:
            value = json.loads(comment) if comment else None
        except ValueError:
            continue
        meta = value.get(META_KEY) if isinstance(value, dict) else None
        if isinstance(meta, dict) and (meta.get(ANNOTATION_KEY) or meta.get(INCOMPLETE_KEY)):
            return str(name)
    return None


def is_plugin_table(conn: Any, table: tuple[str, ...]) -> bool:
    """An existing table searched by cosine (a ``vector_cosine_ops`` index) or annotated."""
    ref = ".".join(_quote(p) for p in table)
    try:
        _, vec, cols = table_layout(conn, ref)
    except StoreError:
        return False
    if annotated_column(conn, table) is not None:
        return True
    return any(o == "vector_cosine_ops" for _, _, o in vector_indexes(conn, table, vec))


def built_by_magretrieve(conn: Any, table: tuple[str, ...], cols: Sequence[str]) -> bool:
    """A table magretrieve created for inner-product search (its layout or its COMMENT)."""
    return set(cols) >= OWN_TABLE_COLUMNS or bool(read_comment(conn, table).get(META_KEY))


class PgCosineStore(VectorStore):
    """An annotated pgvector table searched by ``cos·m(d)`` over a cosine prefetch."""

    kind = "pgvector-cosine"
    thread_safe_search = False

    def __init__(
        self,
        conn: Any,
        table: tuple[str, ...],
        dimension: int | None = None,
        *,
        prefetch: int | None = None,
        ef_search: int | None = None,
        owns_connection: bool = False,
        location: str | None = None,
        annotating: bool = False,
    ) -> None:
        _sql()  # psycopg installed, or one line saying which extra
        self.conn = conn
        self._owns = owns_connection
        self._name = table
        self._ref = ".".join(_quote(p) for p in table)
        self._location = location or f"pgvector table {'.'.join(table)!r}"
        self.ef_search = ef_search
        self._fallback = False  # searching by plain cosine while marked incomplete
        try:
            with conn.transaction():
                register_vector(conn)
                self._pk, self._vec, cols = table_layout(conn, self._ref)
                self._cols_now = list(cols)
                self._dim = int(column_dimension(conn, table, self._vec) or 0)
                owned = annotated_column(conn, table)
                self.field = owned or DEFAULT_COLUMN
                meta = self.read_metadata() if owned else None
                own_table = annotating and built_by_magretrieve(conn, table, cols)
        except psycopg().Error as exc:
            raise StoreError(f"{self._location}: {type(exc).__name__}: {exc}") from None
        if own_table:
            raise StoreError(
                f"{self._location}: built by magretrieve for inner-product search (its vectors "
                "keep the magnitude already); annotate is for an existing table ranked by "
                "cosine. Nothing was changed"
            )
        if dimension is not None and self._dim != int(dimension):
            raise StoreError(
                f"{self._location} has vector size {self._dim}, but the model produces "
                f"dimension {dimension}"
            )
        ann = (meta or {}).get(ANNOTATION_KEY)
        if not ann and not annotating:
            raise StoreError(
                f"{self._location} is ranked by cosine (vector_cosine_ops), which erases document "
                "magnitude; create a new table, or keep this one and rank by cos·m(d) after "
                "`magretrieve annotate --store SPEC ...` writes m(d) into a column"
            )
        self.prefetch = int(prefetch or (ann or {}).get("prefetch") or DEFAULT_PREFETCH)

    # ------------------------------------------------------------------ helpers

    @property
    def dimension(self) -> int:
        return self._dim

    @property
    def location(self) -> str:
        return self._location

    def _run(self, what: str, fn: Any) -> Any:
        return run_in_transaction(self.conn, self._location, what, fn)

    def _cols(self) -> dict[str, Any]:
        sql = _sql()
        return {
            "t": sql.Identifier(*self._name),
            "pk": sql.Identifier(self._pk),
            "vec": sql.Identifier(self._vec),
            "m": sql.Identifier(self.field),
            "pk_name": sql.Literal(self._pk),
            "vec_name": sql.Literal(self._vec),
            "m_name": sql.Literal(self.field),
        }

    def _payload_sql(self) -> Any:
        return _sql().SQL("to_jsonb(t) - {pk_name} - {vec_name} - {m_name}").format(**self._cols())

    def _m_sql(self, cosine: bool) -> Any:
        """m(d) in SQL: 1 while marked incomplete, else the column (1 where still empty)."""
        sql = _sql()
        if cosine or self.field not in self._cols_now:
            return sql.SQL("1.0::real")
        return sql.SQL("coalesce(t.{m}, 1.0::real)").format(**self._cols())

    # ------------------------------------------------------------------ protocol

    def add(
        self,
        ids: Sequence[str],
        vectors: np.ndarray,
        payloads: Sequence[Mapping[str, Any]] | None = None,
    ) -> int:
        raise StoreError(
            f"{self._location}: rows of an existing table are written by your own pipeline; "
            "insert them there, then run `magretrieve annotate` again to give them m(d)"
        )

    def search(
        self, queries: np.ndarray, k: int, *, with_vectors: bool = True
    ) -> list[list[StoreHit]]:
        sql = _sql()
        q = check_queries(queries, self._dim, self._location)
        k = check_k(k)
        limit = max(self.prefetch, k)

        def run() -> list[list[StoreHit]]:
            cosine = is_incomplete(self.read_metadata())
            if cosine and not self._fallback:
                fallback_warning(self._location)
            self._fallback = cosine
            stmt = sql.SQL(
                "SELECT id, payload, m, cos * m AS score, v FROM ("
                "SELECT t.{pk}::text AS id, {payload} AS payload, {mval} AS m, "
                "1 - (t.{vec} <=> %s) AS cos, t.{vec} AS v FROM {t} t "
                "ORDER BY t.{vec} <=> %s LIMIT %s) c "
                "ORDER BY score DESC LIMIT %s"
            ).format(payload=self._payload_sql(), mval=self._m_sql(cosine), **self._cols())
            out = []
            with self.conn.cursor() as cur:
                ef = max(int(self.ef_search or 40), limit)
                cur.execute(f"SET LOCAL hnsw.ef_search = {min(ef, 1000)}")
                for row in q:
                    cur.execute(stmt, (row, row, limit, k))
                    hits = []
                    for r in cur.fetchall():
                        m = float(r[2])
                        vec = None
                        if with_vectors:
                            v = as_array(r[4])
                            vec = v / max(float(np.linalg.norm(v)), 1e-12) * np.float32(m)
                        hits.append(StoreHit(str(r[0]), float(r[3]), dict(r[1]), vec, doc_norm=m))
                    out.append(hits)
            return out

        return self._run("search", run)

    def delete(self, ids: Sequence[str]) -> int:
        sql = _sql()
        ids = [str(i) for i in ids]
        if not ids:
            return 0
        stmt = sql.SQL("DELETE FROM {t} WHERE {pk}::text = ANY(%s)").format(**self._cols())

        def run() -> int:
            with self.conn.cursor() as cur:
                cur.execute(stmt, (ids,))
                return int(cur.rowcount)

        return self._run("delete", run)

    def count(self) -> int:
        sql = _sql()
        stmt = sql.SQL("SELECT count(*) FROM {t}").format(**self._cols())
        return int(self._run("count", lambda: self.conn.execute(stmt).fetchone())[0])

    def get(self, ids: Sequence[str]) -> list[StoreRecord | None]:
        sql = _sql()
        ids = [str(i) for i in ids]
        if not ids:
            return []
        stmt = sql.SQL(
            "SELECT t.{pk}::text, t.{vec}, {payload}, {mval} FROM {t} t "
            "WHERE t.{pk}::text = ANY(%s)"
        ).format(payload=self._payload_sql(), mval=self._m_sql(False), **self._cols())
        found = {}
        for r in self._run("get", lambda: self.conn.execute(stmt, (ids,)).fetchall()):
            v = as_array(r[1])
            vec = v / max(float(np.linalg.norm(v)), 1e-12) * np.float32(r[3])
            found[str(r[0])] = StoreRecord(str(r[0]), vec, dict(r[2]))
        return [found.get(i) for i in ids]

    def existing(self, ids: Sequence[str]) -> set[str]:
        sql = _sql()
        ids = [str(i) for i in ids]
        stmt = sql.SQL("SELECT {pk}::text FROM {t} WHERE {pk}::text = ANY(%s)").format(
            **self._cols()
        )
        return {
            str(r[0]) for r in self._run("read", lambda: self.conn.execute(stmt, (ids,)).fetchall())
        }

    def iter_ids(self) -> Iterator[str]:
        for page in self.iter_points():
            for row in page:
                yield row.id

    def iter_points(self, batch: int = 4096) -> Iterator[list[Row]]:
        """Every row (id, stored vector, payload), in primary-key order: what annotate reads."""
        sql = _sql()
        stmt = sql.SQL("SELECT t.{pk}::text, t.{vec}, {payload} FROM {t} t ORDER BY t.{pk}").format(
            payload=self._payload_sql(), **self._cols()
        )
        rows = self._run("read", lambda: self.conn.execute(stmt).fetchall())
        for start in range(0, len(rows), batch):
            yield [Row(str(r[0]), as_array(r[1]), dict(r[2])) for r in rows[start : start + batch]]

    def field_holds_user_data(self, field: str, meta: Mapping[str, Any] | None) -> str | None:
        """Why writing column ``field`` would overwrite data magretrieve did not write (None: safe).

        A column is magretrieve's only when its COMMENT holds magretrieve's record; any other
        existing column (the id, the vector, the text, anything of the user's) is refused.
        """
        if field == self.field and meta:
            return None
        if field in self._cols_now:
            return f"column {field!r}, which magretrieve did not create (no record in its COMMENT)"
        return None

    def begin_annotation(self, field: str, meta: Mapping[str, Any]) -> None:
        """Create the m column if needed and record ``meta`` (with its incomplete marker) on it.

        One transaction: either the column exists and says "incomplete", or nothing changed.
        """
        sql = _sql()
        self.field = field
        text = json.dumps({META_KEY: dict(meta)}, sort_keys=True)

        def run() -> None:
            if field not in self._cols_now:
                self.conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN {} real").format(
                        sql.Identifier(*self._name), sql.Identifier(field)
                    )
                )
            self.conn.execute(
                sql.SQL("COMMENT ON COLUMN {t}.{m} IS {text}").format(
                    text=sql.Literal(text), **self._cols()
                )
            )

        self._run("begin annotation", run)
        if field not in self._cols_now:
            self._cols_now.append(field)

    def unannotated(self) -> int:
        """Rows with no m(d): added after the annotation, scored with m = 1."""
        if self.field not in self._cols_now:
            return self.count()
        stmt = _sql().SQL("SELECT count(*) FROM {t} WHERE {m} IS NULL").format(**self._cols())
        return int(self._run("count", lambda: self.conn.execute(stmt).fetchone())[0])

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["warnings"] = annotation_warnings(
            self._location, out.get("metadata"), self.unannotated()
        )
        return out

    def set_magnitudes(self, points: Sequence[Row], magnitudes: np.ndarray) -> None:
        """``UPDATE`` the m column of these rows in one statement (the vectors stay)."""
        sql = _sql()
        stmt = sql.SQL(
            "UPDATE {t} t SET {m} = v.m FROM unnest(%s::text[], %s::real[]) AS v(id, m) "
            "WHERE t.{pk}::text = v.id"
        ).format(**self._cols())
        ids = [p.id for p in points]
        mags = [float(m) for m in magnitudes]
        self._run("annotate", lambda: self.conn.execute(stmt, (ids, mags)))

    def read_metadata(self) -> dict[str, Any] | None:
        if self.field not in self._cols_now:
            return None
        value = read_comment(self.conn, self._name, self.field).get(META_KEY)
        return dict(value) if isinstance(value, dict) and value else None

    def write_metadata(self, meta: Mapping[str, Any]) -> None:
        sql = _sql()
        text = json.dumps({META_KEY: dict(meta)}, sort_keys=True)
        stmt = sql.SQL("COMMENT ON COLUMN {t}.{m} IS {text}").format(
            text=sql.Literal(text), **self._cols()
        )
        self._run("write metadata", lambda: self.conn.execute(stmt))

    def parameters(self) -> dict[str, Any]:
        indexes = self._run("read", lambda: vector_indexes(self.conn, self._name, self._vec))
        return {
            "operator": "<=> (cosine distance) prefetch, then cos * m",
            "index": ", ".join(f"{m} ({o})" for _, m, o in indexes) or "exact (sequential scan)",
            "prefetch": self.prefetch,
            "field": self.field,
        }

    def close(self) -> None:
        if self._owns:
            self.conn.close()
