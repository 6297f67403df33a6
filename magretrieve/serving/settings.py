"""The engine's knobs (batching and input limits), each declared once with its default and help.

A knob is a dataclass field made by :func:`setting`: its default is the field's default and its
help, command-line flag and click type sit in the field's metadata, so ``magretrieve serve``
derives its options from the declaration (:func:`magretrieve.cli.cmd_serve.settings_options`)
instead of repeating each default. :class:`EngineSettings` holds what the embedding engine
needs; :class:`magretrieve.server.settings.ServerSettings` extends it with what only the HTTP
server needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from magretrieve.core.batching import DEFAULT_BATCH_TOKENS
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
_AT_LEAST_ONE = ("max_inputs", "max_text_chars", "max_batch_tokens", "max_batch_rows", "max_queue")


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
        for name in _AT_LEAST_ONE + ("graph_workers",):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) < 1:
                raise ConfigError(f"setting {name} must be at least 1, got {value!r}")
        if not 0 <= self.max_wait_ms <= 10_000:
            raise ConfigError(f"max_wait_ms must be within 0..10000, got {self.max_wait_ms}")
        if not 0 <= self.min_batch_fill <= 1:
            raise ConfigError(f"min_batch_fill must be within 0..1, got {self.min_batch_fill}")
