"""One ASGI middleware in front of every route: body size limit, auth, metrics, last-resort errors.

Pure ASGI (no per-request task as Starlette's BaseHTTPMiddleware makes), because it runs on
every batch-1 query. Order: a body over ``max_body_bytes`` is refused with 413 (by
Content-Length before it is read, else as it arrives); then the key is checked (401); then
the request runs and its status and latency are counted under the route's template. An exception that escapes a
route becomes a JSON 500 that names its type only; the traceback goes to the server log.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from magretrieve.server.auth import authorized, needs_key
from magretrieve.server.errors import error_body

logger = logging.getLogger(__name__)


async def _send_error(
    send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = error_body(status, message)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _limited(receive: Receive, limit: int) -> Receive:
    """``receive`` that counts the body as it arrives: a body sent without Content-Length
    (chunked) is refused with the same 413 once it passes the limit, before it is kept."""
    received = 0

    async def receive_limited() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                # FastAPI passes an HTTPException from the body read on to the app's handler
                raise HTTPException(
                    413, f"request body is over {limit} bytes; the limit is {limit}"
                )
        return message

    return receive_limited


class ServerMiddleware:
    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state
        key = state.settings.api_key
        self.key = key.encode() if key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = {"code": 500, "started": False}

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                status["started"] = True
            await send(message)

        headers = dict(scope.get("headers") or [])
        path = scope.get("path", "")
        try:
            length = headers.get(b"content-length")
            limit = self.state.settings.max_body_bytes
            if length is not None and length.isdigit() and int(length) > limit:
                await _send_error(
                    send_wrapper, 413, f"request body is {int(length)} bytes; the limit is {limit}"
                )
            elif (
                self.key is not None
                and needs_key(path, scope.get("method", "GET"))
                and not authorized(headers.get(b"authorization"), self.key)
            ):
                await _send_error(
                    send_wrapper,
                    401,
                    "missing or wrong API key: send the header Authorization: Bearer KEY",
                    [(b"www-authenticate", b"Bearer")],
                )
            else:
                await self.app(scope, _limited(receive, limit), send_wrapper)
        except Exception as exc:  # a bug: answer JSON, keep the traceback in the log only
            logger.exception("unhandled error on %s %s", scope.get("method"), path)
            if not status["started"]:
                await _send_error(
                    send_wrapper, 500, f"internal error ({type(exc).__name__}); see the server log"
                )
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            m = self.state.metrics
            m.requests.labels(label, scope.get("method", ""), str(status["code"])).inc()
            m.latency.labels(label).observe(time.perf_counter() - start)
