"""The knobs of the embedding engine and of the HTTP server on it, each declared once.

A knob is a dataclass field made by :func:`setting`: its default is the field's default and its
help, command-line flag and click type sit in the field's metadata, so ``magretrieve serve``
derives its options from the declaration (:func:`magretrieve.cli.cmd_serve.settings_options`)
instead of repeating each default. :class:`EngineSettings` holds what the embedding engine
needs; :class:`ServerSettings` extends it with what only the HTTP server needs. Both live here,
in the serving layer, because the command line must read them without the ``server`` extra
(FastAPI and uvicorn are imported only when a server starts);
:mod:`magretrieve.server.settings` is where the HTTP layer imports them from.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from magretrieve.core.batching import DEFAULT_BATCH_TOKENS
from magretrieve.core.config import SIDES
from magretrieve.core.env import API_KEY_ENV
from magretrieve.core.errors import ConfigError

#: Metadata keys of a setting: its help, and how the command line spells it.
HELP, FLAG, CLICK = "help", "flag", "click"


def setting(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    cli: bool = True,
    **click_options: Any,
) -> Any:
    """A settings field: ``default``, with ``help`` and (``cli``) a command-line option.

    ``flag`` is the option's declaration when it is not ``--field-name`` (``--no-batching``,
    ``--onnx-spinning/--no-onnx-spinning``); ``click_options`` go to ``click.option`` as given
    (``type``, ``flag_value``, ``show_default``), except ``within=(low, high)``, a closed range
    the command line checks. ``cli=False`` keeps a knob out of the command line (Python only).
    """
    meta: dict[str, Any] = {HELP: help}
    if cli:
        meta[FLAG] = flag
        meta[CLICK] = click_options
    return field(default=default, metadata=meta)


#: Settings that must be at least 1, checked by :meth:`EngineSettings.__post_init__`.
_ENGINE_AT_LEAST_ONE = (
    "max_inputs",
    "max_text_chars",
    "max_batch_tokens",
    "max_batch_rows",
    "max_queue",
    "graph_workers",
)


@dataclass(frozen=True)
class EngineSettings:
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

    max_inputs: int = setting(
        2048,
        "Texts per request (OpenAI's limit; still encoded in batches of --max-batch-tokens).",
        type=int,
        show_default=True,
    )
    max_text_chars: int = setting(32_768, "Characters per text.", type=int, show_default=True)
    max_batch_tokens: int = setting(
        DEFAULT_BATCH_TOKENS,
        "Padded-token budget of one merged batch.",
        type=int,
        show_default=True,
    )
    max_batch_rows: int = setting(64, "Texts per batch.", type=int, show_default=True)
    max_wait_ms: float = setting(
        2.0,
        "How long a request waits for others to join its batch.",
        type=float,
        show_default=True,
    )
    min_batch_fill: float = setting(
        0.75,
        "Least share of a merged batch's padded tokens that are real tokens.",
        cli=False,
    )
    max_queue: int = setting(512, "Waiting requests before 503.", type=int, show_default=True)
    batching: bool = setting(
        True,
        "Encode every request on its own.",
        flag="--no-batching",
        flag_value=False,
    )
    graph_workers: int = setting(
        2,
        "Batches run at once, each on --threads / N intra-op threads (a batch alone "
        "runs on all of them).",
        type=int,
        show_default=True,
    )

    def __post_init__(self) -> None:
        for name in _ENGINE_AT_LEAST_ONE:
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) < 1:
                raise ConfigError(f"setting {name} must be at least 1, got {value!r}")
        if not 0 <= self.max_wait_ms <= 10_000:
            raise ConfigError(f"max_wait_ms must be within 0..10000, got {self.max_wait_ms}")
        if not 0 <= self.min_batch_fill <= 1:
            raise ConfigError(f"min_batch_fill must be within 0..1, got {self.min_batch_fill}")


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


#: Settings of the server that must be at least 1 (the engine checks its own).
_SERVER_AT_LEAST_ONE = ("max_body_bytes", "max_k", "retry_after_s", "limit_concurrency")


@dataclass(frozen=True)
class ServerSettings(EngineSettings):
    """What a server accepts and how it batches (the engine's settings,
    :class:`EngineSettings`), and what only HTTP needs.

    ``api_key`` turns the write endpoints on and is required on every route but the open ones.
    ``max_body_bytes`` bounds a request body (16 MiB holds 2,048 texts of 8 KB each); ``max_k``
    the hits per query of ``/search``; ``retry_after_s`` is the ``Retry-After`` of a 503.
    ``onnx_spinning`` lets onnxruntime's threads spin-wait between runs (onnxruntime's
    default; turn it off where other processes share the cores, see
    :attr:`magretrieve.serving.onnx_encoder.OnnxEncoder.spinning`).
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
        for name in _SERVER_AT_LEAST_ONE:
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
