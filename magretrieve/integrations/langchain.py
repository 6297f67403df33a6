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
from pydantic import (  # noqa: E402
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)

from magretrieve.core.errors import ConfigError  # noqa: E402
from magretrieve.integrations._common import (  # noqa: E402
    check_retriever,
    check_top_k,
    check_where_option,
    hit_metadata,
    hit_text,
    search_kwargs,
)
from magretrieve.integrations._encoder import (  # noqa: E402
    DEFAULT_TIMEOUT,
    LazyEncoder,
    check_source,
    check_threads,
    check_timeout,
)
from magretrieve.integrations.vector_stores import check_vector_store  # noqa: E402

__all__ = ["MagRetrieveEmbeddings", "MagRetrieveRetriever"]


class MagRetrieveEmbeddings(BaseModel, Embeddings):
    """LangChain ``Embeddings``: ``embed_query`` by the query graph, ``embed_documents`` by the
    document graph (each document's magnitude kept), from an export folder or a server.

    Give ``export_dir`` (encoded in this process; ``threads``, ``runtime`` as for
    ``OnnxEncoder``) or ``url`` (a ``magretrieve serve`` base URL; ``api_key`` defaults to
    ``$MAGRETRIEVE_API_KEY``, requests follow the server's limits). ``batch_size`` caps the
    texts per call to the export's engine or per request (None: ``max_inputs``).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    export_dir: str | None = None
    """An export folder (``magretrieve export``): vectors computed in this process."""
    url: str | None = None
    """A ``magretrieve serve`` base URL: vectors computed by the server."""
    api_key: SecretStr | None = Field(default_factory=secret_from_env(API_KEY_ENV, default=None))
    """The server's key (remote mode); default ``$MAGRETRIEVE_API_KEY``."""
    batch_size: int | None = None
    threads: int | None = None
    runtime: str | None = None
    timeout: float = DEFAULT_TIMEOUT
    """Seconds per request (remote mode)."""

    _encoder: LazyEncoder = PrivateAttr()

    @field_validator("batch_size", mode="before")
    @classmethod
    def _check_batch_size(cls, value: Any) -> Any:
        return None if value is None else check_top_k(value, "batch_size")

    @field_validator("threads", mode="before")
    @classmethod
    def _check_threads(cls, value: Any) -> Any:
        return check_threads(value)

    @field_validator("timeout", mode="before")
    @classmethod
    def _check_timeout(cls, value: Any) -> Any:
        return check_timeout(value)

    @model_validator(mode="after")
    def _check_source(self) -> MagRetrieveEmbeddings:
        self.export_dir, self.url = check_source(self.export_dir, self.url)
        return self

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        key = self.api_key
        self._encoder = LazyEncoder(
            self.export_dir,
            self.url,
            api_key=(lambda: key.get_secret_value()) if key is not None else None,
            threads=self.threads,
            runtime=self.runtime,
            timeout=self.timeout,
        )

    def _embed(self, texts: list[str], side: str) -> list[list[float]]:
        vectors = self._encoder.encode(texts, side, batch_size=self.batch_size)
        return [[float(x) for x in v] for v in vectors]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Document vectors ``d / ‖d‖^γd`` (the document graph): what an index should keep."""
        return self._embed(texts, "document")

    def embed_query(self, text: str) -> list[float]:
        """The query vector ``q / ‖q‖^γq`` (the query graph)."""
        if not isinstance(text, str):
            raise ConfigError(f"embed_query takes one string, got {type(text).__name__}")
        return self._embed([text], "query")[0]

    async def _aembed(self, texts: list[str], side: str) -> list[list[float]]:
        vectors = await self._encoder.aencode(texts, side, batch_size=self.batch_size)
        return [[float(x) for x in v] for v in vectors]

    async def aembed_documents(self, texts: list[str]) -> list[list[float]]:
        """:meth:`embed_documents` for asyncio: concurrent calls share the engine's batches."""
        return await self._aembed(texts, "document")

    async def aembed_query(self, text: str) -> list[float]:
        """:meth:`embed_query` for asyncio: concurrent calls share the engine's batches."""
        if not isinstance(text, str):
            raise ConfigError(f"embed_query takes one string, got {type(text).__name__}")
        return (await self._aembed([text], "query"))[0]

    def check_store(self, store: Any) -> str:
        """How ``store`` (a LangChain vector store) ranks: ``"inner_product"``, ``"cosine"``,
        ``"euclidean"`` or ``"unknown"``; warns (:class:`MagnitudeWarning`) when it drops the
        documents' magnitude."""
        return check_vector_store(store)


class MagRetrieveRetriever(BaseRetriever):
    """``BaseRetriever`` over a magretrieve ``Retriever``: top-``k`` by inner product."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: Any
    """A :class:`magretrieve.serving.retriever.Retriever` (export + store)."""
    k: int = 5
    """Documents returned per query."""
    where: dict[str, Any] | None = None
    """Payload filter ``{field: value}`` (the server's ``/search`` filter): only documents whose
    payload holds every field with an equal value; ``invoke(query, where=...)`` per call."""

    @field_validator("retriever")
    @classmethod
    def _check_retriever(cls, value: Any) -> Any:
        return check_retriever(value)

    @field_validator("k", mode="before")
    @classmethod
    def _check_k(cls, value: Any) -> int:
        return check_top_k(value, "k")

    @field_validator("where", mode="before")
    @classmethod
    def _check_where(cls, value: Any) -> dict[str, Any] | None:
        return check_where_option(value)

    def _to_documents(self, hits: list[Any]) -> list[Document]:
        return [Document(page_content=hit_text(h), metadata=hit_metadata(h), id=h.id) for h in hits]

    def _search(self, query: str, where: Any) -> list[Any]:
        wanted = self.where if where is None else check_where_option(where)
        return list(self.retriever.search(query, k=self.k, **search_kwargs(wanted)))

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
