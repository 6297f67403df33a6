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
from magretrieve.priors.annotate import annotate_store
from magretrieve.priors.corpus_prior import CorpusPrior, hub_scores
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
    prior = CorpusPrior(beta=beta, k=k)
    hubs = hub_scores(units, k)
    prior.mean, prior.std = float(hubs.mean()), float(hubs.std())
    return prior.magnitudes(prior.z_scores(hubs))


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
    report = annotate_store(spec, prior=CorpusPrior(beta=0.8, k=10), progress=False)
    want_m = expected_prior(units, 0.8)
    assert report.count == N and report.kind == "corpus_prior" and report.prefetch == 100
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
    from test_retriever import FakeEncoder

    from magretrieve.serving.retriever import Retriever

    spec, units, _ = cosine_collection(tmp_path / "q", n=120)
    annotate_store(spec, prior=CorpusPrior(beta=0.5, k=5), progress=False)
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


def test_interrupted_annotation_leaves_it_unannotated_and_a_rerun_completes(tmp_path, monkeypatch):
    spec, units, _ = cosine_collection(tmp_path / "q", n=300)
    calls = []

    def failing(self, points, mags):
        calls.append(len(points))
        if len(calls) == 2:
            raise KeyboardInterrupt("simulated crash")
        return original(self, points, mags)

    original = QdrantCosineStore.set_magnitudes
    monkeypatch.setattr(QdrantCosineStore, "set_magnitudes", failing)
    with pytest.raises(KeyboardInterrupt):
        annotate_store(spec, prior=CorpusPrior(beta=0.5), batch_size=128, progress=False)
    with pytest.raises(StoreError, match="uses distance Cosine"):
        open_store(spec)  # not annotated: the metadata is written last
    monkeypatch.setattr(QdrantCosineStore, "set_magnitudes", original)
    report = annotate_store(spec, prior=CorpusPrior(beta=0.5), batch_size=128, progress=False)
    assert report.count == 300
    with open_store(spec) as store:
        assert store.count() == 300 and store.prefetch == 100


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


def test_pgvector_cosine_table_annotated_ranks_like_qdrant(tmp_path, pg_uri):
    qspec, units, queries = cosine_collection(tmp_path / "q")
    pspec = cosine_table(pg_uri, units)
    with pytest.raises(StoreError, match="ranked by cosine.*magretrieve annotate"):
        open_store(pspec)
    prior = CorpusPrior(beta=0.8, k=10)
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
    # a magretrieve table (inner product already) is not annotated
    own = f"pgvector:{pg_uri}#own_{uuid.uuid4().hex[:8]}"
    open_store(own, dimension=DIM).close()
    with pytest.raises(StoreError, match="inner product already"):
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
    from magretrieve.serving.runtime import OnnxEncoder

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
