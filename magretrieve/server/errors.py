"""Errors as JSON bodies that name the fault, never a traceback or a server file path.

Every error response is ``{"error": {"message": ..., "type": ..., "code": status}}`` (the
OpenAI error shape, so its client raises with the message). The status of an error is chosen
by its class, in one table (:data:`STATUS`), never where it is raised nor from its message: the
engine's errors (:mod:`magretrieve.serving.errors`), the store's (a
:class:`~magretrieve.core.errors.WriterLockHeld` is a 409) and the few only HTTP has
(:class:`NotServed`, :class:`WritesOff`, :class:`InvalidRequest`,
:class:`RequestTooLarge`). Messages of the project's
own errors name files and store locations; :func:`scrub` replaces those with neutral words
before they leave the server, because a client has no business knowing the server's layout,
and an error whose message holds what no client may see (the pid and command line of the
process holding a store's writer lock) is answered with a fixed message (:data:`PUBLIC`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import orjson
from starlette.responses import Response

from magretrieve.core.errors import MagRetrieveError, WriterLockHeld
from magretrieve.serving.errors import InputTooLarge, InvalidInput, Overloaded

logger = logging.getLogger(__name__)


class InvalidRequest(InvalidInput):
    """A request field the server refuses: a side named twice differently, a refused option."""


class RequestTooLarge(InputTooLarge):
    """A request holds more items than the server takes (ids to delete)."""


class NotServed(MagRetrieveError):
    """What the request names is not served here: a model id, a static file, or the store of a
    server started without one."""


class WritesOff(MagRetrieveError):
    """A write endpoint was called on a server started without an API key."""


#: The status of each error class; an error gets the entry of its nearest class (its MRO), so
#: every other user error (a refused store option, a bad document) is a 422.
STATUS: dict[type[BaseException], int] = {
    NotServed: 404,
    WritesOff: 403,
    WriterLockHeld: 409,
    InputTooLarge: 413,
    Overloaded: 503,
    MagRetrieveError: 422,
}
#: Errors answered with a fixed message instead of their own (kept in the server's log).
PUBLIC: dict[type[BaseException], str] = {
    WriterLockHeld: "another process holds the store's writer lock; retry once it has "
    "finished (searching is unaffected)",
}
#: Errors whose messages are written from the request alone (its fields, the client's values,
#: the routes to use instead), never from server state: sent as written, since scrubbing would
#: also blank a route such as ``/query/v1/embeddings`` that the message points the client to.
#: Every other error (a store's, a file's, a setting's) has its server paths replaced.
#: (Subclasses included: ``InvalidRequest`` is an ``InvalidInput``.)
AS_WRITTEN: tuple[type[BaseException], ...] = (
    NotServed,
    WritesOff,
    InvalidInput,
    InputTooLarge,
    Overloaded,
)
#: Errors whose answer says when to try again (``Retry-After``).
RETRY_LATER: tuple[type[BaseException], ...] = (Overloaded,)


def _entry(table: Mapping[type[BaseException], Any], exc: BaseException) -> Any:
    for cls in type(exc).__mro__:
        if cls in table:
            return table[cls]
    return None


def status_of(exc: BaseException) -> int:
    """The status code of ``exc`` by :data:`STATUS` (500 for an error that is not a user's)."""
    status = _entry(STATUS, exc)
    return int(status) if status is not None else 500


def public_message(exc: BaseException, scrub_paths: Callable[[str], str]) -> str:
    """One line a client may read: the fixed message of :data:`PUBLIC`, else the error's own
    message (with server paths replaced by ``scrub_paths`` unless :data:`AS_WRITTEN`), its
    lines joined."""
    fixed = _entry(PUBLIC, exc)
    if fixed is not None:
        logger.warning("%s refused: %s", type(exc).__name__, exc)
        return str(fixed)
    text = str(exc) if isinstance(exc, AS_WRITTEN) else scrub_paths(str(exc))
    return (
        " ".join(line.strip() for line in text.splitlines() if line.strip()) or type(exc).__name__
    )


def error_headers(exc: BaseException, retry_after_s: int) -> dict[str, str]:
    """``Retry-After`` for an error that may pass (:data:`RETRY_LATER`), else none."""
    return {"Retry-After": str(retry_after_s)} if isinstance(exc, RETRY_LATER) else {}


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
