"""A client of a running ``magretrieve serve`` with :class:`~magretrieve.serving.onnx_encoder.OnnxEncoder`'s
encoding surface, so the framework integrations embed in-process or remotely alike.

    enc = RemoteEncoder("http://127.0.0.1:8080", api_key=os.environ["MAGRETRIEVE_API_KEY"])
    q = enc.encode_queries(["statins reduce mortality"])      # the server's query graph
    d = enc.encode_documents(texts)                           # its document graph, norms kept

Each call posts to ``POST /v1/embeddings`` with ``input_type`` set to the side (never guessed),
asks for base64 (the exact float32 bytes the server computed) and splits the texts into
requests the server accepts: at most ``limits.max_inputs`` texts and ``limits.max_body_bytes``
bytes each, read once from ``GET /info``.

The transport is httpx (imported when a client is made, so ``import magretrieve`` and the
in-process integrations never load it), held to what a client carrying a key must do:

- ``timeout`` is one deadline per request, across connecting, sending and every read of the
  answer: a server that trickles its body or stalls between phases is given up on at
  ``timeout``, not ``timeout`` per phase;
- the key is sent to ``url`` only: no redirect is followed (a 3xx is an error naming its
  ``Location``), so no other host, port or scheme ever receives it;
- every refusal, transport failure or malformed answer is one :class:`RemoteEncoderError`
  naming the request's URL, holding the server's own message when it sent one; the key is in
  no message, ``repr`` or log record, and the client refuses to be pickled.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from magretrieve.core.config import SIDES
from magretrieve.core.errors import ConfigError, MagRetrieveError
from magretrieve.core.extras import require
from magretrieve.core.redact import redact, remember_secrets
from magretrieve.core.text import blank, lone_surrogate

if TYPE_CHECKING:
    import httpx

#: Seconds one request may take, from connecting to the answer's last byte.
DEFAULT_TIMEOUT = 60.0
#: Times a request answered 503 (queue full, server draining) is sent again, after the
#: server's ``Retry-After`` (at most :data:`MAX_RETRY_WAIT` seconds).
RETRIES_503 = 3
MAX_RETRY_WAIT = 10.0
#: Share of the server's body limit one request may fill (JSON framing, the other fields).
BODY_SHARE = 0.9


class RemoteEncoderError(MagRetrieveError):
    """The server refused a request, could not be reached, gave no answer within the timeout,
    redirected, or answered something that is not a magretrieve answer; the message names the
    request's URL (and holds the server's own message when it sent one)."""


def check_url(url: Any) -> str:
    """A server's base URL: ``http(s)://host[:port][/prefix]``, without credentials."""
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"url must be a server's base URL such as http://HOST:8080, got {url!r}")
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(
            f"url must start with http:// or https:// and name a host, got {redact(url)!r}"
        )
    if parts.username is not None or parts.password is not None:
        raise ConfigError("url must not hold credentials; pass the server's key as api_key")
    if parts.query or parts.fragment:
        raise ConfigError(f"url must be a base URL without ?query or #fragment: {url!r}")
    return url.strip().rstrip("/")


def check_api_key(api_key: Any) -> str | None:
    """None (a server without a key) or the key, which HTTP can send as a bearer token."""
    if api_key is None:
        return None
    if not isinstance(api_key, str):
        raise ConfigError(f"api_key must be a string, got {type(api_key).__name__}")
    if not api_key.strip() or api_key != api_key.strip():
        raise ConfigError("api_key is empty or begins or ends with whitespace")
    if not (api_key.isascii() and api_key.isprintable()):
        raise ConfigError("api_key must be printable ASCII: it is sent as an HTTP header")
    remember_secrets(options={"api_key": api_key})
    return api_key


class RemoteEncoder:
    """Encodes queries and documents with the graphs of a ``magretrieve serve`` process.

    ``url`` is the server's base URL, ``api_key`` its key (None for a server started without
    one; sent to ``url`` only), ``timeout`` seconds per request from connecting to the last
    byte of the answer, ``model`` the id sent in each request (None: the server's own). Safe to
    share between threads; :meth:`close` (or ``with``) closes its connections. Not picklable:
    it holds the key (the framework classes pickle without it).
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        model: str | None = None,
    ) -> None:
        self.url = check_url(url)
        self._api_key = check_api_key(api_key)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)
        if model is not None and not isinstance(model, str):
            raise ConfigError(f"model must be a string, got {type(model).__name__}")
        self.model = model
        self._http = _client(self.timeout)
        self._info: dict[str, Any] | None = None
        self._lock = threading.Lock()
        #: Texts the server cut at the side's max length in the most recent call.
        self.last_truncated = 0

    def close(self) -> None:
        """Close the pooled connections; the encoder sends no request after."""
        self._http.close()

    def __enter__(self) -> RemoteEncoder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a RemoteEncoder is not pickled: it holds the server's API key; pickle the "
            "framework object (it re-reads $MAGRETRIEVE_API_KEY) or make one per process"
        )

    # ------------------------------------------------------------------ the server's facts

    def info(self) -> dict[str, Any]:
        """The server's ``GET /info`` (manifest facts and limits), read once."""
        with self._lock:
            if self._info is None:
                answer = self._request("GET", "/info")
                problem = _info_problem(answer)
                if problem:
                    raise RemoteEncoderError(
                        f"{self.url}/info did not answer like a magretrieve server ({problem})"
                    )
                self._info = answer
            return self._info

    @property
    def dim(self) -> int:
        return int(self.info()["dimension"])

    @property
    def max_inputs(self) -> int:
        """Most texts the server takes in one request."""
        limits = self.info().get("limits") or {}
        return int(limits.get("max_inputs") or self.info().get("max_client_batch_size") or 1)

    @property
    def max_body_bytes(self) -> int | None:
        limits = self.info().get("limits") or {}
        value = limits.get("max_body_bytes")
        return int(value) if value else None

    # ------------------------------------------------------------------ encoding

    def encode_queries(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """float32 (n, dim) query vectors from the server's query graph."""
        return self._encode(texts, "query", batch_size)

    def encode_documents(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """float32 (n, dim) document vectors from the server's document graph (norms kept)."""
        return self._encode(texts, "document", batch_size)

    def _encode(self, texts: Sequence[str], side: str, batch_size: int | None) -> np.ndarray:
        texts = check_texts(texts, side)
        if batch_size is not None and (
            isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1
        ):
            raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows = min(batch_size or self.max_inputs, self.max_inputs)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        truncated = 0
        for start, stop in self._batches(texts, rows):
            vectors, cut = self._post(texts[start:stop], side, start)
            out[start:stop] = vectors
            truncated += cut
        self.last_truncated = truncated
        return out

    def _batches(self, texts: list[str], rows: int) -> list[tuple[int, int]]:
        """(start, stop) of each request: at most ``rows`` texts and a share of the body limit."""
        limit = self.max_body_bytes
        budget = int(limit * BODY_SHARE) if limit else None
        spans: list[tuple[int, int]] = []
        start, size = 0, 0
        for n, text in enumerate(texts):
            length = len(json.dumps(text)) + 2  # the JSON string and its separator
            if n > start and (n - start >= rows or (budget and size + length > budget)):
                spans.append((start, n))
                start, size = n, 0
            size += length
        spans.append((start, len(texts)))
        return spans

    def _post(self, texts: list[str], side: str, offset: int) -> tuple[np.ndarray, int]:
        body: dict[str, Any] = {"input": texts, "input_type": side, "encoding_format": "base64"}
        if self.model is not None:
            body["model"] = self.model
        try:
            answer = self._request("POST", "/v1/embeddings", body)
        except RemoteEncoderError as exc:
            if offset:  # the server counts inputs from 0 in each request
                raise RemoteEncoderError(f"{exc} (request of texts #{offset}…)") from None
            raise
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or len(data) != len(texts):
            raise RemoteEncoderError(
                f"{self.url}/v1/embeddings answered {len(data) if isinstance(data, list) else 0} "
                f"vectors for {len(texts)} texts"
            )
        if answer.get("input_type") not in (None, side):
            raise RemoteEncoderError(
                f"{self.url}/v1/embeddings encoded the {answer.get('input_type')} side "
                f"when asked for {side}"
            )
        dim = self.dim
        vectors = np.zeros((len(texts), dim), dtype=np.float32)
        seen: set[int] = set()
        cut = 0
        for n, item in enumerate(data):
            where = f"{self.url}/v1/embeddings answered"
            try:
                index, vector = item["index"], decode_embedding(item["embedding"])
            except (TypeError, KeyError, ValueError) as exc:  # binascii.Error is a ValueError
                raise RemoteEncoderError(
                    f"{where} item #{n} without an index and a float32 embedding: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
            if isinstance(index, bool) or not isinstance(index, int):
                raise RemoteEncoderError(f"{where} item #{n} with index {index!r}")
            if not 0 <= index < len(texts) or index in seen:
                twice = " twice" if index in seen else f" for {len(texts)} texts"
                raise RemoteEncoderError(f"{where} index {index}{twice}")
            if vector.shape != (dim,):
                raise RemoteEncoderError(
                    f"{where} a vector of dimension {vector.size}; its /info says {dim}"
                )
            seen.add(index)
            vectors[index] = vector
            cut += bool(item.get("truncated"))
        return vectors, cut

    # ------------------------------------------------------------------ HTTP

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        """The JSON answer of one request (sent again after a 503, as ``Retry-After`` says)."""
        data = json.dumps(body).encode("utf-8") if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self._api_key is not None:
            headers["Authorization"] = f"Bearer {self._api_key}"
        where = f"{method} {self.url}{path}"
        if self._http.is_closed:
            raise RemoteEncoderError(f"{where}: this RemoteEncoder is closed")
        for attempt in range(RETRIES_503 + 1):
            answer = self._exchange(method, self.url + path, data, headers, where)
            if answer.status != 503 or attempt == RETRIES_503:
                break
            time.sleep(_retry_after(answer.headers.get("retry-after")))
        if 300 <= answer.status < 400:
            location = answer.headers.get("location")
            if not location:
                raise RemoteEncoderError(f"{where} answered {answer.status} without a Location")
            target = urllib.parse.urljoin(self.url + path, location)[:300]
            raise RemoteEncoderError(
                f"{where} answered {answer.status}, a redirect to {target}: not followed (the "
                f"key is sent to {self.url} only); give the server's own address as url"
            )
        if not 200 <= answer.status < 300:
            message = _server_message(answer.body, answer.reason)
            raise RemoteEncoderError(f"{where} answered {answer.status}: {message}")
        try:
            return json.loads(answer.body)
        except ValueError:
            raise RemoteEncoderError(f"{where} did not answer JSON") from None

    def _exchange(
        self, method: str, url: str, data: bytes | None, headers: dict[str, str], where: str
    ) -> _Answer:
        """One request and its whole answer, within :attr:`timeout` seconds from now.

        httpx's timeouts bound each phase (connect, each write, each read) on its own, so a
        body trickled a byte at a time would never end; the request runs in a worker thread
        that this one waits for until the deadline, and the worker stops reading at it too.
        """
        deadline = time.monotonic() + self.timeout
        outcome: list[_Answer | BaseException] = []
        done = threading.Event()

        def run() -> None:
            try:
                outcome.append(self._send(method, url, data, headers, deadline))
            except BaseException as exc:  # handed to the waiting thread
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=run, name="magretrieve-remote", daemon=True).start()
        if not done.wait(max(deadline - time.monotonic(), 0.0)) or not outcome:
            raise RemoteEncoderError(f"{where}: no complete answer within {self.timeout:g} s")
        result = outcome[0]
        if isinstance(result, BaseException):
            raise _transport_error(result, where, self.timeout)
        return result

    def _send(
        self, method: str, url: str, data: bytes | None, headers: dict[str, str], deadline: float
    ) -> _Answer:
        response = self._http.send(
            self._http.build_request(method, url, content=data, headers=headers), stream=True
        )
        try:
            chunks = []
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > deadline:  # the caller has given up: stop reading
                    raise TimeoutError
            return _Answer(
                response.status_code, response.reason_phrase, response.headers, b"".join(chunks)
            )
        finally:
            response.close()

    def __repr__(self) -> str:
        key = "set" if self._api_key else "none"
        return f"RemoteEncoder({self.url}, api_key={key}, timeout={self.timeout:g})"


@dataclass(frozen=True)
class _Answer:
    """One HTTP answer, read whole."""

    status: int
    reason: str
    headers: httpx.Headers
    body: bytes


def _client(timeout: float) -> httpx.Client:
    """An httpx client that follows no redirect; each phase bounded by ``timeout`` too."""
    require(
        "httpx",
        what="the remote embedding client",
        extra="langchain",
        hint="or 'magretrieve[llama-index]' or 'magretrieve[haystack]'",
    )
    import httpx

    return httpx.Client(timeout=httpx.Timeout(timeout), follow_redirects=False)


def _transport_error(exc: BaseException, where: str, timeout: float) -> BaseException:
    """The :class:`RemoteEncoderError` of a failed exchange (a bug is returned unchanged)."""
    import httpx

    text = str(exc) or type(exc).__name__
    if isinstance(exc, (httpx.TimeoutException, TimeoutError)):
        return RemoteEncoderError(f"{where}: no complete answer within {timeout:g} s")
    if isinstance(exc, httpx.ConnectError):
        return RemoteEncoderError(f"cannot reach {where}: {text}")
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return RemoteEncoderError(f"{where}: the answer broke off or is not HTTP ({text})")
    if isinstance(exc, (httpx.HTTPError, httpx.StreamError, OSError)):
        return RemoteEncoderError(f"{where}: {type(exc).__name__}: {text}")
    return exc


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _info_problem(answer: Any) -> str | None:
    """What keeps ``answer`` from being a magretrieve ``/info``, None when nothing does."""
    if not isinstance(answer, dict):
        return f"a JSON {type(answer).__name__}, not an object"
    if not _positive_int(answer.get("dimension")):
        return f"dimension {answer.get('dimension')!r}"
    limits = answer.get("limits") or {}
    if not isinstance(limits, dict):
        return f"limits {limits!r}"
    for name in ("max_inputs", "max_body_bytes"):
        if limits.get(name) is not None and not _positive_int(limits[name]):
            return f"limits.{name} {limits[name]!r}"
    batch = answer.get("max_client_batch_size")
    if batch is not None and not _positive_int(batch):
        return f"max_client_batch_size {batch!r}"
    return None


def check_text(text: Any, position: int) -> None:
    """The rule the server applies, checked before any request: a non-blank Unicode string."""
    if not isinstance(text, str):
        raise ConfigError(f"text #{position} is a {type(text).__name__}, not a string")
    if blank(text):
        raise ConfigError(
            f"text #{position} is empty or only whitespace and invisible characters: "
            "nothing to encode"
        )
    bad = lone_surrogate(text)
    if bad is not None:
        raise ConfigError(f"text #{position} holds a lone surrogate at character {bad}")


def check_texts(texts: Sequence[str], side: str) -> list[str]:
    """``texts`` as a list, checked before anything is encoded: a known side, a list (not one
    string), no blank or unencodable text (named by its position)."""
    if side not in SIDES:
        raise ConfigError(f"side must be one of {SIDES}, got {side!r}")
    if isinstance(texts, str):
        raise ConfigError("pass a list of texts, not a single string")
    texts = list(texts)
    for n, text in enumerate(texts):
        check_text(text, n)
    return texts


def decode_embedding(value: Any) -> np.ndarray:
    """One vector from an ``embedding`` field: base64 little-endian float32, or a number list
    (ValueError for anything else)."""
    if isinstance(value, str):
        raw = base64.b64decode(value, validate=True)
        return np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not isinstance(value, list) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in value
    ):
        raise ValueError("not base64 float32 or a list of numbers")
    return np.asarray(value, dtype=np.float32)


def _server_message(raw: bytes, reason: Any) -> str:
    """The ``error.message`` of a JSON error body, else the HTTP reason."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(body.get("detail"), str):
            return str(body["detail"])
    return str(reason or "no message")


def _retry_after(value: str | None) -> float:
    try:
        return min(max(float(value or 1), 0.0), MAX_RETRY_WAIT)
    except ValueError:
        return 1.0
