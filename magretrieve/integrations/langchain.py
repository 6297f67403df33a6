"""LangChain objects that keep the model's magnitude: embeddings for any vector store, and a
retriever that ranks by the model's inner product and keeps the decomposition.

    from magretrieve.integrations.langchain import MagRetrieveEmbeddings

    emb = MagRetrieveEmbeddings(export_dir="exported/qnorm")          # in this process
    emb = MagRetrieveEmbeddings(url="http://127.0.0.1:8080")          # or a magretrieve serve
    emb.embed_query("statins")         # the query graph      (await emb.aembed_query(...))
    emb.embed_documents(["a", "b"])    # the document graph   (await emb.aembed_documents(...))

One object gives each side its own graph, so a vector store handed it indexes documents and
searches queries correctly; the store must rank by inner product to keep the documents'
magnitude (:func:`~magretrieve.integrations.vector_stores.check_vector_store`, docs/integrations.md).

    from magretrieve import Retriever
    from magretrieve.integrations.langchain import MagRetrieveRetriever

    lc = MagRetrieveRetriever(retriever=Retriever.load("exported/qnorm", store="faiss:idx"), k=5)
    docs = lc.invoke("statins reduce mortality")          # or: await lc.ainvoke(...)
    docs[0].metadata["score"], docs[0].metadata["doc_norm"], docs[0].metadata["cosine"]

Each result is a ``langchain_core.documents.Document`` whose ``page_content`` is the stored
text (else the title), ``id`` the document id, and ``metadata`` the payload's fields plus
``id``, ``score``, ``doc_norm``, ``cosine``, ``query_norm``, ``rank`` and ``payload``.
Needs ``pip install 'magretrieve[langchain]'``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from magretrieve.core.env import API_KEY_ENV
from magretrieve.core.extras import require

require("langchain_core")

from langchain_core.callbacks import (  # noqa: E402
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document  # noqa: E402
from langchain_core.embeddings import Embeddings  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from langchain_core.utils import secret_from_env  # noqa: E402
from pydantic import ConfigDict, Field, SecretStr  # noqa: E402

from magretrieve.core.errors import ConfigError  # noqa: E402
from magretrieve.integrations import _common as common  # noqa: E402
from magretrieve.integrations._pydantic import CheckedFields, EncoderSource  # noqa: E402
from magretrieve.integrations.vector_stores import check_vector_store  # noqa: E402

__all__ = ["MagRetrieveEmbeddings", "MagRetrieveRetriever"]


def _one_text(text: Any) -> str:
    if not isinstance(text, str):
        raise ConfigError(f"embed_query takes one string, got {type(text).__name__}")
    return text


def _check_batch_size(value: Any) -> int | None:
    return None if value is None else common.check_top_k(value, "batch_size")


class MagRetrieveEmbeddings(EncoderSource, Embeddings):
    """LangChain ``Embeddings``: ``embed_query`` by the query graph, ``embed_documents`` by the
    document graph (each document's magnitude kept), from an export folder or a server.

    Give ``export_dir`` (encoded in this process; ``threads``, ``runtime`` as for
    ``OnnxEncoder``) or ``url`` (a ``magretrieve serve`` base URL; ``api_key`` defaults to
    ``$MAGRETRIEVE_API_KEY`` and never serialized or pickled, requests follow the server's
    limits). ``batch_size`` caps the
    texts per call to the export's engine or per request (None: ``max_inputs``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")
    _field_checks = {**EncoderSource._field_checks, "batch_size": _check_batch_size}

    api_key: SecretStr | None = Field(
        default_factory=secret_from_env(API_KEY_ENV, default=None), exclude=True
    )
    """The server's key (remote mode); default ``$MAGRETRIEVE_API_KEY``; never serialized (a
    pickle holds no key: the process that unpickles it reads ``$MAGRETRIEVE_API_KEY``)."""
    batch_size: int | None = None

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Document vectors ``d / ‖d‖^γd`` (the document graph): what an index should keep."""
        return self._embed(texts, "document", self.batch_size)

    def embed_query(self, text: str) -> list[float]:
        """The query vector ``q / ‖q‖^γq`` (the query graph)."""
        return self._embed([_one_text(text)], "query")[0]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """:meth:`embed_documents` for asyncio: concurrent calls share the engine's batches."""
        return await self._aembed(texts, "document", self.batch_size)

    async def aembed_query(self, text: str) -> list[float]:
        """:meth:`embed_query` for asyncio: concurrent calls share the engine's batches."""
        return (await self._aembed([_one_text(text)], "query"))[0]

    def check_store(self, store: Any) -> str:
        """How ``store`` (a LangChain vector store) ranks: ``"inner_product"``, ``"cosine"``,
        ``"euclidean"`` or ``"unknown"``; warns (:class:`MagnitudeWarning`) when it drops the
        documents' magnitude."""
        return check_vector_store(store)


class MagRetrieveRetriever(CheckedFields, BaseRetriever):
    """``BaseRetriever`` over a magretrieve ``Retriever``: top-``k`` by inner product."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    _field_checks = {
        "retriever": common.check_retriever,
        "k": lambda value: common.check_top_k(value, "k"),
        "where": common.check_where_option,
    }

    retriever: Any
    """A :class:`magretrieve.serving.retriever.Retriever` (export + store)."""
    k: int = 5
    """Documents returned per query."""
    where: dict[str, Any] | None = None
    """Payload filter ``{field: value}`` (the server's ``/search`` filter): only documents whose
    payload holds every field with an equal value; ``invoke(query, where=...)`` per call."""

    def _to_documents(self, hits: list[Any]) -> list[Document]:
        return [
            Document(page_content=common.hit_text(h), metadata=common.hit_metadata(h), id=h.id)
            for h in hits
        ]

    def _search(self, query: str, where: Any) -> list[Any]:
        return common.search_hits(self.retriever, query, self.k, where, default=self.where)

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        where: dict[str, Any] | None = None,
    ) -> list[Document]:
        return self._to_documents(self._search(query, where))

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        where: dict[str, Any] | None = None,
    ) -> list[Document]:
        # the Retriever is thread-safe; encoding and searching run off the event loop
        hits = await asyncio.to_thread(self._search, query, where)
        return self._to_documents(hits)
