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
marker, search ranks by plain cosine (one logged warning).

It is an :class:`~magretrieve.stores.annotation.AnnotatableStore`: it implements the store
primitives (so ids, queries and errors follow the base's rules, as on every store) and the
annotation primitives ``magretrieve annotate`` drives. Seen through the store protocol a row's
vector is ``m(d)·d̂``; a row whose vector is NULL is not a point (``get`` answers None for it).
The SQL helpers it shares with :mod:`~magretrieve.stores.pgvector_store` live in
:mod:`~magretrieve.stores._pgvector_sql`, so neither module imports the other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.stores._pgvector_sql import (
    META_KEY,
    PgConnection,
    _sql,
    as_array,
    column_dimension,
    read_comment,
    table_ref,
    vector_indexes,
)
from magretrieve.stores.annotation import (
    ANNOTATION_KEY,
    DEFAULT_FIELD,
    INCOMPLETE_KEY,
    AnnotatableStore,
    StoredPoint,
    unit,
)
from magretrieve.stores.base import Batch, StoreHit, StoreRecord
from magretrieve.stores.options import IndexOptions

#: The column annotate adds.
DEFAULT_COLUMN = DEFAULT_FIELD
#: Rows read per page (ids, points) when scanning the table.
PAGE = 4096


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
    rows = conn.execute(
        "SELECT attname, col_description(attrelid, attnum) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (table_ref(table),),
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
    try:
        _, vec, cols = table_layout(conn, table_ref(table))
    except StoreError:
        return False
    if annotated_column(conn, table) is not None:
        return True
    return any(o == "vector_cosine_ops" for _, _, o in vector_indexes(conn, table, vec))


def built_by_magretrieve(conn: Any, table: tuple[str, ...], cols: Sequence[str]) -> bool:
    """A table magretrieve created for inner-product search (its layout or its COMMENT)."""
    return set(cols) >= OWN_TABLE_COLUMNS or bool(read_comment(conn, table).get(META_KEY))


class PgCosineStore(PgConnection, AnnotatableStore):
    """An annotated pgvector table searched by ``cos·m(d)`` over a cosine prefetch.

    ``PgCosineStore(conn, table_parts, dimension, prefetch=…, ef_search=…, annotating=…)``.
    """

    kind = "pgvector-cosine"
    thread_safe_search = False  # one connection: the Retriever serializes searches

    def _name_shown(self) -> str:
        return ".".join(self.collection)

    def _configure(self, opts: IndexOptions) -> dict[str, Any]:
        self._name = self.collection
        self._ref = table_ref(self._name)
        return super()._configure(opts)

    def _open_existing(self, dimension: int | None) -> int:
        self._pk, self._vec, cols = table_layout(self.conn, self._ref)
        self._cols_now = list(cols)
        self.field = annotated_column(self.conn, self._name) or DEFAULT_COLUMN
        if self._annotating and built_by_magretrieve(self.conn, self._name, cols):
            raise StoreError(
                f"{self._location}: built by magretrieve for inner-product search (its vectors "
                "keep the magnitude already); annotate is for an existing table ranked by "
                "cosine. Nothing was changed"
            )
        return int(column_dimension(self.conn, self._name, self._vec) or 0)

    def _refusal(self) -> StoreError:
        return StoreError(
            f"{self._location} is ranked by cosine (vector_cosine_ops), which erases document "
            "magnitude; create a new table, or keep this one and rank by cos·m(d) after "
            "`magretrieve annotate --store SPEC ...` writes m(d) into a column"
        )

    # ------------------------------------------------------------------ helpers

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

    def _keyset(self, columns: Any, batch: int) -> Iterator[list[Any]]:
        """Pages of ``SELECT pk, columns`` in primary-key order, each its own short read."""
        sql = _sql()
        first = sql.SQL("SELECT t.{pk}, {c} FROM {t} t ORDER BY t.{pk} LIMIT %s")
        later = sql.SQL("SELECT t.{pk}, {c} FROM {t} t WHERE t.{pk} > %s ORDER BY t.{pk} LIMIT %s")
        first, later = (s.format(c=columns, **self._cols()) for s in (first, later))
        rows = self._tx(lambda: self.conn.execute(first, (batch,)).fetchall())
        while rows:
            yield [r[1:] for r in rows]
            if len(rows) < batch:
                return
            last = rows[-1][0]
            rows = self._tx(lambda last=last: self.conn.execute(later, (last, batch)).fetchall())

    # ------------------------------------------------------------------ store primitives

    def _upsert(self, batch: Batch) -> None:
        raise StoreError(
            f"{self._location}: rows of an existing table are written by your own pipeline; "
            "insert them there, then run `magretrieve annotate` again to give them m(d)"
        )

    def _query(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        sql = _sql()
        limit = max(self.prefetch, k)

        def run() -> list[list[StoreHit]]:
            cosine = self._ranks_by_cosine()
            stmt = sql.SQL(
                "SELECT id, payload, m, cos * m AS score, v FROM ("
                "SELECT t.{pk}::text AS id, {payload} AS payload, {mval} AS m, "
                "1 - (t.{vec} <=> %s) AS cos, t.{vec} AS v FROM {t} t "
                "ORDER BY t.{vec} <=> %s LIMIT %s) c "
                "ORDER BY score DESC LIMIT %s"
            ).format(payload=self._payload_sql(), mval=self._m_sql(cosine), **self._cols())
            out = []
            with self.conn.cursor() as cur:
                ef = min(max(int(self.ef_search or 40), limit), 1000)
                cur.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(ef)))
                for row in q:
                    cur.execute(stmt, (row, row, limit, k))
                    hits = []
                    for r in cur.fetchall():
                        m = float(r[2])
                        vec = unit(as_array(r[4])) * np.float32(m) if with_vectors else None
                        hits.append(StoreHit(str(r[0]), float(r[3]), dict(r[1]), vec, doc_norm=m))
                    out.append(hits)
            return out

        return self._tx(run)

    def _delete(self, ids: list[str]) -> int:
        stmt = _sql().SQL("DELETE FROM {t} WHERE {pk}::text = ANY(%s)").format(**self._cols())
        return self._changed_rows(stmt, (ids,))

    def _count(self) -> int:
        return int(self._first_value(_sql().SQL("SELECT count(*) FROM {t}").format(**self._cols())))

    def _fetch(self, ids: list[str]) -> Iterable[StoreRecord]:
        stmt = (
            _sql()
            .SQL(
                "SELECT t.{pk}::text, t.{vec}, {payload}, {mval} FROM {t} t "
                "WHERE t.{pk}::text = ANY(%s) AND t.{vec} IS NOT NULL"
            )
            .format(payload=self._payload_sql(), mval=self._m_sql(False), **self._cols())
        )
        rows = self._tx(lambda: self.conn.execute(stmt, (ids,)).fetchall())
        return [
            StoreRecord(str(r[0]), unit(as_array(r[1])) * np.float32(r[3]), dict(r[2]))
            for r in rows
        ]

    def _existing(self, ids: list[str]) -> Iterable[str]:
        stmt = _sql().SQL("SELECT {pk}::text FROM {t} WHERE {pk}::text = ANY(%s)")
        stmt = stmt.format(**self._cols())
        return [str(r[0]) for r in self._tx(lambda: self.conn.execute(stmt, (ids,)).fetchall())]

    def _scan_ids(self) -> Iterator[str]:
        text = _sql().SQL("t.{pk}::text").format(**self._cols())
        for page in self._keyset(text, PAGE):
            for (doc_id,) in page:
                yield str(doc_id)

    def _read_meta(self) -> dict[str, Any] | None:
        if self.field not in self._cols_now:
            return None
        value = self._tx(lambda: read_comment(self.conn, self._name, self.field)).get(META_KEY)
        return dict(value) if isinstance(value, dict) and value else None

    def _write_meta(self, meta: dict[str, Any]) -> None:
        if self.field not in self._cols_now:
            raise StoreError(
                f"{self._location}: not annotated yet (no column {self.field!r}); "
                "`magretrieve annotate` records the metadata"
            )
        self._tx(lambda: self._comment(meta))

    def _comment(self, meta: Mapping[str, Any]) -> None:
        sql = _sql()
        text = json.dumps({META_KEY: dict(meta)}, sort_keys=True)
        self.conn.execute(
            sql.SQL("COMMENT ON COLUMN {t}.{m} IS {text}").format(
                text=sql.Literal(text), **self._cols()
            )
        )

    def _describe(self) -> dict[str, Any]:
        indexes = self._tx(lambda: vector_indexes(self.conn, self._name, self._vec))
        return {
            "operator": "<=> (cosine distance) prefetch, then cos * m",
            "index": ", ".join(f"{m} ({o})" for _, m, o in indexes) or "exact (sequential scan)",
            "prefetch": self.prefetch,
            "field": self.field,
        }

    # ------------------------------------------------------------------ annotation primitives

    def _pages(self, batch: int) -> Iterator[list[StoredPoint]]:
        """Every row (id, stored vector, payload), in primary-key order."""
        cols = (
            _sql()
            .SQL("t.{pk}::text, t.{vec}, {payload}")
            .format(payload=self._payload_sql(), **self._cols())
        )
        for page in self._keyset(cols, batch):
            yield [Row(str(r[0]), as_array(r[1]), dict(r[2])) for r in page]

    def _user_data_in(self, field: str, meta: Mapping[str, Any] | None) -> str | None:
        """A column is magretrieve's only when its COMMENT holds magretrieve's record; any
        other existing column (the id, the vector, the text, anything of the user's) is not."""
        if field == self.field and meta:
            return None
        if field in self._cols_now:
            return f"column {field!r}, which magretrieve did not create (no record in its COMMENT)"
        return None

    def _begin_annotation(self, field: str, meta: dict[str, Any]) -> None:
        """Create the m column if needed and record ``meta`` on it, in one transaction:
        either the column exists and says "incomplete", or nothing changed."""
        sql = _sql()
        before = self.field

        def run() -> None:
            if field not in self._cols_now:
                self.conn.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN {} real").format(
                        sql.Identifier(*self._name), sql.Identifier(field)
                    )
                )
            self._comment(meta)

        self.field = field  # the statements name the new column
        try:
            self._tx(run)
        except BaseException:
            self.field = before
            raise
        if field not in self._cols_now:
            self._cols_now.append(field)

    def _set_magnitudes(self, points: Sequence[StoredPoint], magnitudes: list[float]) -> None:
        """``UPDATE`` the m column of these rows in one statement (the vectors stay)."""
        stmt = (
            _sql()
            .SQL(
                "UPDATE {t} t SET {m} = v.m FROM unnest(%s::text[], %s::real[]) AS v(id, m) "
                "WHERE t.{pk}::text = v.id"
            )
            .format(**self._cols())
        )
        ids = [str(p.id) for p in points]
        self._tx(lambda: self.conn.execute(stmt, (ids, magnitudes)))

    def _unannotated(self) -> int:
        if self.field not in self._cols_now:
            return self._count()
        stmt = _sql().SQL("SELECT count(*) FROM {t} WHERE {m} IS NULL").format(**self._cols())
        return int(self._first_value(stmt))
