"""``POST /v1/embeddings`` (OpenAI shape), ``POST /embed`` (TEI shape) and ``GET /info``."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from magretrieve.server.errors import ApiError
from magretrieve.server.models import EmbeddingsRequest, EmbeddingsResponse, EmbedRequest
from magretrieve.server.responses import ENCODING, json_response
from magretrieve.server.sides import (
    as_base64,
    check_dimensions,
    check_normalize,
    normalized,
    resolve_side,
)
from magretrieve.server.state import ServerState

router = APIRouter()


def _state(request: Request) -> ServerState:
    return request.app.state.magretrieve


def _texts(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


@router.post(
    "/v1/embeddings",
    response_model=EmbeddingsResponse,
    responses=ENCODING,
    summary="Embeddings in OpenAI's shape; input_type picks the graph",
)
async def embeddings(body: EmbeddingsRequest, request: Request) -> Response:
    state = _state(request)
    side = resolve_side(body.input_type)
    check_dimensions(body.dimensions)
    norm_it = check_normalize(side, body.normalize)
    texts = _texts(body.input)
    out = await state.embed(texts, side, truncate=body.truncate)
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
            "model": body.model if body.model is not None else state.model_id,
            "input_type": side,
            "usage": {"prompt_tokens": used, "total_tokens": used},
        }
    )


@router.post(
    "/embed",
    response_model=list[list[float]],
    responses=ENCODING,
    summary="Embeddings in text-embeddings-inference's shape",
)
async def embed(body: EmbedRequest, request: Request) -> Response:
    state = _state(request)
    side = resolve_side(body.input_type or body.prompt_name)
    if body.input_type and body.prompt_name and resolve_side(body.prompt_name) != side:
        raise ApiError(
            422,
            f"input_type {body.input_type!r} and prompt_name {body.prompt_name!r} name different "
            "sides; send one of them",
        )
    norm_it = check_normalize(side, body.normalize)
    out = await state.embed(_texts(body.inputs), side, truncate=body.truncate, what="inputs")
    vectors = normalized(out.vectors) if norm_it else out.vectors
    cut = [str(i) for i, c in enumerate(out.truncated) if c]
    headers = {"X-Truncated-Inputs": ",".join(cut)} if cut else None
    return json_response(vectors, headers=headers)


@router.get("/info", summary="The export's manifest and this server's limits")
async def info(request: Request) -> dict[str, Any]:
    return _state(request).info()
