"""Retriever: manifest/store checks, score decomposition, batching, threads, real ONNX export.

Most tests use :class:`FakeEncoder`, a small deterministic encoder exposing the runtime
contract (``manifest`` + ``encode_queries``/``encode_documents``); the last test exports the
tiny BERT with ``magretrieve.export.export_model`` and runs the real ONNX path end to end.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from magretrieve.core.errors import StoreError
from magretrieve.data.readers import Document
from magretrieve.serving.retriever import Hit, Retriever
from magretrieve.stores import open_store
from tests.support.fake_encoder import DIM, TOPICS, FakeEncoder, corpus

QUERIES = ["statins heart", "cancer cell protein", "wing flow", "vitamin dose lung", "brain"]


@pytest.fixture(params=["memory", "faiss", "qdrant-memory", "qdrant-edge"])
def spec(request, tmp_path) -> str:
    return {
        "memory": "memory:",
        "faiss": f"faiss:{tmp_path / 'f'}",
        "qdrant-memory": "qdrant-memory:r",
        "qdrant-edge": f"qdrant-edge:{tmp_path / 'e'}",
    }[request.param]


def test_hits_decompose_scores_and_match_brute_force(spec):
    enc = FakeEncoder("qnorm")
    r = Retriever(enc, open_store(spec, dimension=DIM))
    docs = corpus()
    assert r.add_documents(docs[:30]) == 30
    assert r.add_documents([Document(d["_id"], d["text"], d["title"]) for d in docs[30:]]) == 30
    texts = [f"{d['title']} {d['text']}" for d in docs]
    dvec = enc.encode_documents(texts)
    for query in QUERIES:
        qvec = enc.encode_queries([query])[0]
        scores = dvec @ qvec
        order = np.argsort(-scores, kind="stable")[:5]
        hits = r.search(query, k=5)
        assert [h.id for h in hits] == [docs[j]["_id"] for j in order]
        for h, j in zip(hits, order, strict=True):
            assert isinstance(h, Hit)
            assert h.score == pytest.approx(float(scores[j]), abs=1e-4)
            assert h.doc_norm == pytest.approx(float(np.linalg.norm(dvec[j])), rel=1e-5)
            assert h.query_norm == pytest.approx(1.0, abs=1e-6)  # qnorm: unit queries
            cos = float(dvec[j] @ qvec / (np.linalg.norm(dvec[j]) * np.linalg.norm(qvec)))
            assert h.cosine == pytest.approx(cos, abs=1e-5)
            assert h.score == pytest.approx(h.query_norm * h.doc_norm * h.cosine, rel=1e-4)
        assert hits[0].payload["title"] == f"title {order[0]}"
    r.close()


def test_payload_fields_and_search_batch_equal_single_searches():
    r = Retriever(FakeEncoder(), open_store("memory:", dimension=DIM))
    r.add_documents(corpus())
    hit = r.search("statins heart", k=1)[0]
    assert set(hit.payload) == {"title", "text", "year"}
    batch = r.search_batch(QUERIES, k=7)
    assert len(batch) == len(QUERIES)
    for query, hits in zip(QUERIES, batch, strict=True):
        single = r.search(query, k=7)
        assert [h.id for h in hits] == [h.id for h in single]
        assert [h.rank for h in hits] == list(range(1, 8))
    with pytest.raises(StoreError, match="list of texts"):
        r.search_batch("one string", k=3)
    with pytest.raises(StoreError, match="empty"):
        r.search("   ", k=3)


def test_cosine_mode_hits_have_unit_norms():
    r = Retriever(FakeEncoder("cosine"), open_store("memory:", dimension=DIM))
    r.add_documents(corpus(20))
    for h in r.search("cancer cell", k=5):
        assert h.doc_norm == pytest.approx(1.0, abs=1e-5)
        assert h.score == pytest.approx(h.cosine, abs=1e-5)


def test_store_records_model_and_refuses_another(tmp_path):
    spec = f"faiss:{tmp_path / 'f'}"
    r = Retriever(FakeEncoder(fingerprint="a" * 64), open_store(spec, dimension=DIM))
    r.add_documents(corpus(10))
    r.persist()
    meta = open_store(spec).read_metadata()
    assert meta["model_fingerprint"] == "a" * 64
    assert (meta["mode"], meta["gamma_q"], meta["gamma_d"], meta["dimension"]) == (
        "qnorm",
        1.0,
        0.0,
        DIM,
    )
    other = FakeEncoder(fingerprint="b" * 64)
    with pytest.raises(StoreError, match=r"another model.*aaaaaaaa.*bbbbbbbb.*model_fingerprint"):
        Retriever(other, open_store(spec))
    with pytest.raises(StoreError, match=r"mode qnorm.*mode dot"):
        Retriever(FakeEncoder("dot", fingerprint="a" * 64), open_store(spec))
    forced = Retriever(other, open_store(spec), force=True)
    assert len(forced.search("statins", k=3)) == 3
    # forcing does not relabel the store
    assert open_store(spec).read_metadata()["model_fingerprint"] == "a" * 64


def test_retriever_with_block_saves_on_normal_exit_only(tmp_path):
    """``with Retriever(...)`` saves added documents on a normal exit (no persist() call) and
    keeps the last saved state when the block raises."""
    spec = f"faiss:{tmp_path / 'f'}"
    with Retriever(FakeEncoder(), open_store(spec, dimension=DIM)) as r:
        r.add_documents(corpus(10))
    assert open_store(spec).count() == 10
    with pytest.raises(KeyError), Retriever(FakeEncoder(), open_store(spec)) as r:
        r.add_documents(corpus(25)[10:])
        assert r.store.count() == 25
        raise KeyError("stop")
    assert open_store(spec).count() == 10


def test_dimension_mismatch_refused():
    with pytest.raises(StoreError, match=r"store dimension 16 does not match.*dimension 24"):
        Retriever(FakeEncoder(), open_store("memory:", dimension=16))


def test_normalizing_faiss_index_refused_for_magnitude_keeping_model():
    import faiss

    def l2norm_index():
        return faiss.index_factory(DIM, "L2norm,Flat", faiss.METRIC_INNER_PRODUCT)

    with pytest.raises(StoreError, match="normalizes vectors.*qnorm"):
        Retriever(FakeEncoder("qnorm"), open_store(l2norm_index()))
    Retriever(FakeEncoder("cosine"), open_store(l2norm_index()))  # harmless when γd = 1
    with pytest.raises(StoreError, match="metric L2"):
        Retriever(FakeEncoder("cosine"), open_store(faiss.IndexFlatL2(DIM)))


def test_nan_vectors_refused_naming_the_document():
    enc = FakeEncoder()
    r = Retriever(enc, open_store("memory:", dimension=DIM))
    r.add_documents(corpus(5))
    enc.nan_for = "title 7"
    with pytest.raises(StoreError, match=r"'d7'.*NaN or inf"):
        r.add_documents(corpus(10)[5:])
    assert r.store.count() == 5  # the bad batch wrote nothing


def test_bad_documents_refused():
    r = Retriever(FakeEncoder(), open_store("memory:", dimension=DIM))
    with pytest.raises(StoreError, match="missing a string '_id'"):
        r.add_documents([{"text": "x"}])
    with pytest.raises(StoreError, match="'e1': empty title and text"):
        r.add_documents([{"_id": "e1", "text": "  "}])
    with pytest.raises(StoreError, match="duplicate document id 'x'"):
        r.add_documents([{"_id": "x", "text": "a"}, {"_id": "x", "text": "b"}])


@pytest.mark.parametrize("spec_kind", ["faiss-hnsw", "qdrant-local", "qdrant-edge"])
def test_concurrent_search_equals_serial(tmp_path, spec_kind):
    spec, opts = {
        "faiss-hnsw": (f"faiss:{tmp_path / 'f'}", {"index_type": "hnsw", "hnsw_m": 16}),
        "qdrant-local": (f"qdrant-local:{tmp_path / 'q'}/c", {}),
        "qdrant-edge": (f"qdrant-edge:{tmp_path / 'e'}", {}),
    }[spec_kind]
    r = Retriever(FakeEncoder(), open_store(spec, dimension=DIM, **opts))
    r.add_documents(corpus(200))
    rng = np.random.default_rng(0)
    queries = [" ".join(rng.choice(TOPICS, size=3)) for _ in range(40)]
    serial = [[(h.id, round(h.score, 5)) for h in r.search(q, k=5)] for q in queries]
    results: dict[tuple[int, int], list] = {}
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for rep in range(3):
                for i, q in enumerate(queries):
                    hits = r.search(q, k=5) if (i + t) % 2 else r.search_batch([q], k=5)[0]
                    results[(t, rep * 1000 + i)] = [(h.id, round(h.score, 5)) for h in hits]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert len(results) == 8 * 3 * len(queries)
    for (_, key), got in results.items():
        assert got == serial[key % 1000]
    r.close()


def test_adding_while_searching_is_safe():
    r = Retriever(FakeEncoder(), open_store("memory:", dimension=DIM))
    docs = corpus(200)
    r.add_documents(docs[:50])
    stop = threading.Event()
    errors: list[BaseException] = []

    def searcher() -> None:
        try:
            while not stop.is_set():
                hits = r.search("statins heart", k=5)
                assert len(hits) == 5 and all(isinstance(h.doc_norm, float) for h in hits)
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=searcher) for _ in range(4)]
    for th in threads:
        th.start()
    for i in range(50, 200, 10):
        r.add_documents(docs[i : i + 10])
    r.delete([d["_id"] for d in docs[:20]])
    stop.set()
    for th in threads:
        th.join()
    assert not errors
    assert r.store.count() == 180


# ----------------------------------------------------------------------------- real export


@pytest.fixture(scope="module")
def tiny_export(tiny_model_dir, tmp_path_factory) -> Path:
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("export") / "qnorm"
    export_model(tiny_model_dir, out, mode="qnorm")
    return out


def test_real_onnx_export_end_to_end(tiny_export, tiny_beir_dir, tmp_path):
    """Retriever.load on a real export: scores equal the ONNX vectors' inner products."""
    import json
    import subprocess
    import sys

    from magretrieve.data.readers import load_corpus
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    r = Retriever.load(tiny_export, store=f"faiss:{tmp_path / 'ix'}")
    docs = load_corpus(tiny_beir_dir / "corpus.jsonl")
    assert r.add_documents(docs.values()) == len(docs)
    r.persist()
    enc = OnnxEncoder.load(tiny_export)
    ids = list(docs)
    dvec = enc.encode_documents([docs[i].full_text for i in ids])
    qvec = enc.encode_queries(["statins heart risk"])[0]
    order = np.argsort(-(dvec @ qvec), kind="stable")[:5]
    hits = r.search("statins heart risk", k=5)
    assert [h.id for h in hits] == [ids[j] for j in order]
    np.testing.assert_allclose([h.score for h in hits], (dvec @ qvec)[order], atol=1e-4)
    np.testing.assert_allclose(
        [h.doc_norm for h in hits], np.linalg.norm(dvec[order], axis=1), rtol=1e-5
    )
    assert hits[0].query_norm == pytest.approx(1.0, abs=1e-5)
    meta = r.store.read_metadata()
    assert meta["model_fingerprint"] == enc.manifest.model_fingerprint
    r.close()
    # a fresh process serves the persisted store without importing torch or transformers
    script = (
        "import sys, json\n"
        "from magretrieve import Retriever\n"
        f"r = Retriever.load({str(tiny_export)!r}, store={'faiss:' + str(tmp_path / 'ix')!r})\n"
        "hits = r.search('statins heart risk', k=5)\n"
        "print(json.dumps([[h.id, h.score] for h in hits]))\n"
        "print(json.dumps(sorted(m for m in ('torch', 'transformers') if m in sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    there = json.loads(lines[-2])
    assert [i for i, _ in there] == [h.id for h in hits]
    np.testing.assert_allclose([s for _, s in there], [h.score for h in hits], atol=1e-5)
    assert json.loads(lines[-1]) == []
