"""``GET /health`` (the process answers), ``GET /ready`` (graphs loaded, store open, not
draining) and ``GET /metrics`` (Prometheus text)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from magretrieve.server.errors import error_response
from magretrieve.server.models import ErrorResponse, Status

router = APIRouter()


@router.get("/health", response_model=Status, summary="The server process is alive")
async def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get(
    "/ready",
    response_model=Status,
    responses={503: {"model": ErrorResponse}},
    summary="Both graphs are loaded, the store is open, and the server is not draining",
)
async def ready(request: Request) -> Response | dict[str, str]:
    state = request.app.state.magretrieve
    if not state.ready or not state.engine.running:
        return error_response(503, "not ready: starting or shutting down")
    return {"status": "ready"}


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}}},
    summary="Prometheus metrics",
)
async def metrics(request: Request) -> Response:
    m = request.app.state.magretrieve.metrics
    return Response(m.render(), media_type=m.content_type)
