"""The embedding engine: texts → vectors through the dynamic batcher, for every caller in a process.

One :class:`EmbeddingEngine` owns an export's graphs and the
:class:`~magretrieve.serving.batcher.DynamicBatcher` in front of them, and is the one path from
texts to vectors: input limits, tokenizing (prefix and truncation per side), the per-item cut
report, and the batch the texts run in. Concurrent callers share batches whichever way they
come in: the HTTP server's handlers and asyncio code ``await engine.embed(texts, side)``,
threads call :meth:`EmbeddingEngine.embed_sync`, and frameworks (the Haystack components,
LangChain and LlamaIndex in local mode) and a :class:`~magretrieve.serving.retriever.Retriever`
use :meth:`EmbeddingEngine.encode_queries` / :meth:`EmbeddingEngine.encode_documents`, the
encoder protocol. It is what Infinity's ``inference/batch_handler.py`` and TEI's
``core/src/queue.rs`` are to their servers; the server (:mod:`magretrieve.server`) only turns
HTTP into calls of it.

Errors are typed (:mod:`magretrieve.serving.errors`): :class:`~magretrieve.serving.errors.InvalidInput`,
:class:`~magretrieve.serving.errors.InputTooLarge`, and
:class:`~magretrieve.serving.errors.QueueFull` / :class:`~magretrieve.serving.errors.Draining`
when the engine takes no more work now.

Use it as a context manager (the worker threads start on first use and stop at the end)::

    with EmbeddingEngine.load("exported/qnorm") as engine:
        vectors = engine.embed_sync(["statins reduce mortality"], "query").vectors
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import numpy as np

from magretrieve.core.config import SIDES
from magretrieve.core.text import blank
from magretrieve.serving.batcher import BatchObserver, DynamicBatcher, EncodeFn
from magretrieve.serving.errors import InputTooLarge, InvalidInput
from magretrieve.serving.settings import EngineSettings

#: Calls whose texts add up to more characters than this are tokenized on a worker thread
#: instead of the event loop (a batch-1 query tokenizes in microseconds).
INLINE_TOKENIZE_CHARS = 4096


class EngineObserver(BatchObserver, Protocol):
    """What the engine reports besides the batches (the server counts it in its metrics)."""

    def on_encoded(self, side: str, tokens: int, truncated: int) -> None:
        """A call's texts were encoded: ``tokens`` real tokens, ``truncated`` texts cut."""


@dataclass
class Encoded:
    """One call's vectors with, per item, whether it was cut and how many tokens it had."""

    vectors: np.ndarray
    truncated: list[bool]
    tokens: list[int]


class EmbeddingEngine:
    """An export's graphs behind one dynamic batcher; see the module docstring.

    ``encoder`` is an :class:`~magretrieve.serving.onnx_encoder.OnnxEncoder` (or anything with its
    ``manifest``, ``tokenize``, ``encode_tokenized`` and ``session``); ``all_threads_encoder``
    the same graphs opened on every thread, for a batch that runs alone when
    ``settings.graph_workers`` > 1 (:meth:`load` opens both).
    """

    def __init__(
        self,
        encoder: Any,
        settings: EngineSettings | None = None,
        *,
        all_threads_encoder: Any | None = None,
        observer: EngineObserver | None = None,
    ) -> None:
        self.encoder = encoder
        self.all_threads_encoder = all_threads_encoder
        self.manifest = encoder.manifest
        self.settings = settings or EngineSettings()
        self.observer = observer
        self.batcher = DynamicBatcher(
            self._graph_run(encoder),
            self.settings,
            observer,
            encode_all_threads=(
                self._graph_run(all_threads_encoder) if all_threads_encoder is not None else None
            ),
        )

    @classmethod
    def load(
        cls,
        export: str | Path,
        settings: EngineSettings | None = None,
        *,
        threads: int | None = None,
        runtime: str | None = None,
        spinning: bool = True,
        observer: EngineObserver | None = None,
    ) -> EmbeddingEngine:
        """Open an export folder (sha256-verified) with both graphs checked.

        ``threads`` intra-op threads in all (None: every core this process may use) are split
        between the ``graph_workers`` (at most one worker per thread); when a worker gets fewer
        than all of them, the graphs are opened a second time on every thread for a batch that
        runs alone. ``spinning`` is onnxruntime's intra-op spin-wait
        (:attr:`~magretrieve.serving.onnx_encoder.OnnxEncoder.spinning`).
        """
        from magretrieve.core.errors import ConfigError
        from magretrieve.serving.onnx_encoder import OnnxEncoder, default_threads

        settings = settings or EngineSettings()
        if threads is not None and (isinstance(threads, bool) or threads < 1):
            raise ConfigError(f"threads must be at least 1, got {threads!r}")
        total = threads if threads is not None else default_threads()
        if settings.graph_workers > total:
            settings = replace(settings, graph_workers=max(1, total))
        per_worker = max(1, total // settings.graph_workers)

        def opened(encoder: OnnxEncoder) -> OnnxEncoder:
            encoder.spinning = spinning
            for side in SIDES:
                encoder.session(side)
            return encoder

        encoder = opened(OnnxEncoder.load(export, threads=per_worker, runtime=runtime))
        # the second copy is opened from the manifest already verified (files hashed once)
        all_threads = (
            opened(OnnxEncoder(encoder.manifest, threads=total, runtime=encoder.runtime))
            if per_worker < total
            else None
        )
        return cls(encoder, settings, all_threads_encoder=all_threads, observer=observer)

    def set_observer(self, observer: EngineObserver | None) -> None:
        """Report to ``observer`` from now on (the server's metrics)."""
        self.observer = observer
        self.batcher.observer = observer

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the batcher's worker threads (done on first use; a no-op once started)."""
        self.batcher.start()

    def close(self, timeout: float | None = 60.0) -> None:
        """Refuse new calls, finish the queued ones, stop the threads."""
        self.batcher.close(timeout)

    @property
    def running(self) -> bool:
        """The worker threads run and the engine takes calls."""
        return self.batcher.running

    @property
    def depth(self) -> int:
        """Calls waiting for the graphs (not counting the batches running now)."""
        return self.batcher.depth

    def session(self, side: str) -> Any:
        """The side's graph session, opened and checked (on both copies of the graphs)."""
        if self.all_threads_encoder is not None:
            self.all_threads_encoder.session(side)
        return self.encoder.session(side)

    def __enter__(self) -> EmbeddingEngine:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> EmbeddingEngine:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    # ------------------------------------------------------------------ the checks

    def check_texts(
        self, texts: Sequence[str], what: str = "input", *, limits: bool = True
    ) -> None:
        """Refuse no texts, a blank one, and (``limits``) too many or one over the character
        limit: the limits of one request, which a caller in this process may skip."""
        s = self.settings
        if isinstance(texts, str):
            raise InvalidInput(f"{what} must be a list of texts, not one string")
        if not texts:
            raise InvalidInput(f"{what} is empty: send at least one text")
        if limits and len(texts) > s.max_inputs:
            raise InputTooLarge(
                f"{what} holds {len(texts)} texts; at most {s.max_inputs} per request are "
                "taken (max_inputs)"
            )
        for n, text in enumerate(texts):
            if not isinstance(text, str):
                raise InvalidInput(f"{what} #{n} is a {type(text).__name__}, not a string")
            if blank(text):
                raise InvalidInput(
                    f"{what} #{n} is empty or only whitespace and invisible characters"
                )
            if limits and len(text) > s.max_text_chars:
                raise InputTooLarge(
                    f"{what} #{n} has {len(text)} characters; at most {s.max_text_chars} "
                    "per text are taken (max_text_chars)"
                )

    @staticmethod
    def _check_side(side: str) -> None:
        if side not in SIDES:
            raise InvalidInput(f"side must be 'query' or 'document', got {side!r}")

    def _cut(self, encodings: Sequence[Any], side: str, truncate: bool, what: str) -> list[bool]:
        """Per item, whether the side's max length cut it; refused when ``truncate`` is off."""
        cut = [bool(e.overflowing) for e in encodings]
        if any(cut) and not truncate:
            m = self.manifest
            limit = m.max_query_length if side == "query" else m.max_document_length
            raise InputTooLarge(
                f"{what} #{cut.index(True)} is longer than max_{side}_length={limit} tokens; "
                'send "truncate": true to cut it (the cut is reported per item)'
            )
        return cut

    def _done(
        self, vectors: np.ndarray, encodings: Sequence[Any], cut: list[bool], side: str
    ) -> Encoded:
        tokens = [len(e.ids) for e in encodings]
        if self.observer is not None:
            self.observer.on_encoded(side, sum(tokens), sum(cut))
        return Encoded(vectors, cut, tokens)

    # ------------------------------------------------------------------ encoding

    async def embed(
        self,
        texts: Sequence[str],
        side: str,
        *,
        truncate: bool = True,
        what: str = "input",
        limits: bool = True,
    ) -> Encoded:
        """Vectors of ``texts`` on ``side``, merged into batches with concurrent calls;
        ``limits=False`` skips the per-request limits (``max_inputs``, ``max_text_chars``)."""
        self._check_side(side)
        self.check_texts(texts, what, limits=limits)
        if sum(len(t) for t in texts) > INLINE_TOKENIZE_CHARS:
            loop = asyncio.get_running_loop()
            encodings = await loop.run_in_executor(None, self.encoder.tokenize, list(texts), side)
        else:
            encodings = self.encoder.tokenize(list(texts), side)
        cut = self._cut(encodings, side, truncate, what)
        self.start()
        vectors = await self.batcher.submit(side, encodings)
        return self._done(vectors, encodings, cut, side)

    def embed_sync(
        self,
        texts: Sequence[str],
        side: str,
        *,
        truncate: bool = True,
        what: str = "input",
        limits: bool = True,
    ) -> Encoded:
        """:meth:`embed` for a thread that is not running an event loop (blocks until done);
        ``limits=False`` skips the per-request limits (``max_inputs``, ``max_text_chars``)."""
        self._check_side(side)
        self.check_texts(texts, what, limits=limits)
        encodings = self.encoder.tokenize(list(texts), side)
        cut = self._cut(encodings, side, truncate, what)
        self.start()
        vectors = self.batcher.submit_wait(side, encodings)
        return self._done(vectors, encodings, cut, side)

    def _calls(self, texts: Sequence[str], batch_size: int | None) -> list[list[str]]:
        """``texts`` cut into calls of ``batch_size`` texts at most (by default, and at most,
        ``max_inputs``); a lone string is refused."""
        if isinstance(texts, str):
            raise InvalidInput("pass a list of texts, not a single string")
        if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):
            raise InvalidInput(f"batch_size must be at least 1, got {batch_size!r}")
        step = min(batch_size or self.settings.max_inputs, self.settings.max_inputs)
        texts = list(texts)
        return [texts[i : i + step] for i in range(0, len(texts), step)]

    def _stacked(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        if not parts:
            return np.zeros((0, int(self.manifest.dimension)), dtype=np.float32)
        return np.concatenate(parts).astype(np.float32, copy=False)

    def encode(self, texts: Sequence[str], side: str, batch_size: int | None = None) -> np.ndarray:
        """float32 (n, dim) vectors of any number of texts of any length, each cut at the side's
        max length: the encoder protocol's path, without the per-request limits a server puts
        on its clients. The texts go to the batcher in calls of ``batch_size`` (at most, and by
        default, ``max_inputs``); concurrent calls may share a graph run."""
        return self._stacked(
            [
                self.embed_sync(call, side, what=f"{side} texts", limits=False).vectors
                for call in self._calls(texts, batch_size)
            ]
        )

    async def aencode(
        self, texts: Sequence[str], side: str, batch_size: int | None = None
    ) -> np.ndarray:
        """:meth:`encode` for asyncio code: awaits the batches instead of blocking a thread."""
        parts = await asyncio.gather(
            *(
                self.embed(call, side, what=f"{side} texts", limits=False)
                for call in self._calls(texts, batch_size)
            )
        )
        return self._stacked([p.vectors for p in parts])

    def encode_queries(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Query vectors ``q / ‖q‖^γq`` (see :meth:`encode`)."""
        return self.encode(texts, "query", batch_size)

    def encode_documents(self, texts: Sequence[str], batch_size: int | None = None) -> np.ndarray:
        """Document vectors ``d / ‖d‖^γd``, exactly what a store keeps (see :meth:`encode`)."""
        return self.encode(texts, "document", batch_size)

    def _graph_run(self, encoder: Any) -> EncodeFn:
        """The graph run of one merged batch on ``encoder``, within the batch limits."""
        s = self.settings

        def encode(encodings: Sequence[Any], side: str) -> np.ndarray:
            vectors: np.ndarray = encoder.encode_tokenized(
                encodings, side, batch_size=s.max_batch_rows, max_batch_tokens=s.max_batch_tokens
            )
            return vectors

        return encode


#: Engines opened by :func:`shared_engine`, by (export folder, threads, runtime).
_SHARED: dict[tuple[str, int | None, str | None], EmbeddingEngine] = {}
_SHARED_LOCK = threading.Lock()


def shared_engine(
    export: str | Path, *, threads: int | None = None, runtime: str | None = None
) -> EmbeddingEngine:
    """The one engine of this process for an export folder (opened on first use, then reused).

    The framework components (Haystack's embedders and retriever, LangChain's and
    LlamaIndex's embeddings in local mode) get their vectors here, so several components over
    the same export share one copy of the graphs and their concurrent calls share batches.
    """
    key = (str(Path(export).resolve()), threads, runtime)
    with _SHARED_LOCK:
        engine = _SHARED.get(key)
        if engine is None or not _usable(engine):
            engine = EmbeddingEngine.load(export, threads=threads, runtime=runtime)
            _SHARED[key] = engine
        return engine


def _usable(engine: EmbeddingEngine) -> bool:
    """Not closed by a caller (a closed engine refuses every call)."""
    return not engine.batcher.closing
