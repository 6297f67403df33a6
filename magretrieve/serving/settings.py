"""The knobs of the embedding engine and of the HTTP server on it, each declared once.

A knob is a dataclass field made by :func:`magretrieve.core.options.option`: its default is the
field's default, and its help, command-line flag, bounds and environment variable sit in its
declaration, so ``magretrieve serve`` derives its options from it
(:mod:`magretrieve.cli._options`) and the settings check their own values against it
(:meth:`~magretrieve.core.options.OptionClass.check_declared`: the same error line from
Python and from the command line). :class:`EngineSettings` holds what the embedding engine
needs; :class:`ServerSettings` extends it with what only the HTTP server needs. Both live here,
in the serving layer, because the command line must read them without the ``server`` extra
(FastAPI and uvicorn are imported only when a server starts);
:mod:`magretrieve.server.settings` is where the HTTP layer imports them from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from magretrieve.core.batching import DEFAULT_BATCH_TOKENS
from magretrieve.core.config import SIDES
from magretrieve.core.env import API_KEY_ENV
from magretrieve.core.errors import ConfigError
from magretrieve.core.options import OptionClass, option


@dataclass(frozen=True)
class EngineSettings(OptionClass):
    """What the embedding engine accepts per call and how it merges calls into batches.

    ``max_batch_tokens`` is the padded-token budget of one merged batch (rows × longest);
    ``max_batch_rows`` caps texts per graph run; ``max_wait_ms`` is how long the batcher holds
    the first call of a batch for others to join (a call alone in the queue runs at once);
    ``min_batch_fill`` is the least share of a merged batch's padded tokens that must be real
    tokens (calls of very different lengths are not merged); ``batching=False`` encodes every
    call on its own (the baseline the benchmark compares against). ``max_queue`` bounds calls
    waiting for the graphs: past it a call raises :class:`~magretrieve.serving.errors.QueueFull`.
    ``graph_workers`` is how many batches run at once: each worker runs its batch on its own
    share of the intra-op threads (``threads // graph_workers``), so with one worker per core a
    graph run never waits for other threads to wake up; a batch with nothing beside it and
    nothing queued behind it runs on every thread instead (the graphs are opened twice). At
    most one worker per thread is used.
    ``max_inputs`` is OpenAI's own limit of texts per call (2,048), so clients that batch for
    OpenAI fit; each call is still encoded in batches of ``max_batch_tokens``.
    """

    max_inputs: int = option(
        "Texts per request (OpenAI's limit; still encoded in batches of --max-batch-tokens).",
        default=2048,
        flag="--max-inputs",
        minimum=1,
    )
    max_text_chars: int = option(
        "Characters per text.", default=32_768, flag="--max-text-chars", minimum=1
    )
    max_batch_tokens: int = option(
        "Padded-token budget of one merged batch.",
        default=DEFAULT_BATCH_TOKENS,
        flag="--max-batch-tokens",
        minimum=1,
    )
    max_batch_rows: int = option("Texts per batch.", default=64, flag="--max-batch-rows", minimum=1)
    max_wait_ms: float = option(
        "How long a request waits for others to join its batch.",
        default=2.0,
        flag="--max-wait-ms",
        minimum=0,
        maximum=10_000,
    )
    min_batch_fill: float = option(
        "Least share of a merged batch's padded tokens that are real tokens.",
        default=0.75,
        minimum=0,
        maximum=1,
    )
    max_queue: int = option(
        "Waiting requests before 503.", default=512, flag="--max-queue", minimum=1
    )
    batching: bool = option("Encode every request on its own.", default=True, flag="--no-batching")
    graph_workers: int = option(
        "Batches run at once, each on --threads / N intra-op threads (a batch alone "
        "runs on all of them).",
        default=2,
        flag="--graph-workers",
        minimum=1,
    )

    def __post_init__(self) -> None:
        self.check_declared()  # every field, the server's too, against its declaration


#: What a model id may not hold: whitespace and control characters (ids go in URLs and configs).
_BAD_ID = re.compile(r"[\s\x00-\x1f\x7f]")


def model_id_problem(model_id: str) -> str | None:
    """Why ``model_id`` cannot be a served id, or None when it can."""
    if not model_id or _BAD_ID.search(model_id):
        return "must be non-empty, without whitespace or control characters"
    if len(model_id) > 200:
        return "must be at most 200 characters"
    if any(model_id.endswith(f":{side}") for side in SIDES):
        return "must not end in :query or :document (the server adds those to name a side)"
    return None


@dataclass(frozen=True)
class ServerSettings(EngineSettings):
    """What a server accepts and how it batches (the engine's settings,
    :class:`EngineSettings`), and what only HTTP needs.

    ``api_key`` turns the write endpoints on and is required on every route but the open ones.
    ``max_body_bytes`` bounds a request body (16 MiB holds 2,048 texts of 8 KB each); ``max_k``
    the hits per query of ``/search``; ``retry_after_s`` is the ``Retry-After`` of a 503.
    ``onnx_spinning`` lets onnxruntime's threads spin-wait between runs (see
    :attr:`magretrieve.serving.onnx_encoder.OnnxEncoder.spinning`); None (the default) spins
    only on a server without a store: a store's searches (in this process, or a database
    beside it) need the cores the spinning threads would hold between runs, and at a
    million vectors served q/s rose 8–12 % without spinning
    (benchmarks/results/serve_search.md).
    ``model_id`` is the served model id (``GET /v1/models`` lists ``ID:query`` and
    ``ID:document``); None serves the export folder's name.
    ``limit_concurrency`` bounds the open connections and running requests (uvicorn's
    setting): past it a request gets 503 and its connection is closed, except ``/health``,
    which always answers. ``timeout_keep_alive`` is how long (seconds) a connection may sit
    without a request: idle after an answer (uvicorn's keep-alive timeout), and, from when it
    opens or its last answer, until the head of its next request has fully arrived, so a
    client that connects and sends nothing, or sends its headers a byte at a time, is closed
    (see :mod:`magretrieve.server.connections`). ``timeout_body`` bounds the arrival of a
    request's body, counted from its complete head: a client that sends its body slower
    (a byte a second holds a place under ``limit_concurrency`` for as long as it likes) gets
    408 and its connection is closed. ``timeout_response`` bounds the server's own part,
    counted from the complete request: an answer not begun by then is a 503 (the handler is
    cancelled; a store write it started still finishes first; see
    :mod:`magretrieve.server.middleware`), and an answer the client has not taken off the
    socket that long after it was written is dropped with its connection (see
    :mod:`magretrieve.server.connections`). ``recall_sample`` is the share of unfiltered
    ``/search`` queries re-run exactly in the background for the live recall@10 gauge
    (:mod:`magretrieve.server.recall_watch`); 0 turns the check off. ``recall_cpu_share`` is
    the share of one core that check may use. Each exact pass streams every stored vector
    through the caches the graphs and the store also use, so a saturated server pays for
    the check beyond its own CPU time (measured in docs/stores.md); a lower share means fewer
    passes, each answering more of the sampled queries.
    """

    api_key: str | None = option(
        "Bearer key for every route but /health /ready /info /metrics; turns the write "
        f"endpoints on. Prefer ${API_KEY_ENV} (a flag shows in the process list).",
        flag="--api-key",
        env=API_KEY_ENV,
    )
    max_body_bytes: int = option("Bytes per request body.", default=16 * 1024 * 1024, minimum=1)
    max_k: int = option("Hits per query of /search.", default=1000, minimum=1)
    retry_after_s: int = option("Retry-After (seconds) of a 503.", default=1, minimum=1)
    onnx_spinning: bool | None = option(
        "Let onnxruntime's threads spin-wait between runs (fastest on cores of its own; "
        "default: on without --store, off with one, whose searches share the cores).",
        flag="--onnx-spinning/--no-onnx-spinning",
    )
    model_id: str | None = option(
        "Served model id: GET /v1/models lists ID:query and ID:document, which name the "
        "side (default: the export folder's name).",
        flag="--model-id",
    )
    limit_concurrency: int = option(
        "Open connections and running requests before new requests get 503 (/health "
        "always answers).",
        default=1024,
        flag="--limit-concurrency",
        minimum=1,
    )
    timeout_keep_alive: float = option(
        "Seconds a connection may wait without sending a complete request before it is "
        "closed (idle after an answer, or slow to send its headers).",
        default=5.0,
        flag="--timeout-keep-alive",
        minimum=0,
        exclusive_minimum=True,
        maximum=3600,
    )
    timeout_body: float = option(
        "Seconds a request body may take to arrive once the request's headers have (a "
        "slower body gets 408 and its connection is closed).",
        default=30.0,
        flag="--timeout-body",
        minimum=0,
        exclusive_minimum=True,
        maximum=3600,
    )
    timeout_response: float = option(
        "Seconds the server may take to answer a request once it has arrived, and a client "
        "to take the answer (past it: 503, or the connection cut; a store write it started "
        "still finishes).",
        default=60.0,
        flag="--timeout-response",
        minimum=0,
        exclusive_minimum=True,
        maximum=3600,
    )
    recall_sample: float = option(
        "Share of /search queries re-run exactly in the background for the live recall@10 "
        "gauge (/metrics, /info); 0 turns it off.",
        default=0.01,
        flag="--recall-sample",
        minimum=0,
        maximum=1,
    )
    recall_cpu_share: float = option(
        "Share of one core the live recall check may use (its exact passes rest between "
        "blocks to stay within it).",
        default=0.05,
        flag="--recall-cpu-share",
        minimum=0,
        exclusive_minimum=True,
        maximum=1,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model_id is not None:
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
    key: str | None = ServerSettings.named("api_key").from_env(given)
    return key
