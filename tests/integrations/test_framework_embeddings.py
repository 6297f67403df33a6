"""LangChain ``MagRetrieveEmbeddings`` and LlamaIndex ``MagRetrieveEmbedding`` over a real export
(tiny ONNX model), in process: each side's vectors equal ``OnnxEncoder``'s, sync and async, in
any batching; bad input is one clear error; ``check_vector_store`` reads the real store objects
of the installed framework packages. The remote mode runs against a real server in
tests/integrations/test_framework_remote.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import warnings

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import numpy as np
import pytest
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import InMemoryVectorStore
from llama_index.core.base.embeddings.base import BaseEmbedding

from magretrieve.core.errors import ConfigError, StoreError
from magretrieve.integrations.langchain import (
    MagRetrieveEmbeddings,
    MagRetrieveRetriever,
)
from magretrieve.integrations.llama_index import MagRetrieveEmbedding
from magretrieve.integrations.vector_stores import (
    MagnitudeWarning,
    check_vector_store,
    store_ranking,
)
from magretrieve.serving.onnx_encoder import OnnxEncoder
from magretrieve.serving.retriever import Retriever

QUERIES = ["what does smoking cause", "how obesity risk", "ÜNÏCÖDÉ vitamin"]
pytestmark = pytest.mark.filterwarnings("ignore:Payload indexes have no effect:UserWarning")
BLANKS = ["", "   ", "\u200b", "\x00\x01\x7f", "\u200d\ufeff", "\u0301"]


@pytest.fixture(scope="module")
def export_dir(tiny_model_dir, tmp_path_factory):
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("export") / "qnorm"
    export_model(tiny_model_dir, out, mode="qnorm")
    return out


@pytest.fixture(scope="module")
def encoder(export_dir):
    return OnnxEncoder.load(export_dir)


@pytest.fixture(scope="module")
def texts(tiny_beir_dir):
    lines = (tiny_beir_dir / "corpus.jsonl").read_text().splitlines()
    return [f"{d['title']} {d['text']}".strip() for d in map(json.loads, lines)]


def close(got, want) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- LangChain


def test_langchain_embeddings_give_each_side_its_graph(export_dir, encoder, texts):
    emb = MagRetrieveEmbeddings(export_dir=str(export_dir))
    assert isinstance(emb, Embeddings)
    docs = emb.embed_documents(texts)
    assert isinstance(docs, list) and all(isinstance(v, list) for v in docs)
    assert all(isinstance(x, float) for x in docs[0])
    close(docs, encoder.encode_documents(texts))
    for q in QUERIES:
        close(emb.embed_query(q), encoder.encode_queries([q])[0])
    # the two sides differ: queries unit length (qnorm), documents keep their magnitude
    norms = np.linalg.norm(np.asarray(docs), axis=1)
    assert max(norms) > 1.05 * min(norms)
    assert np.linalg.norm(emb.embed_query(QUERIES[0])) == pytest.approx(1.0, abs=1e-5)
    assert not np.allclose(emb.embed_query(texts[0]), docs[0], atol=1e-3)
    # async paths give the same vectors
    close(asyncio.run(emb.aembed_documents(texts)), np.asarray(docs))
    close(asyncio.run(emb.aembed_query(QUERIES[1])), np.asarray(emb.embed_query(QUERIES[1])))
    # any batching gives the same vectors
    small = MagRetrieveEmbeddings(export_dir=str(export_dir), batch_size=2, threads=1)
    close(small.embed_documents(texts), np.asarray(docs))
    assert emb.embed_documents([]) == []


def test_langchain_in_memory_store_ranks_by_cosine_and_is_flagged(export_dir, encoder, texts):
    emb = MagRetrieveEmbeddings(export_dir=str(export_dir))
    store = InMemoryVectorStore(embedding=emb)
    store.add_texts(texts, ids=[str(i) for i in range(len(texts))])
    # what the store computes: cosine, so the magnitude plays no part (the claim of the docs)
    q = encoder.encode_queries([QUERIES[0]])[0]
    d = encoder.encode_documents(texts)
    cosine = d @ q / (np.linalg.norm(d, axis=1) * np.linalg.norm(q))
    found = store.similarity_search_with_score(QUERIES[0], k=len(texts))
    assert [float(s) for _, s in found] == pytest.approx(sorted(cosine, reverse=True), rel=1e-4)
    with pytest.warns(MagnitudeWarning, match="InMemoryVectorStore ranks by cosine"):
        assert emb.check_store(store) == "cosine"
    with pytest.warns(MagnitudeWarning):  # a retriever made from the store: the same store
        check_vector_store(store.as_retriever())


def test_langchain_qdrant_store_distance_is_read(export_dir):
    from langchain_qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient
    from qdrant_client.models import Distance, VectorParams

    emb = MagRetrieveEmbeddings(export_dir=str(export_dir))
    client = QdrantClient(":memory:")
    for name, distance in (("dot", Distance.DOT), ("cos", Distance.COSINE)):
        client.create_collection(name, vectors_config=VectorParams(size=32, distance=distance))
    dot = QdrantVectorStore(
        client=client, collection_name="dot", embedding=emb, distance=Distance.DOT
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_vector_store(dot) == "inner_product"
    from haystack.utils import Secret
    from haystack_integrations.document_stores.pgvector import PgvectorDocumentStore

    unused = Secret.from_token("postgresql://u@127.0.0.1:1/x")  # read only: nothing connects
    with pytest.warns(MagnitudeWarning, match="vector_function=cosine_similarity"):  # default
        check_vector_store(PgvectorDocumentStore(connection_string=unused))
    ip = PgvectorDocumentStore(connection_string=unused, vector_function="inner_product")
    assert store_ranking(ip)[0] == "inner_product"
    cos = QdrantVectorStore(client=client, collection_name="cos", embedding=emb)
    with pytest.warns(MagnitudeWarning, match="distance=cosine"):
        assert check_vector_store(cos) == "cosine"


def test_langchain_pgvector_strategy_is_read():
    from langchain_postgres import PGVector
    from langchain_postgres.vectorstores import DistanceStrategy

    # read from the object only: no connection is made by the check
    store = PGVector.__new__(PGVector)
    store._distance_strategy = DistanceStrategy.MAX_INNER_PRODUCT
    assert store_ranking(store)[0] == "inner_product"
    store._distance_strategy = DistanceStrategy.COSINE
    with pytest.warns(MagnitudeWarning):
        assert check_vector_store(store) == "cosine"


def test_langchain_retriever_refuses_a_bool_k():
    dummy = object.__new__(Retriever)
    for bad in (True, False, 0, -2, 2.5, "3"):
        with pytest.raises(ConfigError, match="k must be a positive integer"):
            MagRetrieveRetriever(retriever=dummy, k=bad)
    assert MagRetrieveRetriever(retriever=dummy, k=3).k == 3


# ----------------------------------------------------------------------------- LlamaIndex


def test_llama_index_embedding_gives_each_side_its_graph(export_dir, encoder, texts):
    emb = MagRetrieveEmbedding(export_dir=str(export_dir), embed_batch_size=3)
    assert isinstance(emb, BaseEmbedding)
    want_docs = encoder.encode_documents(texts)
    # get_text_embedding_batch calls _get_text_embeddings with 3 texts at a time
    close(emb.get_text_embedding_batch(texts), want_docs)
    close(emb.get_text_embedding(texts[1]), want_docs[1])
    for q in QUERIES:
        close(emb.get_query_embedding(q), encoder.encode_queries([q])[0])
    close(asyncio.run(emb.aget_text_embedding_batch(texts)), want_docs)
    close(asyncio.run(emb.aget_text_embedding(texts[2])), want_docs[2])
    close(asyncio.run(emb.aget_query_embedding(QUERIES[0])), encoder.encode_queries(QUERIES[:1])[0])
    assert emb.class_name() == "MagRetrieveEmbedding"


def test_components_over_one_export_share_one_engine_and_its_batches(export_dir, encoder):
    """LangChain's and LlamaIndex's embeddings over the same export encode through one engine
    (one copy of the graphs): their concurrent async calls are merged into shared graph runs,
    and each still gets its own vector."""
    import time

    from magretrieve.serving.engine import shared_engine

    chain = MagRetrieveEmbeddings(export_dir=str(export_dir))
    llama = MagRetrieveEmbedding(export_dir=str(export_dir))
    chain.embed_query(QUERIES[0])  # both open the export here, once
    engine = shared_engine(str(export_dir))
    assert llama._encoder.get("query") is engine is chain._encoder.get("query")
    batches: list[tuple[int, int]] = []

    class Count:
        def on_batch(self, side, texts, requests):
            batches.append((texts, requests))

        def on_queue_depth(self, waiting):
            pass

        def on_rejected(self):
            pass

        def on_encoded(self, side, tokens, truncated):
            pass

    slow = {"first": True}
    graphs = [e for e in (engine.encoder, engine.all_threads_encoder) if e is not None]
    originals = [g.encode_tokenized for g in graphs]

    def held(original):
        def run(*args, **kwargs):
            if slow.pop("first", False):
                time.sleep(0.3)  # the first run is slow: the other calls queue behind it
            return original(*args, **kwargs)

        return run

    queries = [f"{q} {i}" for i in range(6) for q in QUERIES]

    async def both():
        calls = [
            chain.aembed_query(q) if i % 2 else llama.aget_query_embedding(q)
            for i, q in enumerate(queries)
        ]
        return await asyncio.gather(*calls)

    engine.set_observer(Count())
    for g in graphs:
        g.encode_tokenized = held(g.encode_tokenized)
    try:
        got = asyncio.run(both())
    finally:
        engine.set_observer(None)
        for g, original in zip(graphs, originals, strict=True):
            g.encode_tokenized = original
    close(got, encoder.encode_queries(queries))
    assert sum(texts for texts, _ in batches) == len(queries)
    assert len(batches) < len(queries) and max(r for _, r in batches) > 1  # calls were merged


def test_llama_index_default_store_is_cosine_and_qdrant_dot_is_kept(export_dir, encoder, texts):
    from llama_index.core import StorageContext, VectorStoreIndex
    from llama_index.core.schema import TextNode
    from llama_index.core.vector_stores import SimpleVectorStore
    from llama_index.vector_stores.qdrant import QdrantVectorStore
    from qdrant_client import QdrantClient
    from qdrant_client.http import models as rest

    emb = MagRetrieveEmbedding(export_dir=str(export_dir))
    nodes = [TextNode(text=t, id_=str(i)) for i, t in enumerate(texts)]
    index = VectorStoreIndex(nodes, embed_model=emb)
    assert isinstance(index.vector_store, SimpleVectorStore)
    with pytest.warns(MagnitudeWarning, match="SimpleVectorStore"):
        assert emb.check_store(index) == "cosine"
    client = QdrantClient(":memory:")
    dot = QdrantVectorStore(
        collection_name="li_dot",
        client=client,
        dense_config=rest.VectorParams(size=encoder.dim, distance=rest.Distance.DOT),
    )
    VectorStoreIndex(
        [TextNode(text=t) for t in texts],  # Qdrant takes UUID ids (TextNode's default)
        embed_model=emb,
        storage_context=StorageContext.from_defaults(vector_store=dot),
    )
    assert client.get_collection("li_dot").config.params.vectors.distance == rest.Distance.DOT
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert emb.check_store(dot) == "inner_product"
    with pytest.warns(MagnitudeWarning, match="Distance.COSINE"):
        assert emb.check_store(QdrantVectorStore(collection_name="new", client=client)) == "cosine"


def test_haystack_store_settings_are_read():
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_vector_store(InMemoryDocumentStore()) == "inner_product"  # its default
    from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever

    cosine = InMemoryDocumentStore(embedding_similarity_function="cosine")
    with pytest.warns(MagnitudeWarning, match="embedding_similarity_function=cosine"):
        check_vector_store(cosine)
    with pytest.warns(MagnitudeWarning):  # read through the retriever that holds it
        check_vector_store(InMemoryEmbeddingRetriever(document_store=cosine))
    assert store_ranking(object())[0] == "unknown"
    from haystack_integrations.document_stores.qdrant import QdrantDocumentStore

    with pytest.warns(MagnitudeWarning, match="similarity=cosine"):  # its default
        check_vector_store(QdrantDocumentStore(location=":memory:", embedding_dim=8))
    dot = QdrantDocumentStore(location=":memory:", embedding_dim=8, similarity="dot_product")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_vector_store(dot) == "inner_product"
    from haystack.utils import Secret
    from haystack_integrations.document_stores.pgvector import PgvectorDocumentStore

    unused = Secret.from_token("postgresql://u@127.0.0.1:1/x")  # read only: nothing connects
    with pytest.warns(MagnitudeWarning, match="vector_function=cosine_similarity"):  # default
        check_vector_store(PgvectorDocumentStore(connection_string=unused))
    ip = PgvectorDocumentStore(connection_string=unused, vector_function="inner_product")
    assert store_ranking(ip)[0] == "inner_product"


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("cls", [MagRetrieveEmbeddings, MagRetrieveEmbedding])
def test_bad_arguments_are_one_line_errors(cls, export_dir):
    with pytest.raises(ConfigError, match="either export_dir .* or url .*not neither"):
        cls()
    with pytest.raises(ConfigError, match="not both"):
        cls(export_dir=str(export_dir), url="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="must start with http"):
        cls(url="127.0.0.1:8000")
    with pytest.raises(ConfigError, match="must not hold credentials") as info:
        cls(url="http://user:S3CRETpw@127.0.0.1:1")
    assert "S3CRETpw" not in str(info.value)
    with pytest.raises(ConfigError, match="threads must be a positive integer, got True"):
        cls(export_dir=str(export_dir), threads=True)
    with pytest.raises(ConfigError, match="timeout must be a positive number"):
        cls(url="http://127.0.0.1:1", timeout=0)


def test_blank_and_non_string_texts_are_refused_before_encoding(export_dir):
    lc = MagRetrieveEmbeddings(export_dir=str(export_dir))
    li = MagRetrieveEmbedding(export_dir=str(export_dir))
    for blank in BLANKS:
        with pytest.raises(ConfigError, match=r"text #1 is empty or only whitespace"):
            lc.embed_documents(["fine", blank])
        with pytest.raises(ConfigError, match=r"text #0 is empty or only whitespace"):
            lc.embed_query(blank)
        with pytest.raises(ConfigError, match=r"text #0 is empty or only whitespace"):
            li.get_query_embedding(blank)
        with pytest.raises(ConfigError, match=r"text #1 is empty or only whitespace"):
            li.get_text_embedding_batch(["fine", blank])
    with pytest.raises(ConfigError, match="text #0 is a int, not a string"):
        lc.embed_documents([3])
    with pytest.raises(ConfigError, match="embed_query takes one string"):
        lc.embed_query(["a"])
    with pytest.raises(ConfigError, match="lone surrogate"):
        lc.embed_documents(["ok \udc80"])
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        MagRetrieveEmbeddings(export_dir=str(export_dir), batch_size=0)


def test_retriever_search_refuses_blank_queries_as_the_server_does(export_dir, tiny_beir_dir):
    docs = [json.loads(line) for line in (tiny_beir_dir / "corpus.jsonl").read_text().splitlines()]
    with Retriever.load(export_dir, store="memory:") as r:
        r.add_documents(docs)
        for blank in BLANKS:
            with pytest.raises(
                StoreError, match="query #0 is empty or only whitespace and invisible"
            ):
                r.search(blank, k=2)
        with pytest.raises(StoreError, match="query #1"):
            r.search_batch(["fine", "\u200b\u200b"], k=2)
        assert len(r.search("smoking", k=2)) == 2


def test_remote_requests_are_split_by_the_servers_text_and_byte_limits():
    """How RemoteEncoder splits texts, from a server's /info (the real server: test_framework_remote)."""
    from magretrieve.serving.remote import RemoteEncoder, decode_embedding

    remote = RemoteEncoder("http://127.0.0.1:1", "S3CRkey-value")
    remote._info = {"dimension": 4, "limits": {"max_inputs": 4, "max_body_bytes": 1000}}
    texts = ["x" * 300] * 5
    # 90% of 1000 bytes = 900: two 300-character texts (304 bytes framed each) per request
    assert remote._batches(texts, 4) == [(0, 2), (2, 4), (4, 5)]
    assert remote._batches(["a"] * 9, 4) == [(0, 4), (4, 8), (8, 9)]
    # non-ASCII is sent escaped (json.dumps), so it counts 6 bytes a character
    assert remote._batches(["é" * 100] * 3, 4) == [(0, 1), (1, 2), (2, 3)]
    assert remote._batches(["x" * 2000, "a"], 4) == [(0, 1), (1, 2)]  # one text alone may pass
    vec = np.array([1.5, -2.0, 0.0, 3.25], dtype=np.float32)
    assert decode_embedding(base64.b64encode(vec.astype("<f4").tobytes()).decode()).tolist() == (
        vec.tolist()
    )
    assert decode_embedding([1.5, -2.0, 0.0, 3.25]).tolist() == vec.tolist()
    assert "S3CRkey-value" not in repr(remote)


def test_remote_framework_objects_keep_the_key_out_of_text_and_pickles(monkeypatch):
    """No repr, str, dump or pickle of a framework's remote object holds the key; unpickled, the
    object reads ``$MAGRETRIEVE_API_KEY`` where it is unpickled; a copy in this process keeps it.
    (The same against a real server and in LlamaIndex's worker processes: test_framework_remote.)"""
    import copy
    import pickle

    from haystack.utils import Secret

    from magretrieve.integrations.haystack import (
        MagRetrieveDocumentEmbedder,
        MagRetrieveTextEmbedder,
    )

    key, url = "S3CRpickled-key-1234", "http://127.0.0.1:1"
    monkeypatch.delenv("MAGRETRIEVE_API_KEY", raising=False)
    objects = [
        MagRetrieveEmbeddings(url=url, api_key=key),
        MagRetrieveEmbedding(url=url, api_key=key),
        MagRetrieveTextEmbedder(url=url, api_key=Secret.from_token(key)),
        MagRetrieveDocumentEmbedder(url=url, api_key=Secret.from_token(key)),
    ]

    def sent(obj) -> str | None:
        """The key the object's client sends (the client is made, no request is)."""
        return obj._encoder.get("query")._api_key

    for obj in objects:
        name = type(obj).__name__
        assert sent(obj) == key, name
        texts = [repr(obj), str(obj)]
        if hasattr(obj, "model_dump_json"):
            texts += [obj.model_dump_json(), repr(obj.model_dump())]
        if hasattr(obj, "to_json"):
            texts.append(obj.to_json())
        assert not any(key in t for t in texts), name
        blob = pickle.dumps(obj)
        assert key.encode() not in blob, name
        assert sent(pickle.loads(blob)) is None, name  # no key in this environment
        monkeypatch.setenv("MAGRETRIEVE_API_KEY", "S3CRworker-key")
        assert sent(pickle.loads(blob)) == "S3CRworker-key", name
        monkeypatch.delenv("MAGRETRIEVE_API_KEY")
        assert sent(copy.deepcopy(obj)) == key, name
    # a key named by its variable stays that variable through a pickle
    named = MagRetrieveTextEmbedder(url=url, api_key=Secret.from_env_var("MR_TEST_OTHER_KEY"))
    monkeypatch.setenv("MR_TEST_OTHER_KEY", "S3CRother-key")
    assert sent(pickle.loads(pickle.dumps(named))) == "S3CRother-key"
