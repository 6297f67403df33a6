"""The client packages people already run, unchanged, against a real ``magretrieve serve``.

One server process (tiny qnorm export, a key) for the module. Each client names the side
with what it can set: a side-named model id (``export:query`` / ``export:document``, the
export folder's name), a per-side base URL (``URL/query/v1``, ``URL/document``), TEI's
``prompt_name``, Voyage's or Cohere's ``input_type``. Vectors must equal ``OnnxEncoder``
within 1e-5 on both sides, and document norms must come back as they are (not 1). The
settings each test uses are the ones docs/serve.md prints in its client table.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from tests.support.server import KEY, TEXTS, start_server

pytestmark = pytest.mark.integration

# litellm fetches a model cost map from the network on import unless told to use its own copy
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

#: The served ids of the tiny export (its folder is named "export").
BARE, QUERY_ID, DOC_ID = "export", "export:query", "export:document"
QUERY = "statin heart risk"
#: More documents than one request of LangChain's default chunk_size (1000) holds.
MANY = [f"{TEXTS[i % len(TEXTS)]} {i}" for i in range(1100)]


@pytest.fixture(scope="module")
def server(tmp_path_factory, export_dir):
    srv = start_server(export_dir, key=KEY, log_dir=tmp_path_factory.mktemp("serve-clients"))
    yield srv
    assert srv.stop() == 0, srv.stderr()[-3000:]
    assert "Traceback" not in srv.stderr()


@pytest.fixture(scope="module")
def ref(export_dir):
    """Reference vectors: (texts, side) -> OnnxEncoder's vectors."""
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    enc = OnnxEncoder.load(export_dir, threads=1)

    def vectors(texts: list[str], side: str) -> np.ndarray:
        if side == "query":
            return enc.encode_queries(texts)
        return enc.encode_documents(texts)

    return vectors


def assert_equal(got, expected: np.ndarray, side: str) -> None:
    got = np.asarray(got, dtype=np.float32).reshape(expected.shape)
    assert np.abs(got - expected).max() <= 1e-5
    norms = np.linalg.norm(got, axis=1)
    if side == "query":  # qnorm: unit queries
        np.testing.assert_allclose(norms, 1.0, atol=1e-5)
    else:  # documents keep their magnitude: not 1, and not all alike
        np.testing.assert_allclose(norms, np.linalg.norm(expected, axis=1), rtol=1e-5)
        assert not np.allclose(norms, 1.0, atol=1e-2) and np.ptp(norms) > 1e-3


# ----------------------------------------------------------------------------- openai


def test_openai_sync_with_side_model_ids_and_routes(server, ref) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in client.models.list()] == [QUERY_ID, DOC_ID]
    docs = client.embeddings.create(model=DOC_ID, input=TEXTS)  # base64, the client's default
    assert_equal([d.embedding for d in docs.data], ref(TEXTS, "document"), "document")
    query = client.embeddings.create(model=QUERY_ID, input=QUERY, encoding_format="float")
    assert_equal([query.data[0].embedding], ref([QUERY], "query"), "query")
    for side in ("query", "document"):  # a base URL per side, the bare id as the model
        routed = OpenAI(base_url=f"{server.url}/{side}/v1", api_key=KEY, max_retries=0)
        resp = routed.embeddings.create(model=BARE, input=TEXTS)
        assert_equal([d.embedding for d in resp.data], ref(TEXTS, side), side)


def test_openai_async_with_side_model_ids_and_routes(server, ref) -> None:
    from openai import AsyncOpenAI

    async def run() -> list:
        by_id = AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
        by_route = AsyncOpenAI(base_url=server.url + "/query/v1", api_key=KEY, max_retries=0)
        return await asyncio.gather(
            by_id.embeddings.create(model=DOC_ID, input=TEXTS),
            by_id.embeddings.create(model=QUERY_ID, input=TEXTS),
            by_route.embeddings.create(model=BARE, input=TEXTS),
        )

    docs, queries, routed = asyncio.run(run())
    assert_equal([d.embedding for d in docs.data], ref(TEXTS, "document"), "document")
    assert_equal([d.embedding for d in queries.data], ref(TEXTS, "query"), "query")
    assert_equal([d.embedding for d in routed.data], ref(TEXTS, "query"), "query")


def test_openai_without_a_side_gets_the_422_that_lists_the_ways(server) -> None:
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.UnprocessableEntityError, match="export:query"):
        client.embeddings.create(model=BARE, input="x")
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.embeddings.create(model="text-embedding-3-small", input="x")


# ----------------------------------------------------------------------------- LangChain


def test_langchain_openai_embeddings_one_object_per_side(server, ref) -> None:
    from langchain_openai import OpenAIEmbeddings

    common = {"api_key": KEY, "check_embedding_ctx_length": False, "max_retries": 0}
    documents = OpenAIEmbeddings(model=DOC_ID, base_url=server.url + "/v1", **common)
    queries = OpenAIEmbeddings(model=QUERY_ID, base_url=server.url + "/v1", **common)
    assert documents.chunk_size == 1000  # its default: 1,100 texts go in two requests
    assert_equal(documents.embed_documents(MANY), ref(MANY, "document"), "document")
    assert_equal([queries.embed_query(QUERY)], ref([QUERY], "query"), "query")
    assert_equal([asyncio.run(queries.aembed_query(QUERY))], ref([QUERY], "query"), "query")
    # or a base URL per side, the bare id as the model
    routed = OpenAIEmbeddings(model=BARE, base_url=server.url + "/document/v1", **common)
    got = asyncio.run(routed.aembed_documents(TEXTS))
    assert_equal(got, ref(TEXTS, "document"), "document")


def test_langchain_cohere_embeddings_one_object_gets_both_sides(server, ref) -> None:
    from langchain_cohere import CohereEmbeddings

    emb = CohereEmbeddings(model=BARE, base_url=server.url, cohere_api_key=KEY)
    assert_equal(emb.embed_documents(TEXTS), ref(TEXTS, "document"), "document")
    assert_equal([emb.embed_query(QUERY)], ref([QUERY], "query"), "query")
    assert_equal(asyncio.run(emb.aembed_documents(TEXTS)), ref(TEXTS, "document"), "document")
    assert_equal([asyncio.run(emb.aembed_query(QUERY))], ref([QUERY], "query"), "query")


def test_cohere_sdk_parses_v1_and_v2_answers(server, ref) -> None:
    import cohere

    v1 = cohere.Client(api_key=KEY, base_url=server.url)
    floats = v1.embed(texts=TEXTS, model=BARE, input_type="search_document")
    assert floats.response_type == "embeddings_floats"
    assert_equal(floats.embeddings, ref(TEXTS, "document"), "document")
    by_type = v1.embed(
        texts=[QUERY], model=BARE, input_type="search_query", embedding_types=["float"]
    )
    assert_equal(by_type.embeddings.float_, ref([QUERY], "query"), "query")
    v2 = cohere.ClientV2(api_key=KEY, base_url=server.url)
    resp = v2.embed(
        texts=TEXTS, model=BARE, input_type="search_document", embedding_types=["float"]
    )
    assert_equal(resp.embeddings.float_, ref(TEXTS, "document"), "document")
    assert resp.meta.billed_units.input_tokens > 0


# ----------------------------------------------------------------------------- LlamaIndex


def test_llama_index_openai_like_embedding(server, ref) -> None:
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    documents = OpenAILikeEmbedding(model_name=DOC_ID, api_base=server.url + "/v1", api_key=KEY)
    queries = OpenAILikeEmbedding(model_name=QUERY_ID, api_base=server.url + "/v1", api_key=KEY)
    got = documents.get_text_embedding_batch(TEXTS)
    assert_equal(got, ref(TEXTS, "document"), "document")
    assert_equal([queries.get_query_embedding(QUERY)], ref([QUERY], "query"), "query")
    assert_equal([asyncio.run(queries.aget_query_embedding(QUERY))], ref([QUERY], "query"), "query")
    routed = OpenAILikeEmbedding(model_name=BARE, api_base=server.url + "/query/v1", api_key=KEY)
    assert_equal([routed.get_query_embedding(QUERY)], ref([QUERY], "query"), "query")


def test_llama_index_openai_embedding_with_model_name(server, ref) -> None:
    from llama_index.embeddings.openai import OpenAIEmbedding

    documents = OpenAIEmbedding(model_name=DOC_ID, api_base=server.url + "/v1", api_key=KEY)
    assert_equal(documents.get_text_embedding_batch(TEXTS), ref(TEXTS, "document"), "document")


# ----------------------------------------------------------------------------- Haystack


def test_haystack_indexing_pipeline_stores_every_embedding(server, ref, monkeypatch) -> None:
    from haystack import Document, Pipeline
    from haystack.components.embedders import OpenAIDocumentEmbedder, OpenAITextEmbedder
    from haystack.components.writers import DocumentWriter
    from haystack.document_stores.in_memory import InMemoryDocumentStore
    from haystack.utils import Secret

    monkeypatch.setenv("MAGRETRIEVE_API_KEY", KEY)  # a Secret from the environment serializes
    store = InMemoryDocumentStore(embedding_similarity_function="dot_product")
    indexing = Pipeline()
    indexing.add_component(
        "embedder",
        OpenAIDocumentEmbedder(
            api_key=Secret.from_env_var("MAGRETRIEVE_API_KEY"),
            model=DOC_ID,
            api_base_url=server.url + "/v1",
            progress_bar=False,
            raise_on_failure=True,
        ),
    )
    indexing.add_component("writer", DocumentWriter(document_store=store))
    indexing.connect("embedder.documents", "writer.documents")
    docs = [Document(id=f"d{i}", content=text) for i, text in enumerate(TEXTS)]
    assert KEY not in str(indexing.to_dict())  # the key stays in the environment
    out = indexing.run({"embedder": {"documents": docs}})
    assert out["writer"]["documents_written"] == len(TEXTS)
    stored = {d.id: d.embedding for d in store.filter_documents()}
    assert all(stored[f"d{i}"] is not None for i in range(len(TEXTS)))
    got = [stored[f"d{i}"] for i in range(len(TEXTS))]
    assert_equal(got, ref(TEXTS, "document"), "document")
    text_embedder = OpenAITextEmbedder(
        api_key=Secret.from_env_var("MAGRETRIEVE_API_KEY"),
        model=QUERY_ID,
        api_base_url=server.url + "/v1",
    )
    query = text_embedder.run(text=QUERY)["embedding"]
    assert_equal([query], ref([QUERY], "query"), "query")


def test_haystack_without_a_side_raises_when_told_to(server) -> None:
    """The trap docs/serve.md warns about: the bare id names no side; with
    raise_on_failure=True the pipeline fails instead of writing documents without embeddings."""
    import openai
    from haystack import Document
    from haystack.components.embedders import OpenAIDocumentEmbedder
    from haystack.utils import Secret

    def embedder(raise_on_failure: bool) -> OpenAIDocumentEmbedder:
        return OpenAIDocumentEmbedder(
            api_key=Secret.from_token(KEY),
            model=BARE,
            api_base_url=server.url + "/v1",
            progress_bar=False,
            raise_on_failure=raise_on_failure,
            max_retries=0,
        )

    silent = embedder(False).run(documents=[Document(content="x")])["documents"]
    assert silent[0].embedding is None  # Haystack's default: no error, no embedding
    with pytest.raises(openai.UnprocessableEntityError, match="input_type is required"):
        embedder(True).run(documents=[Document(content="x")])


# ----------------------------------------------------------------------------- litellm


def test_litellm_with_side_model_ids(server, ref) -> None:
    import litellm

    base = {"api_base": server.url + "/v1", "api_key": KEY}
    docs = litellm.embedding(model=f"openai/{DOC_ID}", input=TEXTS, **base)
    assert_equal([d["embedding"] for d in docs.data], ref(TEXTS, "document"), "document")
    queries = asyncio.run(litellm.aembedding(model=f"openai/{QUERY_ID}", input=[QUERY], **base))
    assert_equal([d["embedding"] for d in queries.data], ref([QUERY], "query"), "query")


# ----------------------------------------------------------------------------- TEI clients


def test_huggingface_hub_inference_client_as_tei_users_write_it(server, ref) -> None:
    from huggingface_hub import InferenceClient

    root = InferenceClient(base_url=server.url, api_key=KEY)  # posts to /
    for side in ("query", "document"):
        got = np.stack([root.feature_extraction(t, prompt_name=side)[0] for t in TEXTS])
        assert_equal(got, ref(TEXTS, side), side)
        routed = InferenceClient(base_url=f"{server.url}/{side}", api_key=KEY)  # no side field
        got = np.stack([routed.feature_extraction(t)[0] for t in TEXTS])
        assert_equal(got, ref(TEXTS, side), side)


# ----------------------------------------------------------------------------- Voyage


def test_voyageai_client_sends_its_fields_unchanged(server, ref) -> None:
    import voyageai

    client = voyageai.Client(api_key=KEY, base_url=server.url + "/v1", max_retries=0)
    docs = client.embed(TEXTS, model=BARE, input_type="document")
    assert_equal(docs.embeddings, ref(TEXTS, "document"), "document")
    query = client.embed([QUERY], model=BARE, input_type="query")
    assert_equal(query.embeddings, ref([QUERY], "query"), "query")
    assert docs.total_tokens > 0
