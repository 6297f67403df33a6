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
* **An answer must leave within ``timeout_response``** of being written: a client that does not
  read it (the answer stays in the server's buffers, and closing the connection would wait
  for them to drain) has its connection dropped. Before that, the body and the server's own
  answer have their deadlines in :mod:`magretrieve.server.middleware`, so every phase of a
  request is bounded.
* **``/health`` is never refused by the limit**: a liveness probe must tell "overloaded" from
  "dead", so it is answered whatever the count (the limit still sheds every other route).

The protocol class is picked like uvicorn's ``http="auto"`` (httptools when installed, else
h11) and given to ``uvicorn.Config(http=...)``; ``timeout_keep_alive`` comes from that config,
``timeout_response`` from :func:`protocol_class`.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

from magretrieve.serving.settings import ServerSettings

#: Paths the concurrency limit never refuses.
ALWAYS_ANSWERED = frozenset({"/health"})


class _HeadDeadline:
    """Mixin over a uvicorn HTTP protocol: the head and delivery deadlines and the ``/health``
    exemption."""

    _limit: int | None = None
    _head_timer: asyncio.TimerHandle | None = None
    _deliver_timer: asyncio.TimerHandle | None = None
    _running: Any = None  # the request being answered (httptools: pipelined ones wait)
    #: Seconds an answer may sit in the server's buffers (set by :func:`protocol_class`).
    deliver_within: float = ServerSettings.named("timeout_response").default

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

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._running = cycle
        super()._start_asgi_task(cycle, app)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        # uvicorn tells only the newest request it has read that the client is gone; with
        # pipelined requests the one running is an older one, which would go on writing to
        # the closed connection
        running = self._running
        if running is not None and not running.response_complete:
            running.disconnected = True
            running.message_event.set()
        self._stop_head_deadline()
        if self._deliver_timer is not None:
            self._deliver_timer.cancel()
            self._deliver_timer = None
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
        self._arm_delivery_deadline(restart=True)  # also when closing: close waits for them

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        self._arm_delivery_deadline()  # the buffers are full: the client is not reading

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

    # ------------------------------------------------------------------ delivering the answer

    def _arm_delivery_deadline(self, restart: bool = False) -> None:
        """From now on (``restart``), or from when it was first armed, what is written must
        be taken within :attr:`deliver_within`."""
        transport = getattr(self, "transport", None)
        if transport is None or (self._deliver_timer is not None and not restart):
            return
        if self._deliver_timer is not None:
            self._deliver_timer.cancel()
            self._deliver_timer = None
        if not transport.get_write_buffer_size():  # all handed to the kernel already
            return
        loop: asyncio.AbstractEventLoop = self.loop  # type: ignore[attr-defined]
        self._deliver_timer = loop.call_later(self.deliver_within, self._answer_not_taken)

    def _answer_not_taken(self) -> None:
        self._deliver_timer = None
        transport = getattr(self, "transport", None)
        if transport is not None and transport.get_write_buffer_size():
            transport.abort()  # close() would wait for a client that does not read


def protocol_class(timeout_response: float | None = None) -> type:
    """The HTTP protocol class for ``uvicorn.Config(http=...)``: an answer not taken by the
    client within ``timeout_response`` seconds (default: the server's) drops its connection."""
    if importlib.util.find_spec("httptools") is not None:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    else:  # pragma: no cover - the server extra installs httptools
        from uvicorn.protocols.http.h11_impl import H11Protocol as base  # type: ignore[assignment]
    within = _HeadDeadline.deliver_within if timeout_response is None else timeout_response
    return type("BoundedHttpProtocol", (_HeadDeadline, base), {"deliver_within": within})
