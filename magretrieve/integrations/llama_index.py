"""A LlamaIndex retriever that ranks by the model's inner product and keeps the decomposition.

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

from magretrieve.stores.base import require

require("llama_index.core", "llama-index-core", "llama-index")

from llama_index.core.retrievers import BaseRetriever  # noqa: E402
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode  # noqa: E402

from magretrieve.integrations._common import (  # noqa: E402
    SCORE_KEYS,
    check_retriever,
    check_top_k,
    hit_metadata,
    hit_text,
)

__all__ = ["MagRetrieveRetriever"]

_HIDDEN = [*SCORE_KEYS, "payload"]


class MagRetrieveRetriever(BaseRetriever):
    """``llama_index.core`` retriever over a magretrieve ``Retriever``."""

    def __init__(self, retriever: Any, similarity_top_k: int = 5, **kwargs: Any) -> None:
        self.retriever = check_retriever(retriever)
        self.similarity_top_k = check_top_k(similarity_top_k, "similarity_top_k")
        super().__init__(**kwargs)

    def _to_nodes(self, hits: list[Any]) -> list[NodeWithScore]:
        out = []
        for h in hits:
            node = TextNode(
                id_=h.id,
                text=hit_text(h),
                metadata=hit_metadata(h),
                excluded_llm_metadata_keys=list(_HIDDEN),
                excluded_embed_metadata_keys=list(_HIDDEN),
            )
            out.append(NodeWithScore(node=node, score=float(h.score)))
        return out

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return self._to_nodes(
            self.retriever.search(query_bundle.query_str, k=self.similarity_top_k)
        )

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        hits = await asyncio.to_thread(
            self.retriever.search, query_bundle.query_str, self.similarity_top_k
        )
        return self._to_nodes(hits)
