"""Haystack components over a real export (tiny ONNX model), run inside real Haystack Pipelines.

The retriever component must return the magretrieve Retriever's own hits, in order, with the
score decomposition in each Document's meta; the two embedders must give the vectors the
Retriever indexes and searches with, so a Haystack store ranking by dot product
(InMemoryDocumentStore) returns the same ranking and scores; every component must survive
to_dict/from_dict and a Pipeline YAML round trip.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # no telemetry calls from tests

import numpy as np
import pytest
from haystack import Document, Pipeline
from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
from haystack.components.writers import DocumentWriter
from haystack.document_stores.in_memory import InMemoryDocumentStore

from magretrieve.core.errors import ConfigError, StoreError
from magretrieve.integrations.haystack import (
    MagRetrieveDocumentEmbedder,
    MagRetrieveRetriever,
    MagRetrieveTextEmbedder,
)
from magretrieve.serving.retriever import Retriever
from magretrieve.serving.runtime import OnnxEncoder

QUERIES = ["what does smoking cause", "how obesity risk"]


@pytest.fixture(scope="module")
def export_dir(tiny_model_dir, tmp_path_factory):
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("export") / "qnorm"
    export_model(tiny_model_dir, out, mode="qnorm")
    return out


@pytest.fixture(scope="module")
def corpus(tiny_beir_dir):
    docs = [json.loads(line) for line in (tiny_beir_dir / "corpus.jsonl").read_text().splitlines()]
    for n, d in enumerate(docs):
        d["year"] = 2000 + n
    return docs


@pytest.fixture(scope="module")
def store_spec(export_dir, corpus, tmp_path_factory):
    """A persisted memory: store indexed by the magretrieve Retriever itself."""
    spec = f"memory:{tmp_path_factory.mktemp('store')}"
    with Retriever.load(export_dir, store=spec) as r:
        r.add_documents(corpus)
        r.persist()
    return spec


@pytest.fixture(scope="module")
def reference(export_dir, store_spec):
    r = Retriever.load(export_dir, store=store_spec, create=False)
    yield r
    r.close()


def test_retriever_component_in_a_pipeline_returns_the_retrievers_hits(
    export_dir, store_spec, reference
):
    p = Pipeline()
    p.add_component("retriever", MagRetrieveRetriever(export_dir, store_spec, top_k=3))
    for query in QUERIES:
        hits = reference.search(query, k=3)
        docs = p.run({"retriever": {"query": query}})["retriever"]["documents"]
        assert all(isinstance(d, Document) for d in docs)
        assert [d.id for d in docs] == [h.id for h in hits]
        assert [d.score for d in docs] == pytest.approx([h.score for h in hits])
        assert [d.content for d in docs] == [h.payload["text"] for h in hits]
        for d, h in zip(docs, hits, strict=True):
            assert d.meta["doc_norm"] == pytest.approx(h.doc_norm)
            assert d.meta["cosine"] == pytest.approx(h.cosine)
            assert d.meta["query_norm"] == pytest.approx(h.query_norm)
            assert d.meta["score"] == pytest.approx(
                d.meta["query_norm"] * d.meta["doc_norm"] * d.meta["cosine"], rel=1e-4, abs=1e-5
            )
            assert d.meta["year"] == h.payload["year"]  # payload fields are top-level meta
            assert d.meta["payload"] == h.payload
        # a per-run top_k overrides the component's
        more = p.run({"retriever": {"query": query, "top_k": 5}})["retriever"]["documents"]
        assert [d.id for d in more] == [h.id for h in reference.search(query, k=5)]


def test_embedders_feed_a_dot_product_store_that_ranks_as_the_retriever(
    export_dir, corpus, reference
):
    store = InMemoryDocumentStore(embedding_similarity_function="dot_product")
    indexing = Pipeline()
    indexing.add_component("embed", MagRetrieveDocumentEmbedder(export_dir))
    indexing.add_component("write", DocumentWriter(document_store=store))
    indexing.connect("embed.documents", "write.documents")
    docs = [
        Document(id=d["_id"], content=d["text"], meta={"title": d["title"], "year": d["year"]})
        for d in corpus
    ]
    indexing.run({"embed": {"documents": docs}})
    assert store.count_documents() == len(corpus)

    # the document vectors are the Retriever's own (title + text through the document graph)
    encoder = OnnxEncoder.load(export_dir)
    stored = {d.id: d for d in store.filter_documents()}
    expect = encoder.encode_documents([f"{d['title']} {d['text']}".strip() for d in corpus])
    for d, vec in zip(corpus, expect, strict=True):
        got = np.asarray(stored[d["_id"]].embedding, dtype=np.float32)
        np.testing.assert_allclose(got, vec, rtol=1e-5, atol=1e-6)
        assert stored[d["_id"]].meta["doc_norm"] == pytest.approx(float(np.linalg.norm(vec)))
    norms = [d.meta["doc_norm"] for d in stored.values()]
    assert max(norms) > 1.05 * min(norms)  # qnorm keeps magnitude: the norms differ

    query = Pipeline()
    query.add_component("embed", MagRetrieveTextEmbedder(export_dir))
    query.add_component("search", InMemoryEmbeddingRetriever(document_store=store, top_k=4))
    query.connect("embed.embedding", "search.query_embedding")
    for text in QUERIES:
        out = query.run({"embed": {"text": text}}, include_outputs_from={"embed"})
        np.testing.assert_allclose(
            out["embed"]["embedding"], encoder.encode_queries([text])[0], rtol=1e-5, atol=1e-6
        )
        hits = reference.search(text, k=4)
        found = out["search"]["documents"]
        assert [d.id for d in found] == [h.id for h in hits]
        assert [d.score for d in found] == pytest.approx([h.score for h in hits], rel=1e-4)


def test_components_round_trip_through_to_dict_and_pipeline_yaml(export_dir, store_spec, reference):
    components = [
        MagRetrieveTextEmbedder(export_dir, threads=1),
        MagRetrieveDocumentEmbedder(export_dir, title_field=None, batch_size=8),
        MagRetrieveRetriever(export_dir, store_spec, top_k=2, store_options=None),
    ]
    for c in components:
        data = c.to_dict()
        assert data["type"].startswith("magretrieve.integrations.haystack.")
        again = type(c).from_dict(data)
        assert again.to_dict() == data
    assert components[0].to_dict()["init_parameters"] == {
        "export_dir": str(export_dir),
        "threads": 1,
        "runtime": None,
    }

    p = Pipeline()
    p.add_component("retriever", components[2])
    loaded = Pipeline.loads(p.dumps())
    docs = loaded.run({"retriever": {"query": QUERIES[0]}})["retriever"]["documents"]
    assert [d.id for d in docs] == [h.id for h in reference.search(QUERIES[0], k=2)]


def test_bad_arguments_and_inputs_are_one_line_errors(export_dir, tmp_path):
    with pytest.raises(ConfigError, match="top_k must be a positive integer, got 0"):
        MagRetrieveRetriever(export_dir, "memory:", top_k=0)
    with pytest.raises(ConfigError, match="store must be a store spec"):
        MagRetrieveRetriever(export_dir, "idx")
    with pytest.raises(ConfigError, match="export_dir must be an export folder path"):
        MagRetrieveTextEmbedder(None)
    with pytest.raises(ConfigError, match="takes one string"):
        MagRetrieveTextEmbedder(export_dir).run(["a", "b"])
    with pytest.raises(ConfigError, match="item #1 is a str"):
        MagRetrieveDocumentEmbedder(export_dir).run([Document(content="a"), "b"])
    with pytest.raises(ConfigError, match="no text to embed"):
        MagRetrieveDocumentEmbedder(export_dir).run([Document(content="  ")])
    assert MagRetrieveDocumentEmbedder(export_dir).run([]) == {"documents": []}
    # the retriever searches an existing store; it never creates one
    missing = MagRetrieveRetriever(export_dir, f"faiss:{tmp_path / 'absent'}")
    with pytest.raises(StoreError):
        missing.run("a query")
