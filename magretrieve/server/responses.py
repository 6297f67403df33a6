"""JSON answers written with orjson (numpy arrays included), and the error codes each route documents."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import orjson
from starlette.responses import Response

from magretrieve.server.models import ErrorResponse

_ERR: dict[str, Any] = {"model": ErrorResponse}
#: Error answers every route may give (documented so schema checks hold them to the shape).
COMMON: dict[int | str, dict[str, Any]] = {
    400: _ERR,
    401: _ERR,
    413: _ERR,
    415: _ERR,
    422: _ERR,
    500: _ERR,
}
#: Routes that encode: also 503 when the queue is full or the server drains.
ENCODING: dict[int | str, dict[str, Any]] = {**COMMON, 503: _ERR}
#: Store routes: also 404 (no store), 403 (writes off), 409 (another writer holds the store).
STORE: dict[int | str, dict[str, Any]] = {**ENCODING, 403: _ERR, 404: _ERR, 409: _ERR}


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    try:
        body = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        # orjson writes only valid UTF-8; a lone surrogate (an echoed model name, a payload
        # stored before stores refused them) goes out as the JSON escape the client sent
        body = json.dumps(obj, default=_plain, allow_nan=False).encode("ascii")
    return Response(
        body,
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _plain(value: Any) -> Any:
    """numpy values as JSON numbers and lists (what OPT_SERIALIZE_NUMPY does)."""
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")
