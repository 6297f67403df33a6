"""The side rules: which graph encodes a request, and what a client may not do to the vectors.

A magnitude-keeping export encodes queries and documents with different graphs, and a
document vector's length is part of its score (``score = ‖q‖ · ‖d‖ · cos θ``). So:

* the side must be named, and is never guessed: a query vector indexed as a document, or the
  reverse, gives wrong scores without any error. A request names it in any of three places,
  whichever its client can set: the route (``/query/...``, ``/document/...``), the model id
  (``<id>:query``, ``<id>:document``, listed at ``GET /v1/models``) or a body field
  (``input_type``, TEI's ``prompt_name``, Cohere's ``search_query``/``search_document``). Two
  places that name different sides are a 422, never a choice between them;
* a document vector is never normalized (``normalize: true`` on documents is refused), and
  ``dimensions`` (Voyage's ``output_dimension``) is refused on both sides: cutting a vector
  changes its norm, and OpenAI-style servers renormalize after cutting;
* a query may be normalized: that scales every score of the query alike and keeps its ranking.

This module is the one place that turns a route, a model id or a body field into a side.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

import numpy as np

from magretrieve.server.errors import InvalidRequest, NotServed
from magretrieve.server.models import INPUT_TYPES
from magretrieve.serving.settings import model_id_problem

#: The two sides, in the order ``GET /v1/models`` lists them.
SIDES = ("query", "document")
#: The id a server falls back to when the export folder's name cannot be one.
FALLBACK_MODEL_ID = "magretrieve"


# ----------------------------------------------------------------------------- model ids


def side_model_id(model_id: str, side: str) -> str:
    """The model id that names ``side``: ``<id>:query`` or ``<id>:document``."""
    return f"{model_id}:{side}"


def default_model_id(folder_name: str | None) -> str:
    """The export folder's name (what the serve command names), or ``magretrieve``."""
    if folder_name and model_id_problem(folder_name) is None:
        return folder_name
    return FALLBACK_MODEL_ID


def shown(value: str, limit: int = 80) -> str:
    """A client's string fit for an error message: quoted, cut, lone surrogates escaped."""
    cut = value if len(value) <= limit else value[:limit] + "…"
    return repr(cut.encode("utf-8", "backslashreplace").decode("utf-8"))


def model_side(model: str | None, model_id: str) -> str | None:
    """The side a request's ``model`` names: None for no model or the bare id.

    A model this server does not serve is a 404, as OpenAI answers an unknown model
    (``model_not_found``): a client configured for another provider's model must not get this
    export's vectors under that name.
    """
    if model is None or model == model_id:
        return None
    for side in SIDES:
        if model == side_model_id(model_id, side):
            return side
    raise NotServed(
        f"model {shown(model)} is not served here: this server serves "
        f"{side_model_id(model_id, 'query')!r} (the query graph) and "
        f"{side_model_id(model_id, 'document')!r} (the document graph), or {model_id!r} with "
        "the side named elsewhere; GET /v1/models lists them",
    )


# ----------------------------------------------------------------------------- the side


def missing_side(
    field: str, model_id: str, values: str, routes: tuple[str, str] | None = None
) -> str:
    """The 422 message of a request that names no side, listing every way to name one."""
    where = f" or in the route ({routes[0]} or {routes[1]})" if routes else ""
    return (
        f"{field} is required: {values}; or name the side in the model "
        f"({side_model_id(model_id, 'query')!r} or {side_model_id(model_id, 'document')!r}, "
        f"listed at GET /v1/models){where}; this export encodes the two sides differently, so "
        "a guessed side would give wrong scores silently"
    )


#: How OpenAI-, TEI- and Cohere-shaped requests name the side in a body field.
OPENAI_VALUES = (
    "'query' (or 'search_query') for the query graph, 'document' (or 'search_document') for "
    "the document graph"
)
COHERE_VALUES = "'search_query' for the query graph, 'search_document' for the document graph"


def body_side(field: str, value: str | None, accepted: str = OPENAI_VALUES) -> str | None:
    """The side a body field names (None when absent); a 422 for a value that names none."""
    if value is None:
        return None
    side = INPUT_TYPES.get(value)
    if side is None:
        raise InvalidRequest(
            f"{field} {shown(value)} names no side of this export: it has {accepted} "
            "(no classification or clustering graph)",
        )
    return side


def one_side(named: Iterable[tuple[str, str | None]], missing: str) -> str:
    """The side every place of a request names; 422 when none names one, or two disagree.

    ``named`` holds (where, side or None) pairs such as ``("the route /query/embed", "query")``
    or ``("input_type 'document'", "document")``.
    """
    given = [(where, side) for where, side in named if side is not None]
    if not given:
        raise InvalidRequest(missing)
    first_where, first = given[0]
    for where, side in given[1:]:
        if side != first:
            raise InvalidRequest(
                f"{first_where} and {where} name different sides ({first}, {side}); name one "
                "side, or the same side in each place",
            )
    return first


# ----------------------------------------------------------------------------- vector rules


def check_normalize(side: str, normalize: bool | None) -> bool:
    """Whether to normalize the side's vectors; refuses it for documents."""
    if normalize and side == "document":
        raise InvalidRequest(
            "normalize: true is refused for documents: this export keeps each document's "
            "magnitude (its norm is part of its score); drop normalize or send false",
        )
    return bool(normalize)


def check_dimensions(dimensions: int | None, field: str = "dimensions") -> None:
    """Refuses a shortened vector (OpenAI's ``dimensions``, Voyage's and Cohere's
    ``output_dimension``)."""
    if dimensions is not None:
        raise InvalidRequest(
            f"{field} is refused: cutting a vector changes its norm, which this export uses "
            f"as relevance (and a cut vector renormalized loses it); omit {field} to get the "
            "full vector",
        )


def check_float_type(field: str, value: str | None) -> None:
    """Refuses a quantized output type (Voyage's ``output_dtype``, Cohere's
    ``embedding_types``): only float vectors carry the magnitude exactly."""
    if value is not None and value != "float":
        raise InvalidRequest(
            f"{field} {shown(value)} is refused: this server returns float vectors only "
            "(the graphs' output, magnitude kept); send 'float' or omit it",
        )


def check_truncation(truncate: bool | None, truncation: bool | None, default: bool) -> bool:
    """``truncate`` (ours) or ``truncation`` (Voyage's name); both given must agree."""
    if truncate is not None and truncation is not None and truncate != truncation:
        raise InvalidRequest(
            f"truncate {str(truncate).lower()} and truncation {str(truncation).lower()} "
            "disagree; send one of them",
        )
    for value in (truncate, truncation):
        if value is not None:
            return value
    return default


def normalized(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    out: np.ndarray = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)
    return out


def as_base64(vector: np.ndarray) -> str:
    """OpenAI's base64 form: the little-endian float32 bytes of one vector."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


def model_list(model_id: str, created: int, dimension: int) -> dict[str, Any]:
    """``GET /v1/models`` in OpenAI's list shape: one id per side (the bare id names none)."""
    return {
        "object": "list",
        "data": [
            {
                "id": side_model_id(model_id, side),
                "object": "model",
                "created": created,
                "owned_by": "magretrieve",
                "input_type": side,
                "dimension": dimension,
            }
            for side in SIDES
        ],
    }
