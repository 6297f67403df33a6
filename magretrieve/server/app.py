"""``create_app``: the FastAPI application over one export (and optionally one store).

The embedding engine and the store are opened when the app is created, so a broken export or
store is a one-line error before anything listens; the graphs are probed and the engine's
batcher threads started at startup, and shutdown (uvicorn's SIGTERM handling) lets in-flight
requests finish, drains the engine, persists and closes the store.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from magretrieve.core.errors import MagRetrieveError, StoreError
from magretrieve.core.version import __version__
from magretrieve.server import (
    routes_cohere,
    routes_embed,
    routes_models,
    routes_ops,
    routes_page,
    routes_store,
)
from magretrieve.server.errors import (
    error_headers,
    error_response,
    not_json,
    public_message,
    status_of,
    validation_message,
)
from magretrieve.server.middleware import ServerMiddleware, sent_method
from magretrieve.server.settings import ServerSettings
from magretrieve.server.state import ServerState

logger = logging.getLogger(__name__)

DESCRIPTION = (
    "Embeddings and search that keep magnitude: query vectors from the export's query graph, "
    "document vectors from its document graph with their norm. OpenAI (/v1/embeddings), "
    "text-embeddings-inference (/embed) and Cohere (/v1/embed, /v2/embed) shapes; the side is "
    "named by the route (/query/..., /document/...), the model id (GET /v1/models) or the "
    "body, never guessed; see docs/serve.md."
)


def open_state(
    export: str | Path,
    store: str | None = None,
    *,
    settings: ServerSettings | None = None,
    threads: int | None = None,
    runtime: str | None = None,
    force: bool = False,
    **store_options: Any,
) -> ServerState:
    """Load the export (sha256-verified) and open the store; nothing listens yet.

    The graphs are checked against the manifest before the store is opened (or created), as
    :meth:`~magretrieve.serving.retriever.Retriever.load` does, so a broken export never
    creates a store.
    """
    from magretrieve.server.metrics import Metrics
    from magretrieve.serving.engine import EmbeddingEngine
    from magretrieve.serving.retriever import Retriever
    from magretrieve.stores import open_store

    settings = settings or ServerSettings()
    engine = EmbeddingEngine.load(
        export,
        settings,
        threads=threads,
        runtime=runtime,
        spinning=store is None if settings.onnx_spinning is None else settings.onnx_spinning,
        observer=Metrics(),
    )
    if engine.settings is not settings:  # fewer threads than graph workers: one per thread
        settings = replace(settings, graph_workers=engine.settings.graph_workers)
    encoder = engine.encoder
    retriever = None
    if store is not None:
        try:  # an existing store opens with its own dimension (d + 1 with a prior's offset)
            vs = open_store(store, dimension=None, **store_options)
        except StoreError:
            if not settings.writes_enabled:
                raise
            vs = open_store(store, dimension=encoder.manifest.dimension, **store_options)
        try:
            retriever = Retriever(encoder, vs, force=force)
            if settings.writes_enabled:
                retriever.check_not_foreign()
        except BaseException:
            vs.close()
            raise

    def reopen() -> Retriever:
        """The same store opened again, at the generation on disk now (replicas)."""
        vs = open_store(store, dimension=None, **store_options)
        try:
            return Retriever(encoder, vs, force=force)
        except BaseException:
            vs.close()
            raise

    return ServerState(
        engine,
        settings,
        retriever=retriever,
        store_spec=store,
        reopen=reopen if store is not None else None,
    )


def create_app(
    export: str | Path | None = None,
    store: str | None = None,
    *,
    api_key: str | None = None,
    settings: ServerSettings | None = None,
    state: ServerState | None = None,
    threads: int | None = None,
    runtime: str | None = None,
    force: bool = False,
    **store_options: Any,
) -> FastAPI:
    """The ASGI app serving ``export`` (an export folder) and ``store`` (a store spec).

    ``api_key`` turns on the write endpoints and requires ``Authorization: Bearer KEY`` on
    every route but ``/health``, ``/ready``, ``/info`` and ``/metrics``; it may also come in
    ``settings``. Pass ``state`` (from :func:`open_state`) to reuse an opened export.
    """
    if state is None:
        if export is None:
            raise MagRetrieveError("create_app needs an export folder (or an opened state)")
        settings = settings or ServerSettings(api_key=api_key)
        if api_key is not None and settings.api_key != api_key:
            settings = replace(settings, api_key=api_key)
        state = open_state(
            export,
            store,
            settings=settings,
            threads=threads,
            runtime=runtime,
            force=force,
            **store_options,
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.start()
        try:
            yield
        finally:
            state.stop()

    app = FastAPI(
        title="magretrieve",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        debug=False,
        # /docs is served from the package (routes_page), not from a CDN; no ReDoc page
        docs_url=None,
        redoc_url=None,
    )
    app.state.magretrieve = state
    for module in (
        routes_embed,
        routes_cohere,
        routes_models,
        routes_store,
        routes_ops,
        routes_page,
    ):
        app.include_router(module.router)
    if state.settings.api_key is not None:
        routes_page.declare_bearer_key(app)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        on_body = any(tuple(e.get("loc", ()))[:1] == ("body",) for e in errors)
        sent = request.headers.get("content-length") not in (None, "0")
        sent = sent or "chunked" in request.headers.get("transfer-encoding", "")
        wrong_type = not_json(request.headers.get("content-type")) if on_body and sent else None
        if wrong_type is not None:  # the body was never read as JSON: say why
            return error_response(415, wrong_type)
        return error_response(422, validation_message(errors))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> Response:
        message = exc.detail if isinstance(exc.detail, str) else "request refused"
        if exc.status_code == 404:
            message = f"no route {request.url.path}; see /docs for the routes"
        elif exc.status_code == 405:
            message = f"{sent_method(request.scope)} is not allowed on {request.url.path}"
        return error_response(exc.status_code, message, getattr(exc, "headers", None))

    @app.exception_handler(MagRetrieveError)
    async def _user_error(request: Request, exc: MagRetrieveError) -> Response:
        """Every typed error, its status by the one table (:data:`.errors.STATUS`)."""
        return error_response(
            status_of(exc),
            public_message(exc, state.scrub_paths),
            error_headers(exc, state.settings.retry_after_s),
        )

    app.add_middleware(ServerMiddleware, state=state)
    return app
