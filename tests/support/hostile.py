"""Small hostile HTTP servers on 127.0.0.1 for the remote client's tests.

A :class:`RawServer` reads each connection's request (head and ``Content-Length`` body),
records it, and hands the raw socket to an answer function, which may answer well, redirect,
trickle, stall, cut the body or send bytes that are not HTTP. One request per connection
(every answer says ``Connection: close``); :meth:`RawServer.close` ends every answer still
waiting.
"""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

#: Seconds an answer that stalls waits before giving up on its own (the tests end far sooner).
STALL = 30.0
#: What the well-behaved server answers on ``GET /info``.
INFO = {"dimension": 4, "limits": {"max_inputs": 8, "max_body_bytes": 1_000_000}}


@dataclass
class Seen:
    """One request as the server received it (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Answer = Callable[[socket.socket, Seen, threading.Event], None]


@dataclass
class RawServer:
    """A TCP server on a free 127.0.0.1 port; ``answer(conn, seen, stopped)`` answers each
    request. ``seen`` lists the requests received, in order."""

    answer: Answer
    seen: list[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stopped = threading.Event()
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._loop, daemon=True)
        self._accept.start()

    def _loop(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(STALL)
            try:
                seen = read_request(conn)
                self.seen.append(seen)
                self.answer(conn, seen, self.stopped)
            except OSError:
                pass  # the client went away: what a hostile answer often provokes

    def close(self) -> None:
        self.stopped.set()
        self._sock.close()
        for thread in [self._accept, *self._threads]:
            thread.join(5)

    def __enter__(self) -> RawServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_request(conn: socket.socket) -> Seen:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the client closed before a whole request head")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return Seen(method, path, headers, body)


def head(status: int, length: int | None, *extra: str, reason: str = "X") -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json", "Connection: close"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode("latin-1")


def reply(conn: socket.socket, status: int, body: object, *extra: str) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.sendall(head(status, len(raw), *extra) + raw)


def embeddings(seen: Seen, dim: int = 4) -> dict[str, object]:
    """A well-formed ``/v1/embeddings`` answer: text #i's vector is ``[i, i+1, ...]``."""
    texts = json.loads(seen.body)["input"]
    data = [
        {
            "index": i,
            "embedding": base64.b64encode(np.arange(i, i + dim, dtype="<f4").tobytes()).decode(),
        }
        for i in range(len(texts))
    ]
    return {"data": data, "input_type": json.loads(seen.body)["input_type"]}


def well_behaved(conn: socket.socket, seen: Seen, stopped: threading.Event) -> None:
    """What a magretrieve server answers (for ``/info`` and ``/v1/embeddings``)."""
    if seen.path.endswith("/info"):
        reply(conn, 200, INFO)
    else:
        reply(conn, 200, embeddings(seen))


def redirect_to(location: str, status: int = 302) -> Answer:
    def answer(conn: socket.socket, seen: Seen, stopped: threading.Event) -> None:
        reply(conn, status, b"", f"Location: {location}")

    return answer


def on_embeddings(answer: Answer) -> Answer:
    """``/info`` answered well, ``answer`` for every other request."""

    def either(conn: socket.socket, seen: Seen, stopped: threading.Event) -> None:
        (well_behaved if seen.path.endswith("/info") else answer)(conn, seen, stopped)

    return either


def trickle(body: bytes, every: float) -> Answer:
    """A 200 whose body arrives one byte every ``every`` seconds."""

    def answer(conn: socket.socket, seen: Seen, stopped: threading.Event) -> None:
        conn.sendall(head(200, len(body)))
        for byte in body:
            if stopped.wait(every):
                return
            conn.sendall(bytes([byte]))

    return answer


def late_head_then_stall(delay: float) -> Answer:
    """The head after ``delay`` seconds, then a body that never comes."""

    def answer(conn: socket.socket, seen: Seen, stopped: threading.Event) -> None:
        if stopped.wait(delay):
            return
        conn.sendall(head(200, 100) + b'{"dimension"')
        stopped.wait(STALL)

    return answer


def silent(conn: socket.socket, seen: Seen, stopped: threading.Event) -> None:
    """Reads the request and never answers."""
    stopped.wait(STALL)


def raw(data: bytes) -> Answer:
    """Sends ``data`` as the whole answer and closes."""

    def answer(conn: socket.socket, seen: Seen, stopped: threading.Event) -> None:
        conn.sendall(data)

    return answer


def elapsed(fn: Callable[[], object]) -> tuple[float, BaseException | None]:
    """Seconds ``fn()`` took and the exception it raised (None if it returned)."""
    start = time.monotonic()
    try:
        fn()
    except BaseException as exc:
        return time.monotonic() - start, exc
    return time.monotonic() - start, None
