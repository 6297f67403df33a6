"""One ASGI middleware in front of every route: body limits, deadlines, HEAD, auth, metrics, errors.

Pure ASGI (no per-request task as Starlette's BaseHTTPMiddleware makes), because it runs on
every batch-1 query. Order: a body over ``max_body_bytes`` is refused with 413 (by
Content-Length before it is read, else as it arrives); then the key is checked (401); then
the request runs and its status and latency are counted under the route's template. An
exception that escapes a route becomes a JSON 500 that names its type only; the traceback goes
to the server log.

The phases of a request after its head (whose deadline is the connection's:
:mod:`magretrieve.server.connections`) have deadlines here, so that no client holds a place
under the concurrency limit for longer than the server allows:

* **the body** must have arrived ``timeout_body`` seconds after the request started: a body
  sent slower (a byte a second) is answered 408 with ``Connection: close``;
* **the answer** must have begun ``timeout_response`` seconds after the body arrived (after
  the head, for a request without one): past it the route is cancelled and answered 503 with
  ``Connection: close`` (a store write runs in a worker thread, which a cancel does not cut:
  the answer waits for it).

Both are anyio cancel scopes (the event loop's own timers, no task per request): about 30 µs
of CPU for a request with a body, against the ~9 ms of CPU a batch-1 query costs at 213 q/s
on two cores.

``HEAD`` is answered wherever ``GET`` is (RFC 9110: probes and uptime checks use it): the
request runs as the ``GET``, with its status and headers, and its body is dropped.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import anyio
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from magretrieve.server.auth import authorized, needs_key
from magretrieve.server.errors import error_body

logger = logging.getLogger(__name__)

#: Scope key that keeps the method a request was sent with when it runs as another one
#: (``HEAD`` runs as ``GET``).
SENT_METHOD = "magretrieve.sent_method"

#: Headers of an answer after which the connection is not reused (the request may not have
#: been read to its end).
_CLOSE = (b"connection", b"close")


def sent_method(scope: Scope) -> str:
    """The method the client sent (``HEAD`` for a ``HEAD`` answered as its ``GET``)."""
    return str(scope.get(SENT_METHOD) or scope.get("method", "GET"))


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


def _has_body(headers: dict[bytes, bytes]) -> bool:
    length = headers.get(b"content-length")
    if length is not None:
        return length.strip() not in (b"", b"0")
    return b"chunked" in headers.get(b"transfer-encoding", b"").lower()


def _bounded(receive: Receive, limit: int, timeout: float, arrived: Callable[[], None]) -> Receive:
    """``receive`` that counts the body as it arrives, and gives it ``timeout`` seconds from
    now to arrive whole.

    A body sent without Content-Length (chunked) is refused with the same 413 once it passes
    the limit, before it is kept; a body still arriving after ``timeout`` is a 408 that closes
    the connection (what is left of it is never read). ``arrived`` is called once the body is
    complete.
    """
    received = 0
    deadline = anyio.current_time() + timeout
    complete = False

    async def receive_bounded() -> Message:
        nonlocal received, complete
        if complete:  # after the body only a disconnect can come: no deadline on waiting for it
            return await receive()
        try:
            with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
                message = await receive()
        except TimeoutError:
            # FastAPI passes an HTTPException from the body read on to the app's handler
            raise HTTPException(
                408,
                f"the request body did not arrive within {timeout:g} s (the server's "
                "--timeout-body); send it at once, or ask for a longer --timeout-body",
                headers={"Connection": "close"},
            ) from None
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                raise HTTPException(
                    413, f"request body is over {limit} bytes; the limit is {limit}"
                )
            if not message.get("more_body", False):
                complete = True
                arrived()
        return message

    return receive_bounded


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
        method = scope.get("method", "GET")
        head = method == "HEAD"
        if head:  # answered as its GET, without the body
            scope = {**scope, "method": "GET", SENT_METHOD: "HEAD"}
        settings = self.state.settings
        headers = dict(scope.get("headers") or [])
        has_body = _has_body(headers)
        # the answer's deadline: the body's time (if any), then the server's own
        answering = anyio.CancelScope(
            deadline=anyio.current_time()
            + settings.timeout_response
            + (settings.timeout_body if has_body else 0.0)
        )

        def body_arrived() -> None:
            answering.deadline = anyio.current_time() + settings.timeout_response

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
                status["started"] = True
                answering.deadline = math.inf  # begun: delivering it is the connection's part
            elif head and message["type"] == "http.response.body" and message.get("body"):
                message = {**message, "body": b""}
            await send(message)

        path = scope.get("path", "")
        try:
            length = headers.get(b"content-length")
            limit = settings.max_body_bytes
            if length is not None and length.isdigit() and int(length) > limit:
                await _send_error(
                    send_wrapper, 413, f"request body is {int(length)} bytes; the limit is {limit}"
                )
            elif (
                self.key is not None
                and needs_key(path, method)
                and not authorized(headers.get(b"authorization"), self.key)
            ):
                await _send_error(
                    send_wrapper,
                    401,
                    "missing or wrong API key: send the header Authorization: Bearer KEY",
                    [(b"www-authenticate", b"Bearer")],
                )
            else:
                with answering:
                    await self.app(
                        scope,
                        _bounded(receive, limit, settings.timeout_body, body_arrived),
                        send_wrapper,
                    )
                if answering.cancelled_caught and not status["started"]:
                    timeout = settings.timeout_response
                    await _send_error(
                        send_wrapper,
                        503,
                        f"no answer within {timeout:g} s (the server's --timeout-response); "
                        "try again later",
                        [(b"retry-after", str(settings.retry_after_s).encode()), _CLOSE],
                    )
        except Exception as exc:  # a bug: answer JSON, keep the traceback in the log only
            logger.exception("unhandled error on %s %s", method, path)
            if not status["started"]:
                await _send_error(
                    send_wrapper, 500, f"internal error ({type(exc).__name__}); see the server log"
                )
        finally:
            route = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            m = self.state.metrics
            m.requests.labels(label, method, str(status["code"])).inc()
            m.latency.labels(label).observe(time.perf_counter() - start)
