"""The plug-in path: ``magretrieve annotate`` on an existing Cosine Qdrant collection, then
ranking by cos·m(d) inside Qdrant (cosine prefetch + FormulaQuery) in embedded mode.

The collection is made the way another pipeline would: integer point ids, no ``doc_id``,
unit vectors under Distance.COSINE. Results are compared with exact cos·m(d) in numpy.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from click.testing import CliRunner
from qdrant_client import QdrantClient, models

from magretrieve.cli import main
from magretrieve.core.errors import StoreError
from magretrieve.priors import HubPrior
from magretrieve.priors.annotate import annotate_store
from magretrieve.priors.hub import hub_scores
from magretrieve.stores import open_store
from magretrieve.stores.qdrant_cosine_store import QdrantCosineStore

DIM = 16
N = 400


def cosine_collection(folder, n: int = N, seed: int = 0) -> tuple[str, np.ndarray, np.ndarray]:
    """A Cosine collection written by 'someone else' in qdrant-local:folder/theirs."""
    rng = np.random.default_rng(seed)
    # clustered directions, so hubs (and so the prior) differ from document to document
    centers = rng.normal(size=(8, DIM))
    docs = centers[rng.integers(0, 8, n)] + 0.7 * rng.normal(size=(n, DIM))
    units = (docs / np.linalg.norm(docs, axis=1, keepdims=True)).astype(np.float32)
    queries = rng.normal(size=(20, DIM)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    client = QdrantClient(path=str(folder))
    client.create_collection(
        "theirs", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE)
    )
    client.upsert(
        "theirs",
        points=[
            models.PointStruct(id=i, vector=(units[i] * 3.0).tolist(), payload={"title": f"t{i}"})
            for i in range(n)
        ],
    )
    client.close()
    return f"qdrant-local:{folder}/theirs", units, queries


def expected_prior(units: np.ndarray, beta: float, k: int = 10) -> np.ndarray:
    hubs = hub_scores(units, k)
    return np.exp(-beta * (hubs - hubs.mean()) / hubs.std())


def exact_rank(queries, units, m, k):
    scores = (queries @ units.T) * m[None, :]
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[str(j) for j in row] for row in order], np.take_along_axis(scores, order, axis=1)


def test_unannotated_cosine_collection_is_refused_with_the_way_out(tmp_path):
    spec, _, _ = cosine_collection(tmp_path / "q")
    with pytest.raises(StoreError, match="uses distance Cosine.*magretrieve annotate"):
        open_store(spec)


def test_annotate_writes_m_and_search_ranks_by_cos_times_m(tmp_path):
    spec, units, queries = cosine_collection(tmp_path / "q")
    report = annotate_store(spec, prior=HubPrior(0.8, 10), progress=False)
    want_m = expected_prior(units, 0.8)
    assert report.count == N and report.kind == "hub" and report.prefetch == 100
    assert report.magnitude_min == pytest.approx(want_m.min(), rel=1e-5)

    client = QdrantClient(path=str(tmp_path / "q"))
    points, _ = client.scroll("theirs", limit=N, with_payload=True, with_vectors=True)
    client.close()
    by_id = {int(p.id): p for p in points}
    np.testing.assert_allclose(
        [by_id[i].payload["magretrieve_m"] for i in range(N)], want_m, rtol=1e-5
    )
    # vectors untouched (as written: 3·d̂), user payload kept
    np.testing.assert_allclose([by_id[i].vector for i in range(N)], units * 3.0, atol=1e-5)
    assert by_id[5].payload["title"] == "t5"

    # prefetch covering the collection: exactly the cos·m ranking
    with open_store(spec, prefetch=N) as store:
        assert isinstance(store, QdrantCosineStore)
        want_ids, want_scores = exact_rank(queries, units, want_m, 10)
        hits = store.search(queries, 10)
        assert [[h.id for h in row] for row in hits] == want_ids
        np.testing.assert_allclose([[h.score for h in row] for row in hits], want_scores, atol=1e-5)
        top = hits[0][0]
        assert top.doc_norm == pytest.approx(want_m[int(top.id)], rel=1e-5)
        # the protocol's view: stored vector = m(d)·d̂, so q·v is the score
        np.testing.assert_allclose(top.vector, units[int(top.id)] * want_m[int(top.id)], rtol=1e-5)
        assert top.payload == {"title": f"t{top.id}"}
        rec = store.get([top.id, "nope"])
        assert rec[1] is None
        np.testing.assert_allclose(rec[0].vector, top.vector, rtol=1e-6)
    # the recorded default prefetch, and a small one: only cosine candidates can come back
    with open_store(spec, prefetch=15) as store:
        cos_top = np.argsort(-(queries @ units.T), axis=1)[:, :15]
        for row, allowed in zip(store.search(queries, 10), cos_top, strict=True):
            assert {h.id for h in row} <= {str(j) for j in allowed}


def test_retriever_adds_and_explains_on_an_annotated_collection(tmp_path):
    from magretrieve.serving.retriever import Retriever
    from tests.support.fake_encoder import FakeEncoder

    spec, units, _ = cosine_collection(tmp_path / "q", n=120)
    annotate_store(spec, prior=HubPrior(0.5, 5), progress=False)
    encoder = FakeEncoder(mode="cosine", dim=DIM)
    with Retriever(encoder, open_store(spec, prefetch=500)) as r:
        r.add_documents([{"_id": "new", "title": "statins", "text": "statins lower cholesterol"}])
        stored = r.store.get(["new"])[0]
        m_new = float(np.linalg.norm(stored.vector))
        assert m_new > 0 and abs(m_new - 1.0) > 1e-4  # the recorded prior gave it a magnitude
        hits = r.search("statins lower cholesterol", k=5)
        assert hits[0].id == "new"
        q = encoder.encode_queries(["statins lower cholesterol"])[0]
        d = encoder.encode_documents(["statins statins lower cholesterol"])[0]
        assert hits[0].doc_norm == pytest.approx(m_new, rel=1e-5)
        assert hits[0].score == pytest.approx(hits[0].cosine * m_new, rel=1e-4)
        assert hits[0].cosine <= 1.0 + 1e-6 and q.shape == d.shape
        assert r.delete(["new", "0"]) == 2
        assert r.store.count() == 119


def test_cli_annotate_and_its_errors(tmp_path):
    spec, _, _ = cosine_collection(tmp_path / "q", n=50)
    runner = CliRunner()
    out = runner.invoke(
        main, ["annotate", "--store", spec, "--corpus-prior", "0.5", "--prefetch", "40", "--json"]
    )
    assert out.exit_code == 0, out.output
    assert '"count": 50' in out.output and '"prefetch": 40' in out.output
    with open_store(spec) as store:
        assert store.prefetch == 40
    out = runner.invoke(main, ["annotate", "--store", spec, "--corpus-prior", "0.5"])  # again
    assert out.exit_code == 0, out.output
    lines = out.output.split("\n")
    at = next(n for n, line in enumerate(lines) if "annotated 50 points of " in line)
    assert lines[at].endswith("payload field 'magretrieve_m', prefetch 100")
    assert lines[at + 1].split() == ["magnitude", "min", "mean", "max"]
    # a Dot collection written by magretrieve: nothing to annotate
    dot = f"qdrant-local:{tmp_path / 'dot'}/ours"
    open_store(dot, dimension=DIM).close()
    out = runner.invoke(main, ["annotate", "--store", dot, "--corpus-prior", "0.5"])
    assert out.exit_code == 1 and "not (a Dot collection" in out.output
    out = runner.invoke(
        main, ["annotate", "--store", f"faiss:{tmp_path / 'f'}", "--corpus-prior", "0.5"]
    )
    assert out.exit_code == 1 and "magretrieve rescale" in out.output
    out = runner.invoke(main, ["annotate", "--store", spec])
    assert out.exit_code == 1 and "exactly one of" in out.output
    assert "Traceback" not in out.output


# ----------------------------------------------------------------------------- pgvector


def cosine_table(pg_uri: str, units: np.ndarray) -> str:
    """A table as a typical pgvector pipeline makes it: bigserial id, content, HNSW cosine."""
    import psycopg
    from pgvector.psycopg import register_vector

    name = "items_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(
            f"CREATE TABLE {name} (id bigserial PRIMARY KEY, content text, embedding vector({DIM}))"
        )
        conn.execute(f"CREATE INDEX ON {name} USING hnsw (embedding vector_cosine_ops)")
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {name} (id, content, embedding) VALUES (%s, %s, %s)",
                [(i, f"t{i}", units[i] * (1 + i % 3)) for i in range(len(units))],
            )
    return f"pgvector:{pg_uri}#{name}"


@pytest.mark.integration
def test_pgvector_cosine_table_annotated_ranks_like_qdrant(tmp_path, pg_uri):
    qspec, units, queries = cosine_collection(tmp_path / "q")
    pspec = cosine_table(pg_uri, units)
    with pytest.raises(StoreError, match="ranked by cosine.*magretrieve annotate"):
        open_store(pspec)
    prior = HubPrior(0.8, 10)
    report = annotate_store(pspec, prior=prior, progress=False)
    annotate_store(qspec, prior=prior, progress=False)
    assert report.count == N
    want_m = expected_prior(units, 0.8)
    want_ids, want_scores = exact_rank(queries, units, want_m, 10)
    with open_store(pspec, prefetch=N) as pg, open_store(qspec, prefetch=N) as qd:
        assert pg.parameters()["index"] == "hnsw (vector_cosine_ops)"
        got = pg.search(queries, 10)
        # hnsw.ef_search follows the prefetch, so the cosine index returns all N candidates
        assert [[h.id for h in row] for row in got] == want_ids
        np.testing.assert_allclose([[h.score for h in row] for row in got], want_scores, atol=1e-4)
        assert [[h.id for h in row] for row in qd.search(queries, 10)] == want_ids
        assert got[0][0].payload == {"content": f"t{got[0][0].id}"}
        assert got[0][0].doc_norm == pytest.approx(want_m[int(got[0][0].id)], rel=1e-5)
        rec = pg.get([got[0][0].id])[0]
        np.testing.assert_allclose(rec.vector, got[0][0].vector, rtol=1e-5)
        with pytest.raises(StoreError, match="your own pipeline"):
            pg.add(["x"], np.ones((1, DIM), dtype=np.float32))
        assert pg.delete([got[0][0].id, "999999"]) == 1
        assert pg.count() == N - 1
    # a magretrieve table (inner product already) is not annotated: known by its COMMENT
    # while empty (no index yet), by its vector_ip_ops index once rows arrived
    own = f"pgvector:{pg_uri}#own_{uuid.uuid4().hex[:8]}"
    open_store(own, dimension=DIM).close()
    with pytest.raises(StoreError, match="built by magretrieve for inner-product search"):
        annotate_store(own, prior=prior, progress=False)
    with open_store(own) as store:
        store.add(["a"], np.ones((1, DIM), dtype=np.float32))
    with pytest.raises(StoreError, match="searched by inner product already"):
        annotate_store(own, prior=prior, progress=False)


# ----------------------------------------------------------------------------- --norms-from


@pytest.fixture(scope="module")
def exports(tiny_model_dir, tmp_path_factory):
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("exports")
    export_model(tiny_model_dir, out / "qnorm", mode="qnorm")
    export_model(tiny_model_dir, out / "cosine", mode="cosine")
    return out


def test_norms_from_a_magnitude_keeping_export(tmp_path, exports):
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    texts = [f"statins trial {i} " + "word " * (i % 7) for i in range(30)]
    cosine = OnnxEncoder.load(exports / "cosine")
    units = np.asarray(cosine.encode_documents(texts), dtype=np.float32)
    client = QdrantClient(path=str(tmp_path / "q"))
    client.create_collection(
        "docs",
        vectors_config=models.VectorParams(size=units.shape[1], distance=models.Distance.COSINE),
    )
    client.upsert(
        "docs",
        points=[
            models.PointStruct(id=i, vector=units[i].tolist(), payload={"text": texts[i]})
            for i in range(30)
        ],
    )
    client.close()
    spec = f"qdrant-local:{tmp_path / 'q'}/docs"
    out = CliRunner().invoke(
        main, ["annotate", "--store", spec, "--norms-from", str(exports / "qnorm"), "--json"]
    )
    assert out.exit_code == 0, out.output
    assert '"kind": "export_norm"' in out.output
    want = np.linalg.norm(OnnxEncoder.load(exports / "qnorm").encode_documents(texts), axis=1)
    with open_store(spec, prefetch=30) as store:
        got = {
            r.id: float(np.linalg.norm(r.vector)) for r in store.get([str(i) for i in range(30)])
        }
        np.testing.assert_allclose([got[str(i)] for i in range(30)], want, rtol=1e-4)
        q = units[3:4]
        hits = store.search(q, 5)[0]
        scores = (units @ q[0]) * want
        assert [h.id for h in hits] == [str(j) for j in np.argsort(-scores, kind="stable")[:5]]
    # a cosine export has unit norms: refused, one line
    out = CliRunner().invoke(
        main, ["annotate", "--store", spec, "--norms-from", str(exports / "cosine")]
    )
    assert out.exit_code == 1 and "magnitude-keeping export" in out.output


# ----------------------------------------------------------------------------- reliability
# Every rule below is checked on both backends annotate supports: an embedded Qdrant Cosine
# collection and a pgvector table with an HNSW cosine index (the session's PostgreSQL).

BACKENDS = ("qdrant", "pgvector")
#: A field each backend's "other pipeline" filled with user data.
USER_FIELD = {"qdrant": "title", "pgvector": "content"}


def backend_store(backend: str, tmp_path, request, n: int = 120):
    spec, units, queries = cosine_collection(tmp_path / "q", n=n)
    if backend == "pgvector":
        spec = cosine_table(request.getfixturevalue("pg_uri"), units)
    return spec, units, queries


def raw_state(backend: str, spec: str, tmp_path) -> object:
    """Everything stored, read around magretrieve: payloads/rows, columns, comments, metadata."""
    if backend == "qdrant":
        client = QdrantClient(path=str(tmp_path / "q"))
        try:
            points, _ = client.scroll("theirs", limit=10_000, with_payload=True, with_vectors=True)
            meta = client.get_collection("theirs").config.metadata
            return sorted((int(p.id), p.payload, list(p.vector)) for p in points), meta
        finally:
            client.close()
    import psycopg

    uri, table = spec[len("pgvector:") :].rsplit("#", 1)
    with psycopg.connect(uri, autocommit=True) as conn:
        cols = conn.execute(
            "SELECT attname, col_description(attrelid, attnum) FROM pg_attribute WHERE attrelid ="
            " %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
            (table,),
        ).fetchall()
        rows = conn.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
    return cols, [tuple(str(v) for v in r) for r in rows]


def insert_foreign_point(backend: str, spec: str, tmp_path, point_id: int, vector) -> None:
    """What another pipeline does after the annotation: a new point with no m(d)."""
    if backend == "qdrant":
        client = QdrantClient(path=str(tmp_path / "q"))
        client.upsert(
            "theirs",
            points=[models.PointStruct(id=point_id, vector=list(map(float, vector)), payload={})],
        )
        client.close()
        return
    import psycopg
    from pgvector.psycopg import register_vector

    uri, table = spec[len("pgvector:") :].rsplit("#", 1)
    with psycopg.connect(uri, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(
            f"INSERT INTO {table} (id, content, embedding) VALUES (%s, 'new', %s)",
            (point_id, np.asarray(vector, np.float32)),
        )


def stored_m(spec: str, n: int) -> np.ndarray:
    with open_store(spec, prefetch=n) as store:
        return np.array(
            [float(np.linalg.norm(r.vector)) for r in store.get([str(i) for i in range(n)])]
        )


def one_line_failure(out) -> None:
    assert out.exit_code == 1, out.output
    assert "Traceback" not in out.output and len(out.output.strip().splitlines()) == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_field_holding_user_data_is_refused_and_nothing_changes(backend, tmp_path, request):
    spec, units, _ = backend_store(backend, tmp_path, request)
    runner = CliRunner()
    if backend == "qdrant":  # a key holding [] on one point is the user's too
        client = QdrantClient(path=str(tmp_path / "q"))
        client.set_payload("theirs", payload={"tags": []}, points=[3])
        client.close()
        for field in ("tags",):
            out = runner.invoke(
                main, ["annotate", "--store", spec, "--corpus-prior", "0.5", "--field", field]
            )
            one_line_failure(out)
            assert f"payload key {field!r} of 1 point(s)" in out.output
    before = raw_state(backend, spec, tmp_path)
    for field, needle in [
        (USER_FIELD[backend], "would overwrite"),  # the user's text
        ("id", "would overwrite" if backend == "pgvector" else None),  # the primary key column
        ("doc_norm", "reserved"),
        ("a.b", "not a plain name"),
        ("x" * 64, "not a plain name"),
    ]:
        out = runner.invoke(
            main, ["annotate", "--store", spec, "--corpus-prior", "0.5", "--field", field]
        )
        if needle is None:  # Qdrant points have no payload key "id": a fine field there
            assert out.exit_code == 0, out.output
            before = raw_state(backend, spec, tmp_path)
            continue
        one_line_failure(out)
        assert needle in out.output and repr(field)[:20] in out.output
        assert raw_state(backend, spec, tmp_path) == before  # nothing stored changed
    if backend == "qdrant":  # annotated into "id": another field is refused, no --field reuses it
        out = runner.invoke(
            main, ["annotate", "--store", spec, "--corpus-prior", "0.5", "--field", "m2"]
        )
        one_line_failure(out)
        assert "annotated into field 'id'" in out.output and "--field id" in out.output
        out = runner.invoke(main, ["annotate", "--store", spec, "--corpus-prior", "0.5", "--json"])
        assert out.exit_code == 0 and '"field": "id"' in out.output, out.output
        return
    out = runner.invoke(main, ["annotate", "--store", spec, "--corpus-prior", "0.5", "--json"])
    assert out.exit_code == 0, out.output
    assert '"field": "magretrieve_m"' in out.output
    # the user's column still holds its text
    with open_store(spec, prefetch=120) as store:
        assert store.get(["7"])[0].payload == {"content": "t7"}


@pytest.mark.parametrize("backend", BACKENDS)
def test_stores_magretrieve_built_for_inner_product_are_refused(backend, tmp_path, request):
    prior = HubPrior(0.5)
    if backend == "qdrant":
        specs = [f"qdrant-local:{tmp_path / 'dot'}/ours"]
        kwargs = [{}]
    else:
        pg = request.getfixturevalue("pg_uri")
        specs = [f"pgvector:{pg}#own_{uuid.uuid4().hex[:8]}" for _ in range(2)]
        kwargs = [{"index_type": "flat"}, {"index_type": "hnsw"}]  # flat: no index to tell it
    rng = np.random.default_rng(0)
    for spec, kw in zip(specs, kwargs, strict=True):
        with open_store(spec, dimension=DIM, **kw) as store:
            store.add(["a", "b"], rng.normal(size=(2, DIM)).astype(np.float32) * 3)
            store.persist()
            before = store.get(["a", "b"])
        with pytest.raises(StoreError, match="inner.product|not \\(a Dot collection"):
            annotate_store(spec, prior=prior, progress=False)
        with open_store(spec) as store:  # still a magretrieve store, same vectors, no new field
            after = store.get(["a", "b"])
            assert store.kind in ("qdrant", "pgvector")
            for x, y in zip(before, after, strict=True):
                np.testing.assert_array_equal(x.vector, y.vector)
                assert x.payload == y.payload


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_killed_reannotate_is_marked_incomplete_searches_cosine_and_resumes(
    backend, tmp_path, request, monkeypatch, caplog
):
    from types import SimpleNamespace

    from magretrieve.serving.retriever import check_compatible
    from magretrieve.stores.pgvector_cosine_store import PgCosineStore

    n = 300
    spec, units, queries = backend_store(backend, tmp_path, request, n=n)
    annotate_store(spec, prior=HubPrior(0.5), progress=False)
    old_m = stored_m(spec, n)
    cls = QdrantCosineStore if backend == "qdrant" else PgCosineStore
    original = cls.set_magnitudes
    calls = []

    def crashing(self, points, mags):
        calls.append(len(points))
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated SIGKILL")
        return original(self, points, mags)

    monkeypatch.setattr(cls, "set_magnitudes", crashing)
    with pytest.raises(KeyboardInterrupt):
        annotate_store(spec, prior=HubPrior(1.5), batch_size=128, progress=False)
    monkeypatch.setattr(cls, "set_magnitudes", original)
    mixed = stored_m(spec, n)
    assert (mixed != old_m).sum() >= 128 and (mixed == old_m).sum() >= 100  # half old, half new

    model = SimpleNamespace(
        dimension=DIM, index_metric="inner_product", document_contract="magnitude_keeping",
        mode="cosine", gamma_q=1.0, gamma_d=1.0, model_fingerprint="x", folder="",
    )  # fmt: skip
    with open_store(spec, prefetch=n) as store:
        meta = store.read_metadata()
        assert meta["incomplete"]["operation"] == "annotate"
        with pytest.raises(StoreError, match="incomplete: a `magretrieve annotate`"):
            check_compatible(model, store)  # Retriever.load refuses it
        caplog.clear()
        with caplog.at_level("WARNING"):
            hits = store.search(queries[:5], 10)
            store.search(queries[:5], 10)
        warned = [r for r in caplog.records if "marked incomplete" in r.getMessage()]
        assert len(warned) == 1  # one line, once
        cos_order = np.argsort(-(queries[:5] @ units.T), axis=1)[:, :10]
        assert [[h.id for h in row] for row in hits] == [[str(j) for j in r] for r in cos_order]
        assert all(h.doc_norm == 1.0 for row in hits for h in row)  # plain cosine, no mixed m
        assert any("marked incomplete" in w for w in store.describe()["warnings"])

    # the same command again finishes it: equal to an uninterrupted annotation
    annotate_store(spec, prior=HubPrior(1.5), batch_size=128, progress=False)
    np.testing.assert_allclose(stored_m(spec, n), expected_prior(units, 1.5), rtol=1e-5)
    with open_store(spec, prefetch=n) as store:
        assert "incomplete" not in store.read_metadata()
        check_compatible(model, store)
        assert store.describe()["warnings"] == []
        want_ids, _ = exact_rank(queries, units, expected_prior(units, 1.5), 10)
        assert [[h.id for h in row] for row in store.search(queries, 10)] == want_ids


@pytest.mark.parametrize("backend", BACKENDS)
def test_points_added_after_annotation_are_scored_with_m_1_and_reported(backend, tmp_path, request):
    spec, units, _ = backend_store(backend, tmp_path, request, n=100)
    annotate_store(spec, prior=HubPrior(0.5), progress=False)
    rng = np.random.default_rng(9)
    new = units[0] + 0.01 * rng.normal(size=DIM).astype(np.float32)
    new /= np.linalg.norm(new)
    insert_foreign_point(backend, spec, tmp_path, 100, new * 2.0)
    with open_store(spec, prefetch=101) as store:
        hits = store.search(new[None, :], 3)[0]
        assert hits[0].id == "100"  # not dropped: its own vector is the nearest
        assert hits[0].doc_norm == 1.0
        assert hits[0].score == pytest.approx(1.0, abs=1e-5)  # cos 1 · m 1
        (warning,) = store.describe()["warnings"]
        assert "1 point(s) added after the annotation" in warning and "m = 1" in warning
        assert float(np.linalg.norm(store.get(["100"])[0].vector)) == pytest.approx(1.0)
    annotate_store(spec, prior=HubPrior(0.5), progress=False)  # gives it its own m
    with open_store(spec, prefetch=101) as store:
        assert store.describe()["warnings"] == []
        assert store.search(new[None, :], 1)[0][0].doc_norm != pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_prior_files_are_one_line_naming_file_and_field(backend, tmp_path, request):
    import json

    spec, units, _ = backend_store(backend, tmp_path, request, n=60)
    before = raw_state(backend, spec, tmp_path)
    hub = {"kind": "document_prior", "method": "hub", "beta": 0.5, "k": 10}
    cases = {
        "k-text.json": ({**hub, "k": "ten"}, "prior key 'k' is malformed"),
        "k-zero.json": ({**hub, "k": 0}, "'k' must be at least 1"),
        "beta-text.json": ({**hub, "beta": "0.5"}, "prior key 'beta' is malformed"),
        "beta-bool.json": ({**hub, "beta": True}, "prior key 'beta' is malformed"),
        "std.json": ({**hub, "std": -1.0}, "'std' must be positive"),
        "no-beta.json": ({"kind": "document_prior", "method": "hub"}, "lacks 'beta'"),
        "method.json": ({**hub, "method": "magic"}, "unknown prior method 'magic'"),
        "list.json": ([1, 2], "a prior is a JSON object"),
        "old-kind.json": ({"kind": "corpus_prior", "beta": 0.5}, "not a document prior"),
        "part.json": (
            {"kind": "document_prior", "method": "hub+none", "parts": [{**hub, "k": 1.5}]},
            "part 1: prior key 'k' is malformed",
        ),
        "csls.json": (
            {"kind": "document_prior", "method": "csls", "alpha": 0.5, "k": 10, "bank": "corpus"},
            "adds an offset b(d)",
        ),  # fmt: skip
    }
    runner = CliRunner()
    for name, (data, needle) in cases.items():
        path = tmp_path / name
        path.write_text(json.dumps(data))
        out = runner.invoke(main, ["annotate", "--store", spec, "--prior-file", str(path)])
        one_line_failure(out)
        assert needle in out.output and str(path) in out.output, (name, out.output)
    (tmp_path / "torn.json").write_text('{"kind": "document_prior", "method": "hu')
    out = runner.invoke(
        main, ["annotate", "--store", spec, "--prior-file", str(tmp_path / "torn.json")]
    )
    one_line_failure(out)
    assert "not valid JSON" in out.output
    assert raw_state(backend, spec, tmp_path) == before


def test_prior_files_of_another_dimension_are_refused_before_anything_is_written(tmp_path):
    """A query bank or mean vector of another model's dimension: one line naming file and field."""
    import base64
    import json

    from magretrieve.stores import open_store as open_any

    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(20, DIM)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    src = f"faiss:{tmp_path / 'src'}"
    with open_any(src, dimension=DIM) as store:
        store.add([f"d{i}" for i in range(20)], vecs)
        store.write_metadata({"mode": "cosine", "gamma_q": 1.0, "gamma_d": 1.0})
        store.persist()
    bank = np.ones((3, DIM + 4), "<f4")
    queries = {"shape": [3, DIM + 4], "float32_base64": base64.b64encode(bank.tobytes()).decode()}
    cases = {
        "csls.json": {"method": "csls", "alpha": 0.5, "k": 2, "queries": queries},
        "isoftmax.json": {"method": "inverted-softmax", "beta": 5.0, "alpha": 1.0,
                          "queries": queries},
        "center.json": {"method": "center", "strength": 1.0, "mean": [0.1] * (DIM + 1)},
        "bank-shape.json": {"method": "csls", "alpha": 0.5, "k": 2,
                            "queries": {**queries, "shape": [5, DIM + 4]}},
    }  # fmt: skip
    runner = CliRunner()
    for i, (name, data) in enumerate(cases.items()):
        path = tmp_path / name
        path.write_text(json.dumps({"kind": "document_prior", **data}))
        target = tmp_path / f"t{i}"
        out = runner.invoke(
            main, ["rescale", "--source", src, "--target", f"faiss:{target}", "--prior-file",
                   str(path)],
        )  # fmt: skip
        one_line_failure(out)
        assert str(path) in out.output and ("'queries'" in out.output or "'mean'" in out.output)
        assert not target.exists() or not any(target.iterdir())  # nothing written


def test_fit_prior_file_is_read_by_annotate_and_rescale(tiny_model_dir, tiny_beir_dir, tmp_path):
    """One prior system: what `fit-prior --out F` writes, `annotate --prior-file F` (on an
    existing Cosine collection) and `rescale --prior-file F` both apply, with the same m(d)."""
    import json

    from magretrieve.priors import read_prior_file
    from magretrieve.priors.rescale import read_all
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    prior_file = tmp_path / "prior.json"
    runner = CliRunner()
    out = runner.invoke(
        main,
        ["fit-prior", "--model", str(tiny_model_dir), "--data", f"{tiny_beir_dir}:train",
         "--method", "hub", "--betas", "0.2,0.5", "--k", "3", "--out", str(prior_file)],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    prior = read_prior_file(prior_file)
    assert prior.method in ("hub", "none")
    beta = getattr(prior, "beta", 0.0)
    # documents encoded with the same cosine model, in a Cosine collection "someone" made
    from magretrieve.export import export_model

    export = tmp_path / "cosine"
    export_model(tiny_model_dir, export, mode="cosine")
    texts = [f"statins trial {i} " + "word " * (i % 7) for i in range(30)]
    units = np.asarray(OnnxEncoder.load(export).encode_documents(texts), np.float32)
    units /= np.linalg.norm(units, axis=1, keepdims=True)
    client = QdrantClient(path=str(tmp_path / "q"))
    client.create_collection(
        "docs", vectors_config=models.VectorParams(size=units.shape[1], distance="Cosine")
    )
    client.upsert(
        "docs",
        points=[
            models.PointStruct(id=i, vector=units[i].tolist(), payload={"text": texts[i]})
            for i in range(30)
        ],
    )
    client.close()
    spec = f"qdrant-local:{tmp_path / 'q'}/docs"
    out = runner.invoke(main, ["annotate", "--store", spec, "--prior-file", str(prior_file)])
    assert out.exit_code == 0, out.output
    h = hub_scores(units, 3)
    want = np.exp(-beta * (h - h.mean()) / h.std())
    got = stored_m(spec, 30)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    # the same file rescales a cosine-built FAISS store to the same magnitudes
    src = f"faiss:{tmp_path / 'src'}"
    with open_store(src, dimension=units.shape[1]) as store:
        store.add([str(i) for i in range(30)], units, [{"text": t} for t in texts])
        store.write_metadata({"mode": "cosine", "gamma_q": 1.0, "gamma_d": 1.0})
        store.persist()
    out = runner.invoke(
        main, ["rescale", "--source", src, "--target", f"faiss:{tmp_path / 'dst'}",
               "--prior-file", str(prior_file), "--json"],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    assert json.loads(out.output[out.output.index("{") :])["kind"] == prior.method
    with open_store(f"faiss:{tmp_path / 'dst'}") as dst:
        ids, vecs, _ = read_all(dst)
    norms = dict(zip(ids, np.linalg.norm(vecs, axis=1), strict=True))
    np.testing.assert_allclose([norms[str(i)] for i in range(30)], got, rtol=1e-4)


@pytest.mark.integration
def test_a_missing_store_is_refused_and_nothing_is_created(tmp_path, pg_uri):
    runner = CliRunner()
    missing = tmp_path / "typo"
    for spec, needle in [
        (f"qdrant-local:{missing}/docs", "no embedded Qdrant data"),
        ("qdrant-memory:docs", "no such collection to annotate"),
        (f"pgvector:{pg_uri}#no_such_table", "no such table to annotate"),
    ]:
        out = runner.invoke(main, ["annotate", "--store", spec, "--corpus-prior", "0.5"])
        one_line_failure(out)
        assert needle in out.output
    assert not missing.exists()


@pytest.mark.integration
def test_pgvector_rows_without_vectors_are_refused_naming_the_row(tmp_path, pg_uri):
    """A typical pipeline's table may hold rows whose embedding is still NULL: annotate
    names the first such row in one line, and writes nothing."""
    import psycopg

    _, units, _ = cosine_collection(tmp_path / "q", n=40)
    spec = cosine_table(pg_uri, units)
    table = spec.rsplit("#", 1)[1]
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        conn.execute(f"INSERT INTO {table} (id, content, embedding) VALUES (900, 'later', NULL)")
    out = CliRunner().invoke(main, ["annotate", "--store", spec, "--corpus-prior", "0.5"])
    assert out.exit_code == 1 and isinstance(out.exception, SystemExit), out.output
    assert "Traceback" not in out.output
    last = out.output.strip().splitlines()[-1]  # after the reading bar: one error line
    assert last.startswith("Error: ") and "point 900 has no vector" in last
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = %s", (table,)
            )
        ]
        comment = conn.execute("SELECT obj_description(%s::regclass)", (table,)).fetchone()[0]
    assert sorted(columns) == ["content", "embedding", "id"]  # no magnitude column added
    assert comment is None
