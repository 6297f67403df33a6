"""Embeddings in OpenAI's shape (``/v1/embeddings``) and TEI's (``/embed``), and ``GET /info``.

Each shape answers on several routes, so that every client can name the side with what it
can set (docs/serve.md has the client table):

* OpenAI: ``/v1/embeddings``, TEI's alias ``/embeddings``, and per side
  ``/query/v1/embeddings``, ``/document/v1/embeddings`` (and ``/query/embeddings``,
  ``/document/embeddings``), for clients that can set only a base URL;
* TEI: ``/embed``, TEI's alias ``POST /`` (where ``InferenceClient(base_url=URL)`` posts), and
  per side ``/query/embed``, ``/document/embed`` (and ``POST /query``, ``POST /document``).

The side comes from the route, the model id or the body (:mod:`.sides`), never a guess.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from magretrieve.server.models import EmbeddingsRequest, EmbeddingsResponse, EmbedRequest
from magretrieve.server.responses import ENCODING, json_response
from magretrieve.server.sides import (
    OPENAI_VALUES,
    as_base64,
    body_side,
    check_dimensions,
    check_float_type,
    check_normalize,
    check_truncation,
    missing_side,
    model_side,
    normalized,
    one_side,
    shown,
    side_model_id,
)
from magretrieve.server.state import ServerState

router = APIRouter()

#: Encoding routes that read a model id: also 404 for a model this server does not serve.
WITH_MODEL: dict[int | str, dict[str, Any]] = {**ENCODING, 404: ENCODING[422]}
#: (path, the side the path names or None, what the path is) of each shape.
OPENAI_ROUTES = (
    ("/v1/embeddings", None, "OpenAI's shape; the side from input_type or the model id"),
    ("/embeddings", None, "TEI's alias of /v1/embeddings"),
    ("/query/v1/embeddings", "query", "OpenAI's shape, query graph"),
    ("/document/v1/embeddings", "document", "OpenAI's shape, document graph (magnitude kept)"),
    ("/query/embeddings", "query", "alias of /query/v1/embeddings"),
    ("/document/embeddings", "document", "alias of /document/v1/embeddings"),
)
TEI_ROUTES = (
    ("/embed", None, "text-embeddings-inference's shape; the side from prompt_name/input_type"),
    ("/", None, "TEI's alias of /embed (InferenceClient(base_url=URL) posts here)"),
    ("/query/embed", "query", "TEI's shape, query graph"),
    ("/document/embed", "document", "TEI's shape, document graph (magnitude kept)"),
    ("/query", "query", "alias of /query/embed (TEI clients given the base URL URL/query)"),
    ("/document", "document", "alias of /document/embed"),
)


def _state(request: Request) -> ServerState:
    state: ServerState = request.app.state.magretrieve
    return state


def _texts(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _route(path: str, side: str | None) -> tuple[str, str | None]:
    return (f"the route {path}", side)


def _field(name: str, value: str | None) -> tuple[str, str | None]:
    return (f"{name} {shown(value)}" if value is not None else name, body_side(name, value))


async def openai_embeddings(
    body: EmbeddingsRequest, request: Request, path: str, route_side: str | None
) -> Response:
    """The OpenAI (and Voyage) request on one route: the side, the rules, the answer."""
    state = _state(request)
    model_id = state.model_id
    side = one_side(
        [
            _route(path, route_side),
            (
                f"model {shown(body.model)}" if body.model else "model",
                model_side(body.model, model_id),
            ),
            _field("input_type", body.input_type),
        ],
        missing_side(
            "input_type",
            model_id,
            OPENAI_VALUES,
            ("/query/v1/embeddings", "/document/v1/embeddings"),
        ),
    )
    check_dimensions(body.dimensions)
    check_dimensions(body.output_dimension, "output_dimension")
    check_float_type("output_dtype", body.output_dtype)
    truncate = check_truncation(body.truncate, body.truncation, default=True)
    norm_it = check_normalize(side, body.normalize)
    texts = _texts(body.input)
    out = await state.engine.embed(texts, side, truncate=truncate)
    vectors = normalized(out.vectors) if norm_it else out.vectors
    norms = np.linalg.norm(vectors, axis=1)
    b64 = body.encoding_format == "base64"
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": as_base64(vectors[i]) if b64 else vectors[i],
            "norm": float(norms[i]),
            "truncated": out.truncated[i],
        }
        for i in range(len(texts))
    ]
    used = sum(out.tokens)
    return json_response(
        {
            "object": "list",
            "data": data,
            "model": body.model if body.model is not None else side_model_id(model_id, side),
            "input_type": side,
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }
    )


async def tei_embed(
    body: EmbedRequest, request: Request, path: str, route_side: str | None
) -> Response:
    """The TEI request on one route: a bare array of vectors."""
    state = _state(request)
    side = one_side(
        [
            _route(path, route_side),
            _field("prompt_name", body.prompt_name),
            _field("input_type", body.input_type),
        ],
        missing_side(
            "prompt_name (TEI's field) or input_type",
            state.model_id,
            OPENAI_VALUES,
            ("/query/embed", "/document/embed"),
        ),
    )
    norm_it = check_normalize(side, body.normalize)
    out = await state.engine.embed(_texts(body.inputs), side, truncate=body.truncate, what="inputs")
    vectors = normalized(out.vectors) if norm_it else out.vectors
    cut = [str(i) for i, c in enumerate(out.truncated) if c]
    headers = {"X-Truncated-Inputs": ",".join(cut)} if cut else None
    return json_response(vectors, headers=headers)


def _openai_endpoint(
    path: str, side: str | None
) -> Callable[[EmbeddingsRequest, Request], Awaitable[Response]]:
    async def endpoint(body: EmbeddingsRequest, request: Request) -> Response:
        return await openai_embeddings(body, request, path, side)

    return endpoint


def _tei_endpoint(
    path: str, side: str | None
) -> Callable[[EmbedRequest, Request], Awaitable[Response]]:
    async def endpoint(body: EmbedRequest, request: Request) -> Response:
        return await tei_embed(body, request, path, side)

    return endpoint


for _path, _side, _what in OPENAI_ROUTES:
    router.add_api_route(
        _path,
        _openai_endpoint(_path, _side),
        methods=["POST"],
        name=f"embeddings {_path}",
        response_model=EmbeddingsResponse,
        responses=WITH_MODEL,
        summary=f"Embeddings: {_what}",
    )
for _path, _side, _what in TEI_ROUTES:
    router.add_api_route(
        _path,
        _tei_endpoint(_path, _side),
        methods=["POST"],
        name=f"embed {_path}",
        response_model=list[list[float]],
        responses=ENCODING,
        summary=f"Embeddings: {_what}",
    )


@router.get("/info", summary="The export's manifest and this server's limits")
async def info(request: Request) -> dict[str, Any]:
    return _state(request).info()
