"""The knobs of one server: the engine's (batching, input limits) plus HTTP limits and auth.

Every knob is declared once, as a field with its default and help
(:func:`magretrieve.serving.settings.setting`); ``magretrieve serve`` derives its options from
these fields. Every limit is a refusal the client can read (413/422/503), never a crash or an
unbounded queue; the defaults suit one CPU replica serving a MiniLM-sized export.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from magretrieve.core.env import API_KEY_ENV
from magretrieve.core.errors import ConfigError
from magretrieve.serving.settings import EngineSettings, setting

#: Settings of the server that must be at least 1 (the engine checks its own).
_AT_LEAST_ONE = ("max_body_bytes", "max_k", "retry_after_s", "limit_concurrency")


@dataclass(frozen=True)
class ServerSettings(EngineSettings):
    """What a server accepts and how it batches (the engine's settings, see
    :class:`~magretrieve.serving.settings.EngineSettings`), and what only HTTP needs.

    ``api_key`` turns the write endpoints on and is required on every route but the open ones.
    ``max_body_bytes`` bounds a request body (16 MiB holds 2,048 texts of 8 KB each); ``max_k``
    the hits per query of ``/search``; ``retry_after_s`` is the ``Retry-After`` of a 503.
    ``onnx_spinning`` lets onnxruntime's threads spin-wait between runs (onnxruntime's
    default; turn it off where other processes share the cores, see
    :attr:`magretrieve.serving.runtime.OnnxEncoder.spinning`).
    ``model_id`` is the served model id (``GET /v1/models`` lists ``ID:query`` and
    ``ID:document``); None serves the export folder's name.
    ``limit_concurrency`` bounds the open connections and running requests (uvicorn's
    setting): past it a request gets 503 and its connection is closed, except ``/health``,
    which always answers. ``timeout_keep_alive`` is how long (seconds) a connection may sit
    without a request: idle after an answer (uvicorn's keep-alive timeout), and, from when it
    opens or its last answer, until the head of its next request has fully arrived, so a
    client that connects and sends nothing, or sends its headers a byte at a time, is closed
    (see :mod:`magretrieve.server.connections`). ``recall_sample`` is the share of unfiltered
    ``/search`` queries re-run exactly in the background for the live recall@10 gauge
    (:mod:`magretrieve.server.recall_watch`); 0 turns the check off.
    """

    api_key: str | None = setting(
        None,
        "Bearer key for every route but /health /ready /info /metrics; turns the write "
        f"endpoints on. Prefer ${API_KEY_ENV} (a flag shows in the process list).",
    )
    max_body_bytes: int = setting(16 * 1024 * 1024, "Bytes per request body.", cli=False)
    max_k: int = setting(1000, "Hits per query of /search.", cli=False)
    retry_after_s: int = setting(1, "Retry-After (seconds) of a 503.", cli=False)
    onnx_spinning: bool = setting(
        True,
        "Let onnxruntime's threads spin-wait between runs (fastest on cores of its own; "
        "--no-onnx-spinning where a database or other replicas share the cores).",
        flag="--onnx-spinning/--no-onnx-spinning",
        show_default=True,
    )
    model_id: str | None = setting(
        None,
        "Served model id: GET /v1/models lists ID:query and ID:document, which name the "
        "side (default: the export folder's name).",
    )
    limit_concurrency: int = setting(
        1024,
        "Open connections and running requests before new requests get 503 (/health "
        "always answers).",
        type=int,
        show_default=True,
    )
    timeout_keep_alive: float = setting(
        5.0,
        "Seconds a connection may wait without sending a complete request before it is "
        "closed (idle after an answer, or slow to send its headers).",
        type=float,
        show_default=True,
    )
    recall_sample: float = setting(
        0.01,
        "Share of /search queries re-run exactly in the background for the live recall@10 "
        "gauge (/metrics, /info); 0 turns it off.",
        type=float,
        within=(0.0, 1.0),
        show_default=True,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in _AT_LEAST_ONE:
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) < 1:
                raise ConfigError(f"server setting {name} must be at least 1, got {value!r}")
        if not 0 < self.timeout_keep_alive <= 3600:
            raise ConfigError(
                "timeout_keep_alive must be above 0 and at most 3600 seconds, "
                f"got {self.timeout_keep_alive}"
            )
        if not 0 <= self.recall_sample <= 1:
            raise ConfigError(f"recall_sample must be within 0..1, got {self.recall_sample}")
        if self.model_id is not None:
            from magretrieve.server.sides import model_id_problem

            problem = model_id_problem(self.model_id)
            if problem:
                raise ConfigError(f"the model id {self.model_id!r} {problem}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError("the API key is empty; pass a non-empty --api-key or unset it")
        if self.api_key is not None and self.api_key != self.api_key.strip():
            # HTTP drops whitespace around a header value: no client could send this key
            raise ConfigError(
                "the API key begins or ends with whitespace, which no HTTP client can send; "
                "remove it"
            )

    @property
    def writes_enabled(self) -> bool:
        """Write endpoints answer only on a server that has a key."""
        return self.api_key is not None


def key_from_env(given: str | None) -> str | None:
    """``given``, else ``$MAGRETRIEVE_API_KEY``, else None (no key: write endpoints off)."""
    if given is not None:
        return given
    value = os.environ.get(API_KEY_ENV)
    return value if value else None
