"""LangChain and LlamaIndex retrievers over a real Retriever (tiny ONNX export), real packages.

The framework results must be the Retriever's own hits, in order, with the score
decomposition (``id``, ``score``, ``doc_norm``, ``cosine``) and the payload in their metadata;
sync and async calls must agree. One case runs through a real pgvector table.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever as LangChainBase
from llama_index.core.retrievers import BaseRetriever as LlamaBase
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from magretrieve.core.errors import ConfigError
from magretrieve.integrations.langchain import MagRetrieveRetriever as LangChainRetriever
from magretrieve.integrations.llama_index import MagRetrieveRetriever as LlamaRetriever
from magretrieve.serving.retriever import Retriever

QUERIES = ["what does smoking cause", "how obesity risk"]


@pytest.fixture(scope="module")
def export_dir(tiny_model_dir, tmp_path_factory):
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("export") / "qnorm"
    export_model(tiny_model_dir, out, mode="qnorm")
    return out


@pytest.fixture(params=["memory", "pgvector"])
def retriever(request, export_dir, tiny_beir_dir):
    if request.param == "memory":
        spec = "memory:"
    else:
        spec = f"pgvector:{request.getfixturevalue('pg_uri')}#lc_{request.node.name[-12:-1]}"
    r = Retriever.load(export_dir, store=spec)
    docs = [json.loads(line) for line in (tiny_beir_dir / "corpus.jsonl").read_text().splitlines()]
    for n, d in enumerate(docs):
        d["year"] = 2000 + n
    r.add_documents(docs)
    yield r
    r.close()


def check_metadata(meta: dict, hit) -> None:
    assert meta["id"] == hit.id
    assert meta["score"] == pytest.approx(hit.score)
    assert meta["doc_norm"] == pytest.approx(hit.doc_norm)
    assert meta["cosine"] == pytest.approx(hit.cosine)
    # the decomposition holds in what the framework sees
    assert meta["score"] == pytest.approx(
        meta["query_norm"] * meta["doc_norm"] * meta["cosine"], rel=1e-4, abs=1e-5
    )
    assert meta["payload"] == hit.payload
    assert meta["year"] == hit.payload["year"]  # payload fields are also top-level metadata
    assert meta["title"] == hit.payload["title"]


def test_langchain_invoke_returns_the_retrievers_hits(retriever):
    lc = LangChainRetriever(retriever=retriever, k=3)
    assert isinstance(lc, LangChainBase)
    for query in QUERIES:
        hits = retriever.search(query, k=3)
        docs = lc.invoke(query)
        assert all(isinstance(d, Document) for d in docs)
        assert [d.id for d in docs] == [h.id for h in hits]
        assert [d.page_content for d in docs] == [h.payload["text"] for h in hits]
        for d, h in zip(docs, hits, strict=True):
            check_metadata(d.metadata, h)
        # async path: same documents
        adocs = asyncio.run(lc.ainvoke(query))
        assert [(d.id, d.metadata["score"]) for d in adocs] == [
            (d.id, d.metadata["score"]) for d in docs
        ]
    batch = lc.batch(QUERIES)
    assert [[d.id for d in b] for b in batch] == [
        [h.id for h in retriever.search(q, k=3)] for q in QUERIES
    ]


def test_llama_index_retrieve_returns_nodes_with_scores(retriever):
    li = LlamaRetriever(retriever=retriever, similarity_top_k=4)
    assert isinstance(li, LlamaBase)
    for query in QUERIES:
        hits = retriever.search(query, k=4)
        nodes = li.retrieve(query)
        assert all(isinstance(n, NodeWithScore) for n in nodes)
        assert [n.node.node_id for n in nodes] == [h.id for h in hits]
        assert [n.score for n in nodes] == pytest.approx([h.score for h in hits])
        assert [n.node.get_content() for n in nodes] == [h.payload["text"] for h in hits]
        for n, h in zip(nodes, hits, strict=True):
            check_metadata(n.node.metadata, h)
        # the numbers stay out of what an LLM is shown; the user's fields stay in
        llm_view = nodes[0].node.get_content(metadata_mode=MetadataMode.LLM)
        assert "doc_norm" not in llm_view and "year: " in llm_view
        anodes = asyncio.run(li.aretrieve(query))
        assert [(n.node.node_id, n.score) for n in anodes] == [
            (n.node.node_id, n.score) for n in nodes
        ]
        assert [n.node.node_id for n in li.retrieve(QueryBundle(query_str=query))] == [
            h.id for h in hits
        ]


def test_bad_arguments_are_refused():
    with pytest.raises(ConfigError, match="k must be a positive integer, got 0"):
        LangChainRetriever(retriever=object.__new__(Retriever), k=0)
    with pytest.raises(ConfigError, match="magretrieve Retriever"):
        LangChainRetriever(retriever="faiss:idx", k=3)
    with pytest.raises(ConfigError, match="similarity_top_k must be a positive integer"):
        LlamaRetriever(retriever=object.__new__(Retriever), similarity_top_k=-1)
    with pytest.raises(ConfigError, match="magretrieve Retriever"):
        LlamaRetriever(retriever=None)
