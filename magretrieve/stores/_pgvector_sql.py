"""The PostgreSQL + pgvector helpers both pgvector stores use, written once.

:class:`~magretrieve.stores.pgvector_store.PgVectorStore` (a table magretrieve builds for the
inner product) and :class:`~magretrieve.stores.pgvector_cosine_store.PgCosineStore` (an
existing table ranked by cosine, annotated with m(d)) read the same catalogs the same way:
which indexes and operator classes a vector column has, its declared dimension, the JSON
record in a table's or column's ``COMMENT``. They live here so that neither store module
imports the other: ``pgvector_store`` dispatches to the cosine store, and the cosine store
needs nothing from ``pgvector_store``.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.extras import require
from magretrieve.stores.base import CollectionStore, one_line

#: Key of a COMMENT's JSON object under which magretrieve records the building model (the
#: table's COMMENT) or the annotation (the m column's COMMENT).
META_KEY = "magretrieve"


def psycopg() -> Any:
    return require("psycopg")


def _sql() -> Any:
    return require("psycopg.sql")


def register_vector(conn: Any) -> None:
    """Make numpy arrays travel as pgvector ``vector`` values on ``conn`` (binary format)."""
    require("pgvector.psycopg").register_vector(conn)


def _quote(part: str) -> str:
    return '"' + part.replace('"', '""') + '"'


def table_ref(table: tuple[str, ...]) -> str:
    """``schema.table`` quoted for a ``%s::regclass`` parameter."""
    return ".".join(_quote(p) for p in table)


def vector_indexes(conn: Any, table: tuple[str, ...], column: str) -> list[tuple[str, str, str]]:
    """(index name, access method, operator class) of each index on ``table.column``."""
    rows = conn.execute(
        """
        SELECT ic.relname, am.amname, opc.opcname
        FROM pg_index ix
        JOIN pg_class ic ON ic.oid = ix.indexrelid
        JOIN pg_am am ON am.oid = ic.relam
        JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = ix.indkey[0]
        JOIN pg_opclass opc ON opc.oid = ix.indclass[0]
        WHERE ix.indrelid = %s::regclass AND a.attname = %s
        """,
        (table_ref(table), column),
    ).fetchall()
    return [(str(r[0]), str(r[1]), str(r[2])) for r in rows]


def column_dimension(conn: Any, table: tuple[str, ...], column: str) -> int | None:
    """The declared dimension of a ``vector(n)`` column (None when the column is missing)."""
    row = conn.execute(
        """
        SELECT format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
        WHERE a.attrelid = %s::regclass AND a.attname = %s AND NOT a.attisdropped
        """,
        (table_ref(table), column),
    ).fetchone()
    if row is None:
        return None
    m = re.fullmatch(r"vector\((\d+)\)", str(row[0]))
    if not m:
        raise StoreError(f"column {column!r} has type {row[0]}, not vector(n)")
    return int(m.group(1))


def read_comment(conn: Any, table: tuple[str, ...], column: str | None = None) -> dict[str, Any]:
    """The JSON object in a table's (or column's) COMMENT; {} when none or not JSON."""
    ref = table_ref(table)
    if column is None:
        row = conn.execute("SELECT obj_description(%s::regclass, 'pg_class')", (ref,)).fetchone()
    else:
        row = conn.execute(
            """
            SELECT col_description(a.attrelid, a.attnum) FROM pg_attribute a
            WHERE a.attrelid = %s::regclass AND a.attname = %s
            """,
            (ref, column),
        ).fetchone()
    try:
        value = json.loads(row[0]) if row and row[0] else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def as_array(value: Any) -> np.ndarray:
    """A pgvector value (``pgvector.Vector`` or a sequence) as a float32 numpy array."""
    if hasattr(value, "to_numpy"):
        value = value.to_numpy()
    return np.asarray(value, dtype=np.float32)


class PgConnection(CollectionStore):
    """A store over one table of one psycopg connection (``PgConnection(conn, table,
    dimension, owns_connection=…, …)``), shared by every thread of the store: each unit of
    work runs in its own transaction (a savepoint inside the caller's) under the connection's
    lock, since psycopg transactions on a shared connection must not interleave (indexing
    reads ``existing`` in a reader thread while the writer adds). The table is opened in one
    transaction, a PostgreSQL error reported in one line."""

    noun = "pgvector table"
    label = "table"

    def __init__(self, *args: Any, owns_connection: bool = False, **kwargs: Any) -> None:
        self._lock = threading.RLock()
        super().__init__(*args, owns_client=owns_connection, **kwargs)

    @property
    def conn(self) -> Any:
        """The psycopg connection."""
        return self.client

    @contextmanager
    def _opening(self) -> Iterator[None]:
        try:
            with self.conn.transaction():
                register_vector(self.conn)
                yield
        except psycopg().Error as exc:
            raise StoreError(f"{self._location}: {type(exc).__name__}: {one_line(exc)}") from None

    def _driver_errors(self) -> tuple[type[BaseException], ...]:
        return (psycopg().Error,)

    def _tx(self, fn: Any) -> Any:
        """Run ``fn()`` in one transaction, holding the connection's lock."""
        with self._lock, self.conn.transaction():
            return fn()

    def _changed_rows(self, stmt: Any, params: Any) -> int:
        """How many rows ``stmt`` (an UPDATE or DELETE) changed, in one transaction."""

        def run() -> int:
            with self.conn.cursor() as cur:
                cur.execute(stmt, params)
                return int(cur.rowcount)

        return int(self._tx(run))

    def _first_value(self, stmt: Any) -> Any:
        """The first column of ``stmt``'s first row, in one transaction."""
        return self._tx(lambda: self.conn.execute(stmt).fetchone())[0]
