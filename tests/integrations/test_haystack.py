"""Haystack components over a real export (tiny ONNX model), run inside real Haystack Pipelines.

The retriever component must return the magretrieve Retriever's own hits, in order, with the
score decomposition in each Document's meta; the two embedders must give the vectors the
Retriever indexes and searches with, so a Haystack store ranking by dot product
(InMemoryDocumentStore) returns the same ranking and scores; every component must survive
to_dict/from_dict and a Pipeline YAML round trip, and no YAML may hold a credential.
Runs on the installed haystack-ai (2.x or 3.x; 3.x loads YAML only from allowed modules).
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import uuid

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # no telemetry calls from tests

import numpy as np
import pytest
from haystack import Document, Pipeline
from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
from haystack.components.writers import DocumentWriter
from haystack.document_stores.in_memory import InMemoryDocumentStore
from haystack.utils import Secret

from magretrieve.core.errors import ConfigError, StoreError
from magretrieve.integrations.haystack import (
    MagRetrieveDocumentEmbedder,
    MagRetrieveRetriever,
    MagRetrieveTextEmbedder,
)
from magretrieve.serving.onnx_encoder import OnnxEncoder
from magretrieve.serving.retriever import Retriever

QUERIES = ["what does smoking cause", "how obesity risk"]
MODULE = "magretrieve.integrations.haystack"


def load_yaml(text: str) -> Pipeline:
    """``Pipeline.loads`` trusting this module: haystack-ai 3.x asks for it, 2.x has no allowlist."""
    if "allowed_modules" in inspect.signature(Pipeline.loads).parameters:
        return Pipeline.loads(text, allowed_modules=[MODULE])
    return Pipeline.loads(text)


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
        "url": None,
        "api_key": {"type": "env_var", "env_vars": ["MAGRETRIEVE_API_KEY"], "strict": False},
        "timeout": 60.0,
    }

    p = Pipeline()
    p.add_component("retriever", components[2])
    loaded = load_yaml(p.dumps())
    docs = loaded.run({"retriever": {"query": QUERIES[0]}})["retriever"]["documents"]
    assert [d.id for d in docs] == [h.id for h in reference.search(QUERIES[0], k=2)]


def test_bad_arguments_and_inputs_are_one_line_errors(export_dir, store_spec, tmp_path):
    with pytest.raises(ConfigError, match="top_k must be a positive integer, got 0"):
        MagRetrieveRetriever(export_dir, "memory:", top_k=0)
    with pytest.raises(ConfigError, match="store must be a store spec"):
        MagRetrieveRetriever(export_dir, "idx")
    with pytest.raises(ConfigError, match="export_dir must be an export folder path"):
        MagRetrieveTextEmbedder(3)
    with pytest.raises(ConfigError, match="export_dir must be an export folder path"):
        MagRetrieveRetriever(None, "memory:")
    with pytest.raises(ConfigError, match="takes one string"):
        MagRetrieveTextEmbedder(export_dir).run(["a", "b"])
    with pytest.raises(ConfigError, match="item #1 is a str"):
        MagRetrieveDocumentEmbedder(export_dir).run([Document(content="a"), "b"])
    with pytest.raises(ConfigError, match="no text to embed"):
        MagRetrieveDocumentEmbedder(export_dir).run([Document(content="  ")])
    # one blank rule (core.text.blank) with the server and index: invisible characters too
    for blank in ["\u200b", "\x00\x07", "\u200d\ufeff ", "\u0301"]:
        with pytest.raises(ConfigError, match="document 'b': no text to embed"):
            MagRetrieveDocumentEmbedder(export_dir).run(
                [Document(id="a", content="fine"), Document(id="b", content=blank)]
            )
        with pytest.raises(ConfigError, match="empty or only whitespace and invisible"):
            MagRetrieveTextEmbedder(export_dir).run(blank)
        with pytest.raises(StoreError, match="empty or only whitespace and invisible"):
            MagRetrieveRetriever(export_dir, store_spec).run(blank)
    with pytest.raises(ConfigError, match="api_key must be a haystack Secret"):
        MagRetrieveTextEmbedder(url="http://127.0.0.1:1", api_key="plain-key")
    with pytest.raises(ConfigError, match="either export_dir .* or url"):
        MagRetrieveDocumentEmbedder()
    assert MagRetrieveDocumentEmbedder(export_dir).run([]) == {"documents": []}
    # the retriever searches an existing store; it never creates one
    missing = MagRetrieveRetriever(export_dir, f"faiss:{tmp_path / 'absent'}")
    with pytest.raises(StoreError):
        missing.run("a query")


#: Every credential form a store spec or option takes ({s}: the secret).
CREDENTIALS = [
    ("uri userinfo", "pgvector:postgresql://u:{s}@127.0.0.1:1/db#t", {}),
    ("uri userinfo with @", "pgvector:postgresql://u:a@{s}@127.0.0.1:1/db#t", {}),
    ("uri query password", "pgvector:postgresql://u@127.0.0.1:1/db?password={s}#t", {}),
    ("libpq key=value", "pgvector:host=127.0.0.1 port=1 dbname=x password={s}#t", {}),
    ("libpq quoted", "pgvector:host=127.0.0.1 port=1 password='a b\\'{s}' dbname=x#t", {}),
    ("milvus userinfo", "milvus:http://root:{s}@127.0.0.1:1/coll", {}),
    ("milvus token option", "milvus:http://127.0.0.1:1/coll", {"token": "root:{s}"}),
    ("qdrant api_key option", "qdrant:http://127.0.0.1:1/coll", {"api_key": "{s}"}),
    ("qdrant userinfo", "qdrant:http://u:{s}@127.0.0.1:1/coll", {}),
]


@pytest.mark.parametrize(("form", "spec", "options"), CREDENTIALS, ids=[c[0] for c in CREDENTIALS])
def test_pipeline_yaml_never_holds_a_store_credential(form, spec, options, export_dir, caplog):
    s = "S3CR" + uuid.uuid4().hex[:10]
    component = MagRetrieveRetriever(
        export_dir, spec.format(s=s), store_options={k: v.format(s=s) for k, v in options.items()}
    )
    p = Pipeline()
    p.add_component("retriever", component)
    caplog.set_level(logging.WARNING)
    for text in (p.dumps(), json.dumps(component.to_dict())):
        assert s not in text and s[4:] not in text, text
        assert "***" in text
    # the user is told, and a pipeline loaded from the masked YAML refuses to start
    assert "written masked" in caplog.text and s not in caplog.text
    with pytest.raises(Exception, match=r"masked credential \(\*\*\*\)") as info:
        load_yaml(p.dumps())
    assert s not in str(info.value)


def test_secrets_round_trip_as_environment_variable_references(
    export_dir, store_spec, reference, monkeypatch
):
    """The way to keep a credentialed spec in YAML: a Secret naming the variable that holds it."""
    monkeypatch.setenv("MR_TEST_STORE", store_spec)
    monkeypatch.setenv("MR_TEST_QDRANT_KEY", "S3CRnever-written")
    monkeypatch.setenv("MAGRETRIEVE_API_KEY", "S3CRserver-key")
    retriever = MagRetrieveRetriever(
        export_dir,
        Secret.from_env_var("MR_TEST_STORE"),
        top_k=2,
        store_options={"api_key": Secret.from_env_var("MR_TEST_QDRANT_KEY")},
    )
    assert retriever.to_dict()["init_parameters"]["store"] == {
        "type": "env_var",
        "env_vars": ["MR_TEST_STORE"],
        "strict": True,
    }
    embedder = MagRetrieveTextEmbedder(url="http://127.0.0.1:1")
    p = Pipeline()
    p.add_component("retriever", retriever)
    p.add_component("embed", embedder)
    text = p.dumps()
    for secret in ("S3CRnever-written", "S3CRserver-key", store_spec):
        assert secret not in text
    assert "MR_TEST_STORE" in text and "MAGRETRIEVE_API_KEY" in text
    loaded = load_yaml(text)
    again = loaded.get_component("retriever")
    assert isinstance(again.store, Secret) and again.store.resolve_value() == store_spec
    assert loaded.get_component("embed").api_key.resolve_value() == "S3CRserver-key"
    assert again.to_dict() == retriever.to_dict()
    # the memory: store takes no api_key; searching through the Secret spec alone works
    plain = MagRetrieveRetriever(export_dir, Secret.from_env_var("MR_TEST_STORE"), top_k=2)
    docs = plain.run(QUERIES[0])["documents"]
    assert [d.id for d in docs] == [h.id for h in reference.search(QUERIES[0], k=2)]
    # a token Secret is refused by Haystack itself rather than written
    with pytest.raises(ValueError, match="Cannot serialize token-based secret"):
        MagRetrieveRetriever(export_dir, Secret.from_token("memory:")).to_dict()
