"""Errors as JSON bodies that name the fault, never a traceback or a server file path.

Every error response is ``{"error": {"message": ..., "type": ..., "code": status}}`` (the
OpenAI error shape, so its client raises with the message). Messages of the project's own
errors name files and store locations; :func:`scrub` replaces those with neutral words
before they leave the server, because a client has no business knowing the server's layout.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from starlette.responses import Response

logger = logging.getLogger(__name__)

#: An absolute POSIX path (or a store spec's path part) inside a message.
_PATH = re.compile(r"(?<![\w.])/(?:[^\s'\"`,;:()\[\]{}]+/?)+")
#: Error type per status, as OpenAI-style clients expect in ``error.type``.
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    500: "server_error",
    503: "overloaded_error",
}


class ApiError(Exception):
    """An answer other than success: status, one-line message, optional headers."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def scrub(message: str, known: Iterable[tuple[str, str]] = ()) -> str:
    """``message`` with server paths replaced: known ones by a name, the rest by ``<path>``."""
    for secret, name in known:
        if secret:
            message = message.replace(secret, name)
    return _PATH.sub("<path>", message)


def error_body(status: int, message: str) -> bytes:
    return orjson.dumps(
        {"error": {"message": message, "type": TYPES.get(status, "error"), "code": status}}
    )


def error_response(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        error_body(status, message),
        status_code=status,
        media_type="application/json",
        headers=dict(headers or {}),
    )


def not_json(content_type: str | None) -> str | None:
    """The message of a 415 for a body sent with a content type other than JSON (curl's
    ``-d`` sends ``application/x-www-form-urlencoded``) or with none (FastAPI reads a body as
    JSON only when it is labelled so); None for ``application/json`` and ``*/*+json``."""
    fix = (
        "send the JSON body with the header Content-Type: application/json "
        "(curl: -H 'Content-Type: application/json')"
    )
    if not content_type or not content_type.strip():
        return f"the body was sent without a Content-Type header, so it was not read; {fix}"
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    ):
        return None
    shown = media.encode("ascii", "replace").decode()[:100]
    return f"the body was sent as Content-Type: {shown}, which this route does not read; {fix}"


def validation_message(errors: Iterable[Mapping[str, Any]]) -> str:
    """pydantic's errors as ``field: problem; field: problem`` (at most three, no values)."""
    parts = []
    for err in list(errors)[:3]:
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(parts)
