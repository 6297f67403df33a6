"""The side rules: which graph encodes a request, and what a client may not do to the vectors.

A magnitude-keeping export encodes queries and documents with different graphs, and a
document vector's length is part of its score (``score = ‖q‖ · ‖d‖ · cos θ``). So:

* the side must be named (``input_type``): a query vector indexed as a document, or the
  reverse, gives wrong scores without any error;
* a document vector is never normalized (``normalize: true`` on documents is refused), and
  ``dimensions`` is refused on both sides: cutting a vector changes its norm, and OpenAI-style
  servers renormalize after cutting;
* a query may be normalized: that scales every score of the query alike and keeps its ranking.
"""

from __future__ import annotations

import base64

import numpy as np

from magretrieve.server.errors import ApiError
from magretrieve.server.models import INPUT_TYPES


def resolve_side(input_type: str | None, field: str = "input_type") -> str:
    """``query`` or ``document`` from an ``input_type`` value; a 422 that says why if missing."""
    if input_type is None:
        raise ApiError(
            422,
            f"{field} is required: 'query' (or 'search_query') for the query graph, 'document' "
            "(or 'search_document') for the document graph; this export encodes the two sides "
            "differently, so a guessed side would give wrong scores silently",
        )
    return INPUT_TYPES[input_type]


def check_normalize(side: str, normalize: bool | None) -> bool:
    """Whether to normalize the side's vectors; refuses it for documents."""
    if normalize and side == "document":
        raise ApiError(
            422,
            "normalize: true is refused for documents: this export keeps each document's "
            "magnitude (its norm is part of its score); drop normalize or send false",
        )
    return bool(normalize)


def check_dimensions(dimensions: int | None) -> None:
    if dimensions is not None:
        raise ApiError(
            422,
            "dimensions is refused: cutting a vector changes its norm, which this export uses "
            "as relevance (and a cut vector renormalized loses it); omit dimensions to get the "
            "full vector",
        )


def normalized(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def as_base64(vector: np.ndarray) -> str:
    """OpenAI's base64 form: the little-endian float32 bytes of one vector."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")
