"""The framework embeddings in remote mode, against a real ``magretrieve serve`` process.

``RemoteEncoder`` and the LangChain, LlamaIndex and Haystack classes built from a URL must give
the vectors ``OnnxEncoder`` gives in process (each side its own graph), split their requests to
the server's ``max_inputs``, and surface the server's refusals as one error without the key.
Each framework object pickles without the key and, unpickled (in LlamaIndex's multi-worker
ingestion: in spawned worker processes), embeds with ``$MAGRETRIEVE_API_KEY``; none follows a
redirect to another origin (a hostile server, tests/support/hostile.py).
End to end: a LangChain app with ``MagRetrieveEmbeddings`` in remote mode over ``PGVector``
(max inner product, a real PostgreSQL) ranks the corpus exactly as ``magretrieve search`` does.
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import re
import subprocess
import sys
import uuid

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")

import httpx
import numpy as np
import pytest

from magretrieve.serving.remote import RemoteEncoder, RemoteEncoderError
from tests.support.hostile import RawServer, redirect_to, well_behaved
from tests.support.server import KEY, SERVE, free_port, start_server

pytestmark = pytest.mark.integration

#: The server's limits here: 3 texts per request, 400 characters per text.
MAX_INPUTS = 3
MAX_CHARS = 400
QUERIES = ["statin mortality heart risk", "a", "ÜNÏCÖDÉ vitamin dose", "wing flow"]
MEDIUM = "the effect of statins on heart risk in patients " * 8  # under MAX_CHARS


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tiny_model_dir):
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("remote") / "export"
    export_model(tiny_model_dir, out, mode="qnorm")
    return out


@pytest.fixture(scope="module")
def encoder(export_dir):
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    return OnnxEncoder.load(export_dir, threads=1)


@pytest.fixture(scope="module")
def corpus(tiny_beir_dir):
    lines = (tiny_beir_dir / "corpus.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.fixture(scope="module")
def texts(corpus):
    return [f"{d['title']} {d['text']}".strip() for d in corpus] + [MEDIUM]


@pytest.fixture(scope="module")
def store(tmp_path_factory, export_dir, tiny_beir_dir):
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    folder = tmp_path_factory.mktemp("remote-store") / "ix"
    with Retriever.load(export_dir, store=f"faiss:{folder}") as r:
        index_corpus(r, tiny_beir_dir / "corpus.jsonl", progress=False)
    return folder


@pytest.fixture(scope="module")
def server(tmp_path_factory, export_dir):
    tmp = tmp_path_factory.mktemp("remote-serve")
    srv = start_server(
        export_dir,
        "--max-inputs", str(MAX_INPUTS), "--max-text-chars", str(MAX_CHARS),
        key=KEY, log_dir=tmp,
    )  # fmt: skip
    yield srv
    assert srv.stop() == 0, srv.stderr()[-3000:]
    assert "Traceback" not in srv.stderr()


def embedding_requests(server) -> int:
    """Successful ``POST /v1/embeddings`` requests the server has counted."""
    text = httpx.get(server.url + "/metrics").text
    m = re.search(
        r'magretrieve_requests_total\{method="POST",route="/v1/embeddings",status="200"\} (\S+)',
        text,
    )
    return int(float(m.group(1))) if m else 0


def close(got, want) -> None:
    np.testing.assert_allclose(np.asarray(got, dtype=np.float32), want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- the client


def test_remote_vectors_equal_onnx_on_both_sides_in_max_inputs_requests(server, encoder, texts):
    remote = RemoteEncoder(server.url, KEY)
    assert remote.max_inputs == MAX_INPUTS and remote.dim == encoder.dim
    before = embedding_requests(server)
    docs = remote.encode_documents(texts)
    assert embedding_requests(server) - before == -(-len(texts) // MAX_INPUTS)
    close(docs, encoder.encode_documents(texts))
    norms = np.linalg.norm(docs, axis=1)
    assert max(norms) > 1.05 * min(norms)  # document magnitude kept
    queries = remote.encode_queries(QUERIES)
    close(queries, encoder.encode_queries(QUERIES))
    assert np.linalg.norm(queries, axis=1) == pytest.approx(1.0, abs=1e-5)
    # a smaller batch_size than the server's limit is honoured too
    before = embedding_requests(server)
    close(remote.encode_documents(texts[:4], batch_size=1), docs[:4])
    assert embedding_requests(server) - before == 4
    assert remote.encode_documents([]).shape == (0, encoder.dim)


def test_remote_refusals_are_one_error_with_the_servers_message(server):
    wrong = "S3CRwrong-" + uuid.uuid4().hex[:8]
    for key in (wrong, None):
        with pytest.raises(RemoteEncoderError, match="answered 401: missing or wrong API key") as e:
            RemoteEncoder(server.url, key).encode_queries(["q"])
        assert wrong not in str(e.value)
    remote = RemoteEncoder(server.url, KEY)
    assert KEY not in repr(remote) and "api_key=set" in repr(remote)
    # a text over the server's limit: the server's 413 message, and which request it was
    too_long = "x " * MAX_CHARS
    with pytest.raises(RemoteEncoderError) as e:
        remote.encode_documents(["a", "b", "c", "d", too_long])
    message = str(e.value)
    assert "answered 413" in message and f"at most {MAX_CHARS} per text" in message, message
    assert "request of texts #3" in message and KEY not in message
    with pytest.raises(RemoteEncoderError, match=r"cannot reach POST http://127\.0\.0\.1:\d+"):
        RemoteEncoder(f"http://127.0.0.1:{free_port()}", KEY)._post(["a"], "query", 0)


# ----------------------------------------------------------------------------- frameworks


def test_langchain_and_llama_index_remote_give_each_side_its_graph(
    server, encoder, texts, monkeypatch
):
    from magretrieve.integrations.langchain import MagRetrieveEmbeddings
    from magretrieve.integrations.llama_index import MagRetrieveEmbedding

    monkeypatch.setenv("MAGRETRIEVE_API_KEY", KEY)  # both take the key from there by default
    want_docs, want_q = encoder.encode_documents(texts), encoder.encode_queries(QUERIES)
    lc = MagRetrieveEmbeddings(url=server.url)
    close(lc.embed_documents(texts), want_docs)
    close([lc.embed_query(q) for q in QUERIES], want_q)
    close(asyncio.run(lc.aembed_documents(texts)), want_docs)
    close(asyncio.run(lc.aembed_query(QUERIES[2])), want_q[2])
    assert KEY not in repr(lc) and KEY not in lc.model_dump_json()

    li = MagRetrieveEmbedding(url=server.url, embed_batch_size=5)
    close(li.get_text_embedding_batch(texts), want_docs)
    close(li.get_query_embedding(QUERIES[0]), want_q[0])
    close(asyncio.run(li.aget_text_embedding_batch(texts)), want_docs)
    close(asyncio.run(li.aget_query_embedding(QUERIES[3])), want_q[3])
    assert KEY not in json.dumps(li.to_dict()) and KEY not in repr(li)


def test_haystack_remote_pipelines_rank_as_the_retriever(
    server, encoder, export_dir, store, corpus, monkeypatch
):
    from haystack import Document, Pipeline
    from haystack.components.retrievers.in_memory import InMemoryEmbeddingRetriever
    from haystack.components.writers import DocumentWriter
    from haystack.document_stores.in_memory import InMemoryDocumentStore

    from magretrieve.integrations.haystack import (
        MagRetrieveDocumentEmbedder,
        MagRetrieveTextEmbedder,
    )
    from magretrieve.serving.retriever import Retriever

    monkeypatch.setenv("MAGRETRIEVE_API_KEY", KEY)
    doc_store = InMemoryDocumentStore(embedding_similarity_function="dot_product")
    indexing = Pipeline()
    indexing.add_component("embed", MagRetrieveDocumentEmbedder(url=server.url, batch_size=2))
    indexing.add_component("write", DocumentWriter(document_store=doc_store))
    indexing.connect("embed.documents", "write.documents")
    assert KEY not in indexing.dumps()
    docs = [Document(id=d["_id"], content=d["text"], meta={"title": d["title"]}) for d in corpus]
    indexing.run({"embed": {"documents": docs}})
    stored = {d.id: d for d in doc_store.filter_documents()}
    assert len(stored) == len(corpus) and all(d.embedding for d in stored.values())
    want = encoder.encode_documents([f"{d['title']} {d['text']}".strip() for d in corpus])
    close([stored[d["_id"]].embedding for d in corpus], want)

    query = Pipeline()
    query.add_component("embed", MagRetrieveTextEmbedder(url=server.url))
    query.add_component("search", InMemoryEmbeddingRetriever(document_store=doc_store, top_k=5))
    query.connect("embed.embedding", "search.query_embedding")
    with Retriever.load(export_dir, store=f"faiss:{store}", create=False) as reference:
        for text in QUERIES:
            found = query.run({"embed": {"text": text}})["search"]["documents"]
            hits = reference.search(text, k=5)
            assert [d.id for d in found] == [h.id for h in hits]
            assert [d.score for d in found] == pytest.approx([h.score for h in hits], abs=1e-4)


# ----------------------------------------------------------------------------- the key


def remote_objects(url: str, key: str) -> dict[str, object]:
    """Each framework's remote embedding object, the key given as a value (not from the env)."""
    from haystack.utils import Secret

    from magretrieve.integrations.haystack import MagRetrieveTextEmbedder
    from magretrieve.integrations.langchain import MagRetrieveEmbeddings
    from magretrieve.integrations.llama_index import MagRetrieveEmbedding

    return {
        "langchain": MagRetrieveEmbeddings(url=url, api_key=key, timeout=5),
        "llama_index": MagRetrieveEmbedding(url=url, api_key=key, timeout=5),
        "haystack": MagRetrieveTextEmbedder(url=url, api_key=Secret.from_token(key), timeout=5),
    }


def embed_query(name: str, obj, text: str):
    if name == "langchain":
        return obj.embed_query(text)
    if name == "llama_index":
        return obj.get_query_embedding(text)
    return obj.run(text=text)["embedding"]


def test_pickled_framework_objects_hold_no_key_and_embed_with_the_environments(
    server, encoder, monkeypatch
):
    monkeypatch.delenv("MAGRETRIEVE_API_KEY", raising=False)
    objects = remote_objects(server.url, KEY)
    blob = pickle.dumps(objects)
    assert KEY.encode() not in blob
    # this process has no key: each unpickled object is refused by the server, the key unsaid
    for name, obj in pickle.loads(blob).items():
        with pytest.raises(RemoteEncoderError, match="answered 401") as e:
            embed_query(name, obj, QUERIES[0])
        assert KEY not in str(e.value), name
    # with $MAGRETRIEVE_API_KEY set (a worker's environment) they embed as the originals do
    monkeypatch.setenv("MAGRETRIEVE_API_KEY", KEY)
    want = encoder.encode_queries([QUERIES[2]])[0]
    for name, obj in pickle.loads(blob).items():
        close(embed_query(name, obj, QUERIES[2]), want)
        close(embed_query(name, objects[name], QUERIES[2]), want)
    with pytest.raises(TypeError, match="not pickled: it holds the server's API key"):
        pickle.dumps(RemoteEncoder(server.url, KEY))


def test_llama_index_multi_worker_ingestion_embeds_with_the_environments_key(
    server, encoder, texts, monkeypatch
):
    """What LlamaIndex does with ``num_workers``: pickle the embed model into spawned workers."""
    from llama_index.core import Document as LlamaDocument
    from llama_index.core.ingestion import IngestionPipeline

    from magretrieve.integrations.llama_index import MagRetrieveEmbedding

    monkeypatch.setenv("MAGRETRIEVE_API_KEY", KEY)
    pipeline = IngestionPipeline(transformations=[MagRetrieveEmbedding(url=server.url)])
    docs = [LlamaDocument(text=t, id_=f"d{n}") for n, t in enumerate(texts[:6])]
    nodes = pipeline.run(documents=docs, num_workers=2)
    got = {n.node_id: n.embedding for n in nodes}
    close([got[f"d{n}"] for n in range(6)], encoder.encode_documents(texts[:6]))


@pytest.mark.parametrize("framework", ["langchain", "llama_index", "haystack"])
def test_framework_objects_follow_no_redirect_to_another_origin(framework):
    with RawServer(well_behaved) as target:
        with RawServer(redirect_to(target.url + "/info", 302)) as redirector:
            obj = remote_objects(redirector.url, KEY)[framework]
            with pytest.raises(RemoteEncoderError, match=r"answered 302, a redirect to") as e:
                embed_query(framework, obj, "q")
        assert target.seen == [], framework  # the key never left for the other port
    assert f"{target.url}/info" in str(e.value) and KEY not in str(e.value)


# ----------------------------------------------------------------------------- end to end


def cli_search(export_dir, store, query: str, k: int) -> list[dict]:
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, "search", str(export_dir), "--store", f"faiss:{store}",
         query, "-k", str(k), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["hits"]


def test_langchain_pgvector_app_over_a_remote_server_ranks_as_magretrieve_search(
    server, export_dir, store, corpus, pg_uri
):
    """A LangChain app as a user writes it: PGVector by max inner product, magretrieve serve."""
    from langchain_core.documents import Document
    from langchain_postgres import PGVector
    from langchain_postgres.vectorstores import DistanceStrategy

    from magretrieve.integrations.langchain import MagRetrieveEmbeddings

    embeddings = MagRetrieveEmbeddings(url=server.url, api_key=KEY)
    connection = pg_uri.replace("postgresql://", "postgresql+psycopg://", 1)
    vs = PGVector(
        embeddings=embeddings,
        collection_name=f"lc_{uuid.uuid4().hex[:8]}",
        connection=connection,
        distance_strategy=DistanceStrategy.MAX_INNER_PRODUCT,
        use_jsonb=True,
    )
    try:
        assert embeddings.check_store(vs) == "inner_product"
        vs.add_documents(
            [
                Document(
                    page_content=f"{d['title']} {d['text']}".strip(), metadata={"id": d["_id"]}
                )
                for d in corpus
            ],
            ids=[d["_id"] for d in corpus],
        )
        k = len(corpus)  # the whole corpus, in order
        for query in QUERIES:
            want = cli_search(export_dir, store, query, k)
            got = vs.similarity_search_with_score(query, k=k)
            assert [d.metadata["id"] for d, _ in got] == [h["id"] for h in want]
            # PGVector reports the negative inner product as its distance
            assert [-s for _, s in got] == pytest.approx([h["score"] for h in want], abs=1e-4)
    finally:
        vs.delete_collection()
