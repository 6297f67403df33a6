"""pgvector on a real PostgreSQL server (started by the ``pg_uri`` fixture through ``pgserver``).

What only this backend has: the ``<#>`` operator and its sign, the index operator class check,
the jsonb payload and ``doc_norm`` columns, an existing connection object, one transaction per
batch, and the URI's password kept out of messages. The shared add/search/delete/reload
sequence runs in ``tests/stores/test_stores.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import numpy as np
import psycopg
import pytest

from magretrieve.core.errors import StoreError
from magretrieve.stores import open_store
from magretrieve.stores.pgvector_store import PgVectorStore, redact

pytestmark = pytest.mark.integration

DIM = 16


def data(n: int = 300, nq: int = 20, dim: int = DIM, seed: int = 0):
    rng = np.random.default_rng(seed)
    docs = rng.normal(size=(n, dim)).astype(np.float32)
    docs *= rng.uniform(0.2, 5.0, size=(n, 1)).astype(np.float32)
    queries = rng.normal(size=(nq, dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return [f"doc-{i}" for i in range(n)], docs, queries


def table() -> str:
    return "t_" + uuid.uuid4().hex[:10]


def spec(uri: str, name: str) -> str:
    return f"pgvector:{uri}#{name}"


def exact(queries, docs, ids, k):
    order = np.argsort(-(queries @ docs.T), axis=1, kind="stable")[:, :k]
    return [[ids[j] for j in row] for row in order]


def recall(got, want):
    return float(np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got, want, strict=True)]))


def test_scores_are_inner_products_and_columns_hold_payload_and_norm(pg_uri):
    ids, docs, queries = data()
    name = table()
    with open_store(spec(pg_uri, name), dimension=DIM, index_type="flat") as store:
        store.add(ids, docs, [{"n": i, "tag": "x" * (i % 3)} for i in range(len(ids))])
        hits = store.search(queries, 5)
        for q, row in zip(queries, hits, strict=True):
            rows = [int(h.id.split("-")[1]) for h in row]
            # <#> is the *negative* inner product: the store must hand back +q·d, best first
            np.testing.assert_allclose([h.score for h in row], docs[rows] @ q, atol=1e-4)
            assert [h.score for h in row] == sorted((h.score for h in row), reverse=True)
            assert row[0].payload == {"n": rows[0], "tag": "x" * (rows[0] % 3)}
        assert store.parameters()["index"] == "exact (sequential scan)"
    with psycopg.connect(pg_uri) as conn:
        rec = conn.execute(
            f"SELECT payload, doc_norm FROM {name} WHERE doc_id = 'doc-7'"
        ).fetchone()
    assert rec[0] == {"n": 7, "tag": "x"}
    assert rec[1] == pytest.approx(float(np.linalg.norm(docs[7])), rel=1e-6)


def test_hnsw_ip_index_is_used_and_recalls(pg_uri):
    ids, docs, queries = data(n=3000, nq=40, dim=32, seed=1)
    name = table()
    with open_store(
        spec(pg_uri, name), dimension=32, index_type="hnsw", hnsw_m=16, ef_construction=64
    ) as store:
        store.add(ids, docs)
        store.optimize()
        assert store.parameters()["index"] == "hnsw (vector_ip_ops)"
        plan = store.conn.execute(
            f"EXPLAIN SELECT doc_id FROM {name} ORDER BY embedding <#> %s LIMIT 10",
            (queries[0],),
        ).fetchall()
        assert "Index Scan" in " ".join(r[0] for r in plan)
        got = [[h.id for h in row] for row in store.search(queries, 10, with_vectors=False)]
    assert recall(got, exact(queries, docs, ids, 10)) >= 0.95


def test_hnsw_target_recall_is_tuned_kept_and_met_on_held_out_queries(pg_uri):
    """``target_recall`` raises hnsw.ef_search by measurement after optimize(); the setting and
    the measurement survive a reopen; the recall holds on queries the tuning never saw."""
    ids, docs, _ = data(n=3000, nq=0, dim=32, seed=2)
    rng = np.random.default_rng(9)
    held = rng.normal(size=(100, 32)).astype(np.float32)
    name = table()
    with open_store(
        spec(pg_uri, name), dimension=32, index_type="hnsw", hnsw_m=4, ef_construction=8,
        ef_search=10, target_recall=0.99,
    ) as store:  # fmt: skip
        store.add(ids, docs)
        store.optimize()
        rec = store.parameters()["recall"]
        assert rec["target"] == 0.99 and rec["ef_search"] == store.ef_search > 10, rec
        assert rec["query_kind"].startswith("synthetic")
        got = [[h.id for h in row] for row in store.search(held, 10, with_vectors=False)]
    assert (
        rec["target_met_on_tuning_queries"] is False
        or recall(got, exact(held, docs, ids, 10)) >= 0.985
    )
    with open_store(spec(pg_uri, name)) as again:
        assert again.ef_search == rec["ef_search"] and again.parameters()["recall"] == rec


def hnsw_indexes(uri: str, name: str) -> list[list[str] | None]:
    """The reloptions of every HNSW index on table ``name``."""
    with psycopg.connect(uri) as conn:
        rows = conn.execute(
            "SELECT ic.reloptions FROM pg_index ix JOIN pg_class ic ON ic.oid = ix.indexrelid "
            "JOIN pg_am am ON am.oid = ic.relam WHERE ix.indrelid = %s::regclass "
            "AND am.amname = 'hnsw'",
            (name,),
        ).fetchall()
    return [r[0] for r in rows]


def test_a_bulk_load_builds_hnsw_once_at_optimize_with_the_asked_parameters(pg_uri):
    """Inside ``bulk_load()`` rows are written without an index (pgvector builds HNSW much
    faster over rows already stored than row by row); optimize() builds it with the asked
    m / ef_construction, and searches are exact until then."""
    ids, docs, queries = data(n=1500, nq=20, dim=32, seed=4)
    name = table()
    with open_store(
        spec(pg_uri, name), dimension=32, index_type="hnsw", hnsw_m=8, ef_construction=32
    ) as store:
        with store.bulk_load():
            assert store.bulk_loading
            for lo in range(0, len(ids), 500):
                store.add(ids[lo : lo + 500], docs[lo : lo + 500])
            assert hnsw_indexes(pg_uri, name) == []
            assert store.parameters()["index"] == "exact (sequential scan)"
            assert store.parameters()["index_pending"].startswith("hnsw")
            got = [[h.id for h in row] for row in store.search(queries, 10, with_vectors=False)]
            assert got == exact(queries, docs, ids, 10)
        assert not store.bulk_loading
        store.optimize()
        assert hnsw_indexes(pg_uri, name) == [["m=8", "ef_construction=32"]]
        assert "index_pending" not in store.parameters()
        got = [[h.id for h in row] for row in store.search(queries, 10, with_vectors=False)]
    assert recall(got, exact(queries, docs, ids, 10)) >= 0.95


def test_writes_outside_a_bulk_load_are_indexed_as_they_arrive(pg_uri):
    """Rows added a batch at a time (a LangChain ``add_texts``, ``POST /documents``) never wait
    for an optimize(): the first write builds the index and later rows join it."""
    ids, docs, _ = data(n=400, dim=32, seed=5)
    name = table()
    with open_store(spec(pg_uri, name), dimension=32, index_type="hnsw") as store:
        assert hnsw_indexes(pg_uri, name) == []  # an empty table: nothing to build over yet
        store.add(ids[:200], docs[:200])
        assert hnsw_indexes(pg_uri, name) == [None]  # pgvector's defaults
        store.add(ids[200:], docs[200:])
        assert store.parameters()["index"] == "hnsw (vector_ip_ops)"
        plan = store.conn.execute(
            f"EXPLAIN SELECT doc_id FROM {name} ORDER BY embedding <#> %s LIMIT 10", (docs[0],)
        ).fetchall()
        assert "Index Scan" in " ".join(r[0] for r in plan)


def test_a_bulk_load_stopped_before_optimize_builds_the_recorded_hnsw_on_reopen(pg_uri):
    """A load that stopped midway (no optimize) leaves the table unindexed and says so; the
    store reopened without options builds the HNSW index it was created for, and two writers
    that both find it pending build it once."""
    ids, docs, _ = data(n=300, dim=32, seed=6)
    name = table()
    store = open_store(spec(pg_uri, name), dimension=32, index_type="hnsw", hnsw_m=12)
    with store, store.bulk_load():
        store.add(ids[:100], docs[:100])
    with pytest.raises(StoreError, match=r"--hnsw-m 24 differs from the 12"):
        open_store(spec(pg_uri, name), hnsw_m=24)
    first, second = open_store(spec(pg_uri, name)), open_store(spec(pg_uri, name))
    try:
        assert first.parameters()["index_pending"] and second.parameters()["index_pending"]
        first.add(ids[100:200], docs[100:200])
        second.add(ids[200:], docs[200:])
        assert "index_pending" not in second.parameters()
    finally:
        first.close()
        second.close()
    assert hnsw_indexes(pg_uri, name) == [["m=12"]]


def test_a_build_past_maintenance_work_mem_is_logged(pg_uri, caplog):
    """pgvector's notice that the graph outgrew ``maintenance_work_mem`` (a much slower
    build) reaches the log, naming the store."""
    ids, docs, _ = data(n=6000, dim=64, seed=7)
    name = table()
    with open_store(spec(pg_uri, name), dimension=64, index_type="hnsw") as store:
        with store.bulk_load():
            store.add(ids, docs)
        store.conn.execute("SET maintenance_work_mem = '1MB'")
        with caplog.at_level("WARNING", logger="magretrieve.stores.pgvector_store"):
            store.optimize()
    said = [r.getMessage() for r in caplog.records if "maintenance_work_mem" in r.getMessage()]
    assert said and name in said[0], caplog.text


def test_ivfflat_is_built_after_the_load_and_exact_with_all_lists(pg_uri):
    ids, docs, queries = data(n=1000, nq=20, seed=2)
    with open_store(
        spec(pg_uri, table()), dimension=DIM, index_type="ivfflat", nlist=8, nprobe=8
    ) as store:
        store.add(ids, docs)
        assert store.parameters()["index"] == "exact (sequential scan)"  # not trained yet
        store.optimize()
        assert store.parameters()["index"] == "ivfflat (vector_ip_ops)"
        got = [[h.id for h in row] for row in store.search(queries, 10)]
    assert recall(got, exact(queries, docs, ids, 10)) == 1.0


def test_a_reopen_before_optimize_still_builds_the_recorded_ivfflat_index(pg_uri):
    """The index type and lists given at creation are recorded in the COMMENT: a store
    reopened before optimize() builds the IVFFlat index it was created for, and refuses
    other lists."""
    ids, docs, _ = data(n=200)
    name = table()
    with open_store(spec(pg_uri, name), dimension=DIM, index_type="ivfflat", nlist=4) as store:
        store.add(ids, docs)
    with pytest.raises(StoreError, match=r"--nlist 8 differs from the 4"):
        open_store(spec(pg_uri, name), nlist=8)
    with open_store(spec(pg_uri, name)) as store:
        assert store.parameters()["index"] == "exact (sequential scan)"
        store.optimize()
        assert store.parameters()["index"] == "ivfflat (vector_ip_ops)"
    with psycopg.connect(pg_uri) as conn:
        (options,) = conn.execute(
            "SELECT ic.reloptions FROM pg_index ix JOIN pg_class ic ON ic.oid = ix.indexrelid "
            "JOIN pg_am am ON am.oid = ic.relam WHERE ix.indrelid = %s::regclass "
            "AND am.amname = 'ivfflat'",
            (name,),
        ).fetchone()
    assert options == ["lists=4"]


def test_a_table_without_the_record_is_checked_by_its_index_definition(pg_uri):
    """A table created before magretrieve recorded its build options: an HNSW index's
    parameters come from the index definition; without an index nothing is known and any
    option is accepted."""
    indexed, bare = table(), table()
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        for name in (indexed, bare):
            conn.execute(
                f"CREATE TABLE {name} (doc_id text PRIMARY KEY, embedding vector({DIM}) "
                "NOT NULL, payload jsonb NOT NULL DEFAULT '{}', doc_norm real NOT NULL)"
            )
        conn.execute(f"CREATE INDEX ON {indexed} USING hnsw (embedding vector_ip_ops) WITH (m = 8)")
    with pytest.raises(StoreError, match=r"--hnsw-m 24 differs from the 8"):
        open_store(spec(pg_uri, indexed), hnsw_m=24)
    with pytest.raises(StoreError, match=r"--ef-construction 100 differs from the 64"):
        open_store(spec(pg_uri, indexed), ef_construction=100)  # pgvector's default
    with pytest.raises(StoreError, match=r"ivfflat differs from the hnsw"):
        open_store(spec(pg_uri, indexed), index_type="ivfflat")
    with open_store(spec(pg_uri, indexed), hnsw_m=8, ef_search=50) as store:
        assert store.parameters()["ef_search"] == 50
    with open_store(spec(pg_uri, bare), index_type="hnsw", hnsw_m=24) as store:
        assert store.parameters()["index"] == "exact (sequential scan)"


@pytest.mark.parametrize("opclass", ["vector_cosine_ops", "vector_l2_ops"])
def test_table_indexed_by_another_metric_is_refused(pg_uri, opclass):
    name = table()
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {name} (doc_id text PRIMARY KEY, embedding vector({DIM}) NOT NULL, "
            "payload jsonb NOT NULL DEFAULT '{}', doc_norm real NOT NULL)"
        )
        conn.execute(f"CREATE INDEX {name}_idx ON {name} USING hnsw (embedding {opclass})")
    # cosine: refused with the way out (annotate, the plug-in path); L2: refused outright
    message = (
        "ranked by cosine.*magretrieve annotate"
        if opclass == "vector_cosine_ops"
        else f"{name}_idx.*{opclass}.*inner product"
    )
    with pytest.raises(StoreError, match=message):
        open_store(spec(pg_uri, name), dimension=DIM)


def test_foreign_table_and_dimension_mismatch_refused(pg_uri):
    name = table()
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id bigserial PRIMARY KEY, embedding vector(3))")
    with pytest.raises(StoreError, match="lacks column"):
        open_store(spec(pg_uri, name), dimension=3)
    other = table()
    open_store(spec(pg_uri, other), dimension=DIM).close()
    with pytest.raises(StoreError, match="vector size 16.*dimension 8"):
        open_store(spec(pg_uri, other), dimension=8)
    with pytest.raises(StoreError, match="no table .* here; the store is missing"):
        open_store(spec(pg_uri, table()))


def test_a_comment_magretrieve_did_not_write_is_never_replaced(pg_uri):
    """magretrieve records its model in the table COMMENT: a JSON object keeps its other keys,
    a plain-text COMMENT is someone's and writing the model is refused, even with force."""
    from magretrieve.serving.retriever import Retriever
    from tests.support.fake_encoder import FakeEncoder, corpus

    text_table, json_table = table(), table()
    for name in (text_table, json_table):
        open_store(spec(pg_uri, name), dimension=24).close()
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(f"COMMENT ON TABLE {text_table} IS 'billing team: do not touch'")
        conn.execute(f"""COMMENT ON TABLE {json_table} IS '{{"owner": "billing"}}'""")
    with pytest.raises(StoreError, match="COMMENT is text magretrieve did not write"):
        Retriever(FakeEncoder(), open_store(spec(pg_uri, text_table)), force=True).add_documents(
            corpus(4)
        )
    Retriever(FakeEncoder(), open_store(spec(pg_uri, json_table))).add_documents(corpus(4))
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        comment = "SELECT obj_description(%s::regclass, 'pg_class')"
        assert conn.execute(comment, (text_table,)).fetchone()[0] == "billing team: do not touch"
        assert conn.execute(f"SELECT count(*) FROM {text_table}").fetchone()[0] == 0
        kept = json.loads(conn.execute(comment, (json_table,)).fetchone()[0])
    assert kept["owner"] == "billing" and kept["magretrieve"]["mode"] == "qnorm"
    assert open_store(spec(pg_uri, json_table)).count() == 4


def test_existing_connection_object(pg_uri):
    ids, docs, queries = data(n=50)
    name = table()
    conn = psycopg.connect(pg_uri)  # not autocommit: every batch still commits
    store = open_store(conn, dimension=DIM, collection=name)
    assert isinstance(store, PgVectorStore)
    store.add(ids, docs)
    store.close()  # not ours: the connection stays open
    assert not conn.closed
    conn.close()
    with open_store(spec(pg_uri, name)) as again:
        assert again.count() == 50
        assert again.search(queries[:1], 1)[0][0].id == exact(queries[:1], docs, ids, 1)[0][0]


def test_a_failing_batch_leaves_the_table_unchanged(pg_uri):
    ids, docs, _ = data(n=20)
    name = table()
    with open_store(spec(pg_uri, name), dimension=DIM) as store:
        store.add(ids[:10], docs[:10])
        # a constraint the server checks row by row fails the *last* row of the batch
        store.conn.execute(f"ALTER TABLE {name} ADD CONSTRAINT no19 CHECK (doc_id <> 'doc-19')")
        with pytest.raises(StoreError, match="upsert failed .CheckViolation"):
            store.add(ids[10:], docs[10:], [{"ok": i} for i in range(10)])
        assert store.count() == 10
        assert store.existing(ids[10:]) == set()
        # NUL (which jsonb cannot hold) is refused before the server sees the batch
        with pytest.raises(StoreError, match="NUL character"):
            store.add(ids[10:12], docs[10:12], [{"ok": 1}, {"bad": "a\x00b"}])
        assert store.count() == 10


def test_metadata_and_rows_survive_a_new_process(pg_uri):
    ids, docs, queries = data(n=40)
    name = table()
    with open_store(spec(pg_uri, name), dimension=DIM) as store:
        store.add(ids, docs)
        store.write_metadata({"model_fingerprint": "abc", "mode": "qnorm"})
    code = (
        "import sys, json\n"
        "from magretrieve.stores import open_store\n"
        "s = open_store(sys.argv[1])\n"
        "print(json.dumps([s.count(), s.read_metadata()]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, spec(pg_uri, name)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [40, {"model_fingerprint": "abc", "mode": "qnorm"}]


def test_password_is_redacted_and_bad_server_is_one_line():
    assert redact("postgresql://u:secret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert redact("postgresql://u@h/db") == "postgresql://u@h/db"
    with pytest.raises(StoreError) as err:
        open_store("pgvector:postgresql://u:secret@127.0.0.1:1/db?connect_timeout=2#t", dimension=4)
    assert "secret" not in str(err.value)
    assert "cannot connect" in str(err.value)


def test_spec_without_table_is_refused():
    with pytest.raises(StoreError, match="#TABLE"):
        open_store("pgvector:postgresql://u@h/db", dimension=4)
