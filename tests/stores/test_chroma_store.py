"""Chroma (``chroma:PATH/COLLECTION`` embedded, ``chroma:URL/COLLECTION`` server): its own rules.

Space ``ip`` and scores equal to inner products (Chroma reports ``1 − ip``), ``l2``/``cosine``
collections refused, HNSW options passed through, ``ef_search`` tuned to ``--target-recall``
by measurement, and the model metadata surviving a new process. The shared add/search/delete
sequence runs in ``tests/stores/test_stores.py`` (embedded and, marked integration, a real server).
"""

from __future__ import annotations

import json
import subprocess
import sys

import chromadb
import numpy as np
import pytest

from magretrieve.core.errors import StoreError
from magretrieve.stores import open_store
from magretrieve.stores.chroma_store import parse_chroma

pytestmark = pytest.mark.integration

DIM = 16


def data(n: int = 200, nq: int = 15, dim: int = DIM, seed: int = 0):
    rng = np.random.default_rng(seed)
    docs = rng.normal(size=(n, dim)).astype(np.float32)
    docs *= rng.uniform(0.2, 5.0, size=(n, 1)).astype(np.float32)
    queries = rng.normal(size=(nq, dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return [f"doc-{i}" for i in range(n)], docs, queries


def test_scores_are_inner_products_not_chroma_distances(tmp_path):
    ids, docs, queries = data()
    with open_store(f"chroma:{tmp_path / 'c'}/docs", dimension=DIM) as store:
        store.add(ids, docs, [{"n": i} for i in range(len(ids))])
        hits = store.search(queries, 5)
        for q, row in zip(queries, hits, strict=True):
            rows = [int(h.id.split("-")[1]) for h in row]
            assert rows == list(np.argsort(-(docs @ q), kind="stable")[:5])
            np.testing.assert_allclose([h.score for h in row], docs[rows] @ q, atol=1e-4)
            assert row[0].payload == {"n": rows[0]}
            np.testing.assert_allclose(
                [h.doc_norm for h in row], np.linalg.norm(docs[rows], axis=1), rtol=1e-6
            )
        # what Chroma itself reports is the distance 1 − q·d
        raw = store.col.query(query_embeddings=queries[:1], n_results=1, include=["distances"])
        top = int(np.argmax(docs @ queries[0]))
        assert raw["distances"][0][0] == pytest.approx(
            1.0 - float(docs[top] @ queries[0]), abs=1e-4
        )
        assert store.parameters()["space"] == "ip"


@pytest.mark.parametrize("space", ["cosine", "l2"])
def test_collection_in_another_space_is_refused(tmp_path, space):
    client = chromadb.PersistentClient(
        path=str(tmp_path / "c"), settings=chromadb.Settings(anonymized_telemetry=False)
    )
    col = client.create_collection(
        "theirs", configuration={"hnsw": {"space": space}}, embedding_function=None
    )
    col.add(ids=["a"], embeddings=np.ones((1, DIM), dtype=np.float32))
    with pytest.raises(StoreError, match=f"space '{space}'; magretrieve needs 'ip'") as err:
        open_store(f"chroma:{tmp_path / 'c'}/theirs", dimension=DIM)
    assert "\n" not in str(err.value)


def test_hnsw_options_pass_through_and_survive_a_new_process(tmp_path):
    ids, docs, _ = data(n=30)
    spec = f"chroma:{tmp_path / 'c'}/docs"
    with open_store(spec, dimension=DIM, hnsw_m=24, ef_construction=150, ef_search=77) as store:
        assert store.col.configuration["hnsw"]["max_neighbors"] == 24
        p = store.parameters()
        assert (p["hnsw_m"], p["ef_construction"], p["ef_search"]) == (24, 150, 77)
        store.add(ids, docs)
        store.write_metadata({"model_fingerprint": "abc", "mode": "qnorm"})
    code = (
        "import sys, json\n"
        "from magretrieve.stores import open_store\n"
        "s = open_store(sys.argv[1])\n"
        "p = s.parameters()\n"
        "print(json.dumps([s.count(), s.read_metadata(), s.dimension, p['hnsw_m'], p['ef_search']]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, spec], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert json.loads(last) == [30, {"model_fingerprint": "abc", "mode": "qnorm"}, DIM, 24, 77]
    with pytest.raises(StoreError, match="vector size 16, but the model produces dimension 8"):
        open_store(spec, dimension=8)


def test_target_recall_tunes_ef_search_by_measurement(tmp_path):
    ids, docs, queries = data(n=3000, nq=100, dim=32, seed=1)
    spec = f"chroma:{tmp_path / 'c'}/ann"
    store = open_store(
        spec, dimension=32, hnsw_m=8, ef_construction=32, ef_search=16, target_recall=0.99
    )
    store.add(ids, docs)
    exact = [list(np.argsort(-(docs @ q), kind="stable")[:10]) for q in queries]
    exact_ids = [[ids[j] for j in row] for row in exact]

    def recall() -> float:
        found = [[h.id for h in row] for row in store.search(queries, 10, with_vectors=False)]
        return float(
            np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact_ids, strict=True)])
        )

    before = recall()
    store.optimize()
    rec = store.parameters()["recall"]
    assert rec["target"] == 0.99 and rec["ef_search"] == store.ef_search
    assert rec["ef_search"] > 16, rec  # tuning raised it from the given 16
    after = recall()
    assert after >= 0.97 and after > before, (before, after)
    store.close()
    again = open_store(spec)
    assert again.ef_search == rec["ef_search"]  # the tuned value is the collection's own
    assert again.parameters()["recall"] == rec


def test_spec_forms():
    assert parse_chroma("data/chroma/scifact") == {"path": "data/chroma", "collection": "scifact"}
    assert parse_chroma("http://127.0.0.1:8000/scifact") == {
        "url": "http://127.0.0.1:8000",
        "collection": "scifact",
    }
    with pytest.raises(StoreError, match="missing collection"):
        parse_chroma("http://127.0.0.1:8000")
    with pytest.raises(StoreError, match="Chroma collection names"):
        open_store("chroma:/tmp/x/a", dimension=4)


def test_unreachable_server_is_one_line(tmp_path):
    from tests.support.servers import free_ports

    port = free_ports(1)[0]
    with pytest.raises(StoreError, match=f"chroma:http://127.0.0.1:{port}/docs") as err:
        open_store(f"chroma:http://127.0.0.1:{port}/docs", dimension=4)
    assert "\n" not in str(err.value)


@pytest.mark.integration
def test_server_collection_keeps_magnitude_and_refuses_live_tuning(chroma_server_url):
    ids, docs, queries = data(n=50)
    spec = f"chroma:{chroma_server_url}/srv"
    with pytest.raises(StoreError, match="--target-recall needs the embedded Chroma"):
        open_store(spec, dimension=DIM, target_recall=0.99)
    with open_store(spec, dimension=DIM, ef_search=64) as store:
        store.add(ids, docs, [{"n": i} for i in range(len(ids))])
        store.write_metadata({"model_fingerprint": "abc"})
        hits = store.search(queries[:3], 5)
        for q, row in zip(queries[:3], hits, strict=True):
            rows = [int(h.id.split("-")[1]) for h in row]
            assert rows == list(np.argsort(-(docs @ q), kind="stable")[:5])
            np.testing.assert_allclose([h.score for h in row], docs[rows] @ q, atol=1e-4)
        store.optimize()  # below exact_below the served collection is scanned: no recall
        params = store.parameters()
        assert params["search"] == "exact" and "recall" not in params
    with open_store(spec) as again:
        assert again.read_metadata() == {"model_fingerprint": "abc"} and again.count() == 50
