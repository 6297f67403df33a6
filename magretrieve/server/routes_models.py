"""``GET /v1/models`` (OpenAI's list shape) and ``GET /v1/models/{model}``: the served ids.

One id per side, ``ID:query`` and ``ID:document``: a client that can set only a model name
(Haystack's OpenAI embedders, RAG apps that take a base URL and a model) names the side with
it. The bare ``ID`` is not listed, because on its own it names no side.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import Response

from magretrieve.server.errors import NotServed
from magretrieve.server.responses import COMMON, json_response
from magretrieve.server.sides import model_list, model_side
from magretrieve.server.state import ServerState

router = APIRouter()


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    input_type: Literal["query", "document"]
    dimension: int


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]


def _models(state: ServerState) -> dict[str, Any]:
    folder = state.manifest.folder
    try:  # when the export was written: OpenAI's `created`
        created = int((folder / "magretrieve.json").stat().st_mtime) if folder else 0
    except OSError:
        created = 0
    return model_list(state.model_id, created, int(state.manifest.dimension))


@router.get(
    "/v1/models",
    response_model=ModelList,
    responses=COMMON,
    summary="The served model ids: ID:query and ID:document",
)
async def list_models(request: Request) -> Response:
    return json_response(_models(request.app.state.magretrieve))


@router.get(
    "/v1/models/{model:path}",
    response_model=ModelCard,
    responses={**COMMON, 404: COMMON[422]},
    summary="One served model id (404 for another)",
)
async def retrieve_model(model: str, request: Request) -> Response:
    state = request.app.state.magretrieve
    side = model_side(model, state.model_id)
    cards = {card["input_type"]: card for card in _models(state)["data"]}
    if side is None:  # the bare id names no side, so it is not a listed model
        raise NotServed(
            f"model {model!r} names no side, so it is not listed: the served ids are "
            f"{cards['query']['id']!r} and {cards['document']['id']!r}",
        )
    return json_response(cards[side])
