"""The knobs of one server: limits, dynamic batching, auth; validated once at start.

Every limit is a refusal the client can read (413/422/503), never a crash or an unbounded
queue; the defaults suit one CPU replica serving a MiniLM-sized export.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from magretrieve.core.batching import DEFAULT_BATCH_TOKENS
from magretrieve.core.env import API_KEY_ENV
from magretrieve.core.errors import ConfigError

#: Environment variable that holds the API key when ``--api-key`` is not given.


@dataclass(frozen=True)
class ServerSettings:
    """What a server accepts and how it batches.

    ``max_batch_tokens`` is the padded-token budget of one merged batch (rows × longest);
    ``max_batch_rows`` caps texts per graph run; ``max_wait_ms`` is how long the batcher holds
    the first request of a batch for others to join (a request alone in the queue runs at once);
    ``min_batch_fill`` is the least share of a merged batch's padded tokens that must be real
    tokens (requests of very different lengths are not merged); ``batching=False`` encodes every request
    on its own (the baseline the benchmark compares against). ``max_queue`` bounds requests
    waiting for the encoder: past it a request gets 503 with ``Retry-After``.
    ``onnx_spinning`` lets onnxruntime's threads spin-wait between runs (onnxruntime's
    default; turn it off where other processes share the cores, see
    :mod:`magretrieve.server.encoder`).
    ``graph_workers`` is how many batches run at once: each worker runs its batch on its own
    share of the intra-op threads (``threads // graph_workers``), so with one worker per core a
    graph run never waits for other threads to wake up; a batch with nothing beside it and
    nothing queued behind it runs on every thread instead (the graphs are opened twice). The
    server uses at most one worker per thread.
    ``model_id`` is the served model id (``GET /v1/models`` lists ``ID:query`` and
    ``ID:document``); None serves the export folder's name.
    ``max_inputs`` is OpenAI's own limit of texts per request (2,048), so clients that batch
    for OpenAI fit; each request is still encoded in batches of ``max_batch_tokens``, and its
    body is bounded by ``max_body_bytes`` (16 MiB holds 2,048 texts of 8 KB each).
    ``limit_concurrency`` bounds the open connections and running requests (uvicorn's
    setting): past it a request gets 503 and its connection is closed, except ``/health``,
    which always answers. ``timeout_keep_alive`` is how long (seconds) a connection may sit
    without a request: idle after an answer (uvicorn's keep-alive timeout), and, from when it
    opens or its last answer, until the head of its next request has fully arrived, so a
    client that connects and sends nothing, or sends its headers a byte at a time, is closed
    (see :mod:`magretrieve.server.connections`).
    """

    api_key: str | None = None
    max_inputs: int = 2048
    max_text_chars: int = 32_768
    max_body_bytes: int = 16 * 1024 * 1024
    max_k: int = 1000
    max_batch_tokens: int = DEFAULT_BATCH_TOKENS
    max_batch_rows: int = 64
    max_wait_ms: float = 2.0
    min_batch_fill: float = 0.75
    max_queue: int = 512
    batching: bool = True
    retry_after_s: int = 1
    onnx_spinning: bool = True
    graph_workers: int = 2
    model_id: str | None = None
    limit_concurrency: int = 1024
    timeout_keep_alive: float = 5.0
    #: Share of unfiltered /search queries re-run exactly in the background for the live
    #: recall@10 gauge (:mod:`magretrieve.server.recall_watch`); 0 turns the check off.
    recall_sample: float = 0.01

    def __post_init__(self) -> None:
        for name in (
            "max_inputs",
            "max_text_chars",
            "max_body_bytes",
            "max_k",
            "max_batch_tokens",
            "max_batch_rows",
            "max_queue",
            "retry_after_s",
            "graph_workers",
            "limit_concurrency",
        ):
            if int(getattr(self, name)) < 1:
                raise ConfigError(
                    f"server setting {name} must be at least 1, got {getattr(self, name)}"
                )
        if not 0 <= self.max_wait_ms <= 10_000:
            raise ConfigError(f"max_wait_ms must be within 0..10000, got {self.max_wait_ms}")
        if not 0 < self.timeout_keep_alive <= 3600:
            raise ConfigError(
                "timeout_keep_alive must be above 0 and at most 3600 seconds, "
                f"got {self.timeout_keep_alive}"
            )
        if not 0 <= self.recall_sample <= 1:
            raise ConfigError(f"recall_sample must be within 0..1, got {self.recall_sample}")
        if not 0 <= self.min_batch_fill <= 1:
            raise ConfigError(f"min_batch_fill must be within 0..1, got {self.min_batch_fill}")
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
