"""What a client can hold open: uvicorn's HTTP protocol with two additions.

uvicorn bounds concurrency (``limit_concurrency``: past it, 503 and the connection closed) and
closes a connection left idle after an answer (``timeout_keep_alive``). It does not time out a
connection that has not yet sent a complete request head: a client that connects and sends
nothing, or dribbles its headers a byte at a time (each byte restarts the keep-alive timer),
holds its connection forever, and with a concurrency limit enough of them turn every request
into a 503. So:

* **A request head must arrive within ``timeout_keep_alive``** of the connection opening (or of
  its previous answer); data arriving does not restart that clock, a complete head stops it.
  An idle or slow connection is closed and gives its place back.
* **``/health`` is never refused by the limit**: a liveness probe must tell "overloaded" from
  "dead", so it is answered whatever the count (the limit still sheds every other route).

The protocol class is picked like uvicorn's ``http="auto"`` (httptools when installed, else
h11) and given to ``uvicorn.Config(http=...)``.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

#: Paths the concurrency limit never refuses.
ALWAYS_ANSWERED = frozenset({"/health"})


class _HeadDeadline:
    """Mixin over a uvicorn HTTP protocol: the head deadline and the ``/health`` exemption."""

    _limit: int | None = None
    _head_timer: asyncio.TimerHandle | None = None

    # uvicorn reads ``self.limit_concurrency`` once per request, right after it has set the
    # request's ``scope``; answering None there lets an always-answered path through
    @property
    def limit_concurrency(self) -> int | None:
        scope = getattr(self, "scope", None)
        if scope and scope.get("path") in ALWAYS_ANSWERED:
            return None
        return self._limit

    @limit_concurrency.setter
    def limit_concurrency(self, value: int | None) -> None:
        self._limit = value

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_deadline()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        before = getattr(self, "cycle", None)
        super().data_received(data)  # type: ignore[misc]
        if getattr(self, "cycle", None) is not before:  # a request head is complete
            self._stop_head_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if not self._busy():  # waiting for the next request's head
            self._arm_head_deadline()

    # ------------------------------------------------------------------ the deadline

    def _busy(self) -> bool:
        cycle = getattr(self, "cycle", None)
        return cycle is not None and not cycle.response_complete

    def _arm_head_deadline(self) -> None:
        self._stop_head_deadline()
        transport = getattr(self, "transport", None)
        if transport is None or transport.is_closing():
            return
        loop: asyncio.AbstractEventLoop = self.loop  # type: ignore[attr-defined]
        timeout = float(self.timeout_keep_alive)  # type: ignore[attr-defined]
        self._head_timer = loop.call_later(timeout, self._head_too_slow)

    def _stop_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        transport = getattr(self, "transport", None)
        if transport is not None and not transport.is_closing() and not self._busy():
            transport.close()


def protocol_class() -> type:
    """The HTTP protocol class for ``uvicorn.Config(http=...)``."""
    if importlib.util.find_spec("httptools") is not None:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:  # pragma: no cover - the server extra installs httptools
        from uvicorn.protocols.http.h11_impl import H11Protocol as base  # type: ignore[assignment]
    return type("BoundedHttpProtocol", (_HeadDeadline, base), {})
