"""``POST /search``, ``POST /documents`` (upsert) and ``DELETE /documents`` over the server's store.

Search answers what ``magretrieve search --json`` prints; concurrent searches share one store
call (:mod:`magretrieve.serving.search_batcher`). Writes need the API key (a server
without one has them off), are validated and encoded whole before anything is written, and
go to the store in one call under the Retriever's write lock (so no search sees half a
request) and the store's own folder writer lock; the store is persisted before the answer,
so an acknowledged write survives a restart. Searches wait only while a request's batch is
applied, not while the store is saved, and concurrent writes share saves
(:meth:`~magretrieve.serving.retriever.Retriever.persist`): the requests that arrive while a
save runs are answered after the one save that follows it.
"""

from __future__ import annotations

import logging

import numpy as np
from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool
from starlette.responses import Response

from magretrieve.data.readers import Document
from magretrieve.server.documents import request_document
from magretrieve.server.errors import InvalidRequest, NotServed, RequestTooLarge, WritesOff
from magretrieve.server.models import (
    DeleteRequest,
    DeleteResponse,
    DocumentsRequest,
    DocumentsResponse,
    SearchRequest,
    SearchResult,
)
from magretrieve.server.responses import STORE, json_response
from magretrieve.server.state import ServerState
from magretrieve.server.store_holder import StoreHolder
from magretrieve.stores.base import check_finite

router = APIRouter()
logger = logging.getLogger(__name__)


def _retriever(request: Request) -> tuple[ServerState, StoreHolder]:
    """The state and its store holder (every store call runs inside ``holder.use()``)."""
    state: ServerState = request.app.state.magretrieve
    if state.holder is None:
        raise NotServed(
            f"{request.method} {request.url.path}: this server has no store; start it with "
            "--store SPEC to search and write documents"
        )
    return state, state.holder


def _writable(request: Request) -> tuple[ServerState, StoreHolder]:
    state, holder = _retriever(request)
    if not state.settings.writes_enabled:
        raise WritesOff(
            "write endpoints are off: this server was started without an API key "
            "(--api-key or MAGRETRIEVE_API_KEY)",
        )
    return state, holder


@router.post(
    "/search",
    response_model=SearchResult | list[SearchResult],
    responses=STORE,
    summary="Top-k documents per query with each score split into norms and cosine",
)
async def search(body: SearchRequest, request: Request) -> Response:
    state, _ = _retriever(request)
    if (body.query is None) == (body.queries is None):
        raise InvalidRequest("send exactly one of query (one text) or queries (a list of texts)")
    if body.k > state.settings.max_k:
        raise InvalidRequest(f"k={body.k} is more than this server's max_k={state.settings.max_k}")
    texts = [body.query] if body.query is not None else list(body.queries or [])
    what = "query" if body.query is not None else "queries"
    assert state.searcher is not None  # a state with a store has one
    with state.searcher.coming():  # a store call taken meanwhile may wait for this search
        out = await state.engine.embed(texts, "query", what=what)
    hits = await state.searcher.search(out.vectors, body.k, body.filter)  # merged with others
    if state.recall_watch is not None and not body.filter:
        state.recall_watch.offer(
            out.vectors, hits, body.k
        )  # a sample is re-run exactly, off this path
    results = [
        {"query": t, "truncated": cut, "hits": [h.to_dict() for h in hs]}
        for t, cut, hs in zip(texts, out.truncated, hits, strict=True)
    ]
    return json_response(results[0] if body.query is not None else results)


@router.post(
    "/documents",
    response_model=DocumentsResponse,
    responses=STORE,
    summary="Upsert documents (corpus JSONL line shape); needs the API key",
)
async def upsert(body: DocumentsRequest, request: Request) -> Response:
    from magretrieve.serving.retriever import check_documents

    state, holder = _writable(request)
    docs = [request_document(doc, n) for n, doc in enumerate(body.documents)]
    check_documents(docs)
    ids = [d.id for d in docs]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        dup = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise InvalidRequest(f"document id {dup!r} appears twice in this request")
    out = await state.engine.embed([d.full_text for d in docs], "document", what="documents")
    check_finite(out.vectors, ids, "encoding")
    await run_in_threadpool(_write, holder, docs, out.vectors)
    cut = [d.id for d, c in zip(docs, out.truncated, strict=True) if c]
    return json_response({"upserted": len(docs), "ids": ids, "truncated": cut})


def _write(holder: StoreHolder, docs: list[Document], vectors: np.ndarray) -> None:
    with holder.use() as retriever:  # the store is not closed before the persist is done
        retriever.write_batch(docs, vectors)
        retriever.persist()  # returns after a save that began once this batch was applied


def _delete(holder: StoreHolder, ids: list[str]) -> int:
    with holder.use() as retriever:
        n = retriever.delete(ids)
        if n:
            retriever.persist()
        return int(n)


@router.delete(
    "/documents",
    response_model=DeleteResponse,
    responses=STORE,
    summary="Delete documents by id; needs the API key",
)
async def delete(body: DeleteRequest, request: Request) -> Response:
    state, holder = _writable(request)
    if not body.ids:
        raise InvalidRequest("ids is empty: name at least one document id")
    if len(body.ids) > state.settings.max_inputs:
        raise RequestTooLarge(
            f"ids holds {len(body.ids)} ids; this server takes at most {state.settings.max_inputs}",
        )
    deleted = await run_in_threadpool(_delete, holder, list(body.ids))
    return json_response({"deleted": deleted})
