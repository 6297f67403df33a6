"""``POST /v1/embed`` and ``POST /v2/embed``: Cohere's embed shape.

The one shape in which a framework's single embeddings object names the side per method
(``search_document`` from its document method, ``search_query`` from its query method), so
LangChain ``CohereEmbeddings`` pointed at this server (``base_url=URL``) indexes with the
document graph and searches with the query graph. Answers are Cohere's: v1 gives
``embeddings`` as a list of vectors (``response_type: embeddings_floats``), or by type
(``{"float": [...]}``, ``embeddings_by_type``) when ``embedding_types`` is sent; v2 always by
type. The side rules are the other shapes' (:mod:`.sides`).
"""

from __future__ import annotations

import uuid

from fastapi import APIRouter, Request
from starlette.responses import Response

from magretrieve.server.errors import InvalidRequest
from magretrieve.server.models_cohere import (
    CohereByTypeResponse,
    CohereEmbedRequest,
    CohereEmbedV2Request,
    CohereFloatsResponse,
)
from magretrieve.server.responses import json_response
from magretrieve.server.routes_embed import WITH_MODEL
from magretrieve.server.sides import (
    COHERE_VALUES,
    body_side,
    check_dimensions,
    check_float_type,
    missing_side,
    model_side,
    one_side,
    shown,
)
from magretrieve.server.state import ServerState

router = APIRouter()


def _truncate(value: str | None) -> bool:
    """Cohere's ``truncate``: END (its default) cuts at the side's max length, NONE refuses."""
    if value == "START":
        raise InvalidRequest(
            "truncate START is refused: the graphs cut a text at its end only; send END "
            "(the default: cut at the side's max length) or NONE (a too-long text is refused)",
        )
    return value != "NONE"


def _refuse_unsupported(body: CohereEmbedRequest) -> None:
    if body.images is not None or getattr(body, "inputs", None) is not None:
        field = "images" if body.images is not None else "inputs"
        raise InvalidRequest(f"{field} is refused: this server embeds text only; send texts")
    if body.texts is None:
        raise InvalidRequest("texts is required: the list of texts to embed")
    if isinstance(body, CohereEmbedV2Request):
        check_dimensions(body.output_dimension, "output_dimension")
        if body.max_tokens is not None:
            raise InvalidRequest(
                "max_tokens is refused: texts are cut at the side's max length (GET /info); "
                "omit max_tokens",
            )
    if body.embedding_types is not None:
        if not body.embedding_types:
            raise InvalidRequest("embedding_types is empty: send ['float'] or omit it")
        for kind in body.embedding_types:
            check_float_type("embedding_types", kind)


async def cohere_embed(body: CohereEmbedRequest, request: Request, version: int) -> Response:
    state: ServerState = request.app.state.magretrieve
    model_id = state.model_id
    side = one_side(
        [
            (
                f"model {shown(body.model)}" if body.model else "model",
                model_side(body.model, model_id),
            ),
            (
                f"input_type {shown(body.input_type)}" if body.input_type else "input_type",
                body_side("input_type", body.input_type, COHERE_VALUES),
            ),
        ],
        missing_side("input_type", model_id, COHERE_VALUES),
    )
    _refuse_unsupported(body)
    texts = list(body.texts or [])
    out = await state.engine.embed(texts, side, truncate=_truncate(body.truncate), what="texts")
    vectors = out.vectors
    by_type = version == 2 or body.embedding_types is not None
    answer = {
        "id": str(uuid.uuid4()),
        "response_type": "embeddings_by_type" if by_type else "embeddings_floats",
        "embeddings": {"float": vectors} if by_type else vectors,
        "texts": texts,
        "meta": {
            "api_version": {"version": str(version)},
            "billed_units": {"input_tokens": sum(out.tokens)},
        },
        "input_type": side,
        "truncated": out.truncated,
    }
    return json_response(answer)


@router.post(
    "/v1/embed",
    response_model=CohereFloatsResponse | CohereByTypeResponse,
    responses=WITH_MODEL,
    summary="Embeddings in Cohere's v1 shape; input_type search_query|search_document",
)
async def embed_v1(body: CohereEmbedRequest, request: Request) -> Response:
    return await cohere_embed(body, request, version=1)


@router.post(
    "/v2/embed",
    response_model=CohereByTypeResponse,
    responses=WITH_MODEL,
    summary="Embeddings in Cohere's v2 shape; input_type search_query|search_document",
)
async def embed_v2(body: CohereEmbedV2Request, request: Request) -> Response:
    return await cohere_embed(body, request, version=2)
