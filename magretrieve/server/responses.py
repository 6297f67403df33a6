"""JSON answers written with orjson (numpy arrays included), and the error codes each route documents."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response

from magretrieve.server.models import ErrorResponse

_ERR: dict[str, Any] = {"model": ErrorResponse}
#: Error answers every route may give (documented so schema checks hold them to the shape).
COMMON: dict[int | str, dict[str, Any]] = {400: _ERR, 401: _ERR, 413: _ERR, 422: _ERR, 500: _ERR}
#: Routes that encode: also 503 when the queue is full or the server drains.
ENCODING: dict[int | str, dict[str, Any]] = {**COMMON, 503: _ERR}
#: Store routes: also 404 (no store), 403 (writes off), 409 (another writer holds the store).
STORE: dict[int | str, dict[str, Any]] = {**ENCODING, 403: _ERR, 404: _ERR, 409: _ERR}


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )
