"""LlamaIndex objects that keep the model's magnitude: an embedding model for any index, and a
retriever that ranks by the model's inner product and keeps the decomposition.

    from magretrieve.integrations.llama_index import MagRetrieveEmbedding

    emb = MagRetrieveEmbedding(export_dir="exported/qnorm")       # in this process
    emb = MagRetrieveEmbedding(url="http://127.0.0.1:8080")       # or a magretrieve serve
    emb.get_query_embedding("statins")           # the query graph (aget_query_embedding too)
    emb.get_text_embedding_batch(["a", "b"])     # the document graph, embed_batch_size a call

The index's vector store must rank by inner product to keep the documents' magnitude
(LlamaIndex's default ``SimpleVectorStore`` ranks by cosine; docs/integrations.md).

    from magretrieve import Retriever
    from magretrieve.integrations.llama_index import MagRetrieveRetriever

    li = MagRetrieveRetriever(retriever=Retriever.load("exported/qnorm", store="faiss:idx"),
                              similarity_top_k=5)
    nodes = li.retrieve("statins reduce mortality")       # or: await li.aretrieve(...)
    nodes[0].score, nodes[0].node.metadata["doc_norm"], nodes[0].node.metadata["cosine"]

Each result is a ``NodeWithScore`` (score = the model's score) around a ``TextNode`` whose
``id_`` is the document id, ``text`` the stored text (else the title) and ``metadata`` the
payload's fields plus ``id``, ``score``, ``doc_norm``, ``cosine``, ``query_norm``, ``rank`` and
``payload`` (these keys are kept out of the LLM and embedding views of the node).
Needs ``pip install 'magretrieve[llama-index]'``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from magretrieve.core.extras import require

require("llama_index.core")

from llama_index.core.base.embeddings.base import BaseEmbedding  # noqa: E402
from llama_index.core.retrievers import BaseRetriever  # noqa: E402
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode  # noqa: E402
from pydantic import Field  # noqa: E402

from magretrieve.integrations import _common as common  # noqa: E402
from magretrieve.integrations._pydantic import EncoderSource  # noqa: E402
from magretrieve.integrations.vector_stores import check_vector_store  # noqa: E402

__all__ = ["MagRetrieveEmbedding", "MagRetrieveRetriever"]


class MagRetrieveEmbedding(EncoderSource, BaseEmbedding):
    """LlamaIndex ``BaseEmbedding``: query embeddings by the query graph, text (node)
    embeddings by the document graph (each document's magnitude kept), from an export folder
    or a server.

    Give ``export_dir`` (encoded in this process; ``threads``, ``runtime`` as for
    ``OnnxEncoder``) or ``url`` (a ``magretrieve serve`` base URL; ``api_key`` defaults to
    ``$MAGRETRIEVE_API_KEY`` and is never serialized: a pickle, such as the copies
    ``IngestionPipeline.run(num_workers=...)`` sends its workers, reads it there). LlamaIndex hands
    ``_get_text_embeddings`` ``embed_batch_size`` texts at a time; a remote call splits them
    further to the server's ``max_inputs``.
    """

    model_name: str = Field(default="magretrieve", description="A label; the export decides.")

    @classmethod
    def class_name(cls) -> str:
        return "MagRetrieveEmbedding"

    def _get_query_embedding(self, query: str) -> list[float]:
        return self._embed([query], "query")[0]

    async def _aget_query_embedding(self, query: str) -> list[float]:
        return (await self._aembed([query], "query"))[0]

    def _get_text_embedding(self, text: str) -> list[float]:
        return self._embed([text], "document")[0]

    async def _aget_text_embedding(self, text: str) -> list[float]:
        return (await self._aembed([text], "document"))[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return self._embed(texts, "document")

    async def _aget_text_embeddings(self, texts: list[str]) -> list[list[float]]:
        return await self._aembed(texts, "document")

    def check_store(self, store: Any) -> str:
        """How ``store`` (a LlamaIndex vector store, index or storage context) ranks; warns
        (:class:`~magretrieve.integrations.vector_stores.MagnitudeWarning`) when it drops the
        documents' magnitude."""
        return check_vector_store(store)


_HIDDEN = [*common.SCORE_KEYS, "payload"]


class MagRetrieveRetriever(BaseRetriever):
    """``llama_index.core`` retriever over a magretrieve ``Retriever``."""

    def __init__(
        self,
        retriever: Any,
        similarity_top_k: int = 5,
        where: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """``where``: a payload filter ``{field: value}`` (the server's ``/search`` filter)."""
        self.retriever = common.check_retriever(retriever)
        self.similarity_top_k = common.check_top_k(similarity_top_k, "similarity_top_k")
        self.where = common.check_where_option(where)
        super().__init__(**kwargs)

    def _search(self, query: str) -> list[Any]:
        return common.search_hits(self.retriever, query, self.similarity_top_k, None, self.where)

    def _to_nodes(self, hits: list[Any]) -> list[NodeWithScore]:
        out = []
        for h in hits:
            node = TextNode(
                id_=h.id,
                text=common.hit_text(h),
                metadata=common.hit_metadata(h),
                excluded_llm_metadata_keys=list(_HIDDEN),
                excluded_embed_metadata_keys=list(_HIDDEN),
            )
            out.append(NodeWithScore(node=node, score=float(h.score)))
        return out

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._to_nodes(self._search(query_bundle.query_str))

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = await asyncio.to_thread(self._search, query_bundle.query_str)
        return self._to_nodes(hits)
