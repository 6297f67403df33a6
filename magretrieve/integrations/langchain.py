"""A LangChain retriever that ranks by the model's inner product and keeps the decomposition.

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

from magretrieve.stores.base import require

require("langchain_core", "langchain-core", "langchain")

from langchain_core.callbacks import (  # noqa: E402
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from pydantic import ConfigDict, field_validator  # noqa: E402

from magretrieve.integrations._common import (  # noqa: E402
    check_retriever,
    check_top_k,
    hit_metadata,
    hit_text,
)

__all__ = ["MagRetrieveRetriever"]


class MagRetrieveRetriever(BaseRetriever):
    """``BaseRetriever`` over a magretrieve ``Retriever``: top-``k`` by inner product."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    retriever: Any
    """A :class:`magretrieve.serving.retriever.Retriever` (export + store)."""
    k: int = 5
    """Documents returned per query."""

    @field_validator("retriever")
    @classmethod
    def _check_retriever(cls, value: Any) -> Any:
        return check_retriever(value)

    @field_validator("k")
    @classmethod
    def _check_k(cls, value: int) -> int:
        return check_top_k(value, "k")

    def _to_documents(self, hits: list[Any]) -> list[Document]:
        return [Document(page_content=hit_text(h), metadata=hit_metadata(h), id=h.id) for h in hits]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return self._to_documents(self.retriever.search(query, k=self.k))

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        # the Retriever is thread-safe; encoding and searching run off the event loop
        hits = await asyncio.to_thread(self.retriever.search, query, self.k)
        return self._to_documents(hits)
