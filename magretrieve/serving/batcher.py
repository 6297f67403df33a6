"""Dynamic batching: concurrent requests merged into token-budget batches on worker threads.

A CPU replica has one set of cores to give the graphs. By default every encode goes through
one worker thread that runs one graph call at a time with every intra-op thread; with
``graph_workers`` N, N workers each run their own batch at once on their share of the
threads (onnxruntime sessions may be run from several threads). Given ``encode_all_threads`` (a
graph run on every thread), a batch that would run alone (no other batch running, nothing else
queued) runs there instead, and no other batch starts until it ends: a lone client gets every
core, a busy replica N batches side by side. A worker takes
the oldest waiting request (but after a document batch, waiting queries go before older
documents, so a search waits for at most one document batch while documents are indexed) and
merges the requests of the same side queued behind it, nearest in length first, within the
padded-token budget (rows × longest, the rule of
:func:`magretrieve.core.batching.token_budget_batches`), the row cap, and the fill floor
``min_batch_fill`` (the batch's real tokens over its padded tokens). A batch pays for its
longest text in every row, and a graph run costs about :data:`RUN_OVERHEAD_TOKENS` tokens
besides, so a request joins only if the batch's real tokens per token paid (overhead plus
padded) do not drop: a 14-token query does not join four 20-token ones (94 of the 108 tokens
paid would be real, against 80 of 88 without it), and a 60-token query never joins 10-token
ones. Requests left behind wait for a batch of their own length instead (the oldest request
always goes first, so none starves).

A request whose texts would not fit one batch (a ``/documents`` write of 64 passages, an
OpenAI call of 2,048 texts) is queued as its token-budget parts, cut as the encoder would cut
it (longest first, :func:`~magretrieve.core.batching.token_budget_batches`), and answered once
every part ran, in its own order. A part is a batch like any other: a query waits for one part
of a document request, not for the whole request, and the parts of one request run on every
worker at once.

The wait: a request that finds nobody else queued runs at once (a lone client never pays
``max_wait_ms``). Once a batch holds two requests or more, the worker holds it at most
``max_wait_ms`` after its first request arrived for more to join, unless the batch is full
or a request it could not take is waiting (then the cores have work and waiting only idles
them). Under load the queue fills while a batch runs, so batches grow without waiting.

The queue is bounded: past ``max_queue`` waiting requests (a request split into parts waits
until its last part is taken) :meth:`DynamicBatcher.submit` raises
:class:`~magretrieve.serving.errors.QueueFull` (the server answers 503 with ``Retry-After``).
:meth:`DynamicBatcher.close` refuses new requests and finishes every queued one before the
threads end, so a SIGTERM drains.

A request is awaited (:meth:`DynamicBatcher.submit`, from an event loop) or waited for
(:meth:`DynamicBatcher.submit_wait`, from any other thread): both kinds share the queues and
merge into the same batches, so a server's handlers, asyncio code and worker threads of one
process all feed the same graph runs. What the batcher did is told to an optional
:class:`BatchObserver` (the server's Prometheus metrics).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from magretrieve.core.batching import token_budget_batches
from magretrieve.core.config import SIDES
from magretrieve.serving.errors import Draining, QueueFull
from magretrieve.serving.settings import EngineSettings

logger = logging.getLogger(__name__)

#: ``encode(encodings, side) -> (n, dim) float32``: the graph run of one merged batch.
EncodeFn = Callable[[Sequence[Any], str], np.ndarray]
#: Hands a request its rows of the batch's vectors, or the error the batch raised.
Deliver = Callable[[np.ndarray | None, BaseException | None], None]
#: A graph run's fixed cost in padded tokens, besides its ``rows × longest``: on one intra-op
#: thread, a run of all-MiniLM-L6-v2's query graph costs about as much as 8 more padded tokens
#: in a batch of eight or more rows (one 20-token query alone costs as much as 28 tokens of
#: such a batch). It decides when a request of another length is worth a run of its own.
RUN_OVERHEAD_TOKENS = 8


class BatchObserver(Protocol):
    """What the batcher reports (the server counts it in Prometheus metrics)."""

    def on_batch(self, side: str, texts: int, requests: int) -> None:
        """A merged batch of ``texts`` texts from ``requests`` requests ran (a part of a
        request split at the token budget counts as one)."""

    def on_queue_depth(self, waiting: int) -> None:
        """Requests waiting now, after a batch was taken."""

    def on_rejected(self) -> None:
        """A request was refused because the queue was full."""


@dataclass
class _Job:
    side: str
    encodings: Sequence[Any]
    longest: int
    #: Real (unpadded) tokens of the request's texts.
    tokens: int
    deliver: Deliver
    enqueued: float = field(default_factory=time.monotonic)
    #: The request this job is a part of (None: the job is the whole request).
    parts: _Parts | None = None


class _Parts:
    """One request queued as several parts: gathers the parts' rows in the request's order
    and hands them over once every part ran, or the first error once."""

    def __init__(self, rows: int, count: int, deliver: Deliver) -> None:
        self.rows = rows
        self.untaken = count  # parts still queued (the request waits until none is)
        self._left = count
        self._out: np.ndarray | None = None
        self._deliver: Deliver | None = deliver
        self._lock = threading.Lock()

    def part(self, index: np.ndarray) -> Deliver:
        """The delivery of the part holding the request's rows ``index``."""

        def deliver(vectors: np.ndarray | None, error: BaseException | None) -> None:
            with self._lock:
                if self._deliver is None:  # an earlier part failed: the request has its answer
                    return
                if error is not None or vectors is None:
                    done, self._deliver = self._deliver, None
                    result: np.ndarray | None = None
                else:
                    if self._out is None:
                        self._out = np.empty((self.rows, *vectors.shape[1:]), vectors.dtype)
                    self._out[index] = vectors
                    self._left -= 1
                    if self._left:
                        return
                    done, self._deliver, result = self._deliver, None, self._out
            done(result, error)

        return deliver


@dataclass
class _Shape:
    """Rows, longest text and real tokens of a batch being merged."""

    rows: int
    longest: int
    tokens: int

    def fits(self, job: _Job, s: EngineSettings) -> bool:
        """``job`` keeps the batch within its limits and pays for its padding: the batch's
        real tokens over the tokens it costs (:data:`RUN_OVERHEAD_TOKENS` plus padded) do not
        drop when it joins."""
        rows, longest = self.rows + len(job.encodings), max(self.longest, job.longest)
        padded, tokens = rows * longest, self.tokens + job.tokens
        return (
            rows <= s.max_batch_rows
            and padded <= s.max_batch_tokens
            and tokens >= s.min_batch_fill * padded
            and tokens * (RUN_OVERHEAD_TOKENS + self.rows * self.longest)
            >= self.tokens * (RUN_OVERHEAD_TOKENS + padded)
        )

    def add(self, job: _Job) -> None:
        self.rows += len(job.encodings)
        self.longest = max(self.longest, job.longest)
        self.tokens += job.tokens

    def full(self, s: EngineSettings) -> bool:
        return self.rows >= s.max_batch_rows or self.rows * self.longest >= s.max_batch_tokens


def _resolve(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # the client went away and its handler was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


def loop_delivery(future: asyncio.Future[Any]) -> Callable[[Any, BaseException | None], None]:
    """Hands the result to ``future`` on its own event loop (the worker is another thread)."""
    loop = future.get_loop()

    def deliver(value: Any, error: BaseException | None) -> None:
        loop.call_soon_threadsafe(_resolve, future, value, error)

    return deliver


def thread_delivery(
    future: concurrent.futures.Future[Any],
) -> Callable[[Any, BaseException | None], None]:
    """Hands the result to a thread waiting on ``future``."""

    def deliver(value: Any, error: BaseException | None) -> None:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    return deliver


class WorkerThreads:
    """Worker threads sharing one condition and one closing flag: the lifecycle of the
    engine's :class:`DynamicBatcher` and the server's
    :class:`~magretrieve.serving.search_batcher.SearchBatcher`. A subclass implements
    :meth:`_run` (take work under ``_cond``, return once ``_closing`` and nothing is left)."""

    #: Thread names are ``{thread_name}-{i}``.
    thread_name = "magretrieve-worker"

    def __init__(self, workers: int) -> None:
        self._workers = int(workers)
        self._cond = threading.Condition()
        self._closing = False
        self._threads: list[threading.Thread] = []

    @property
    def closing(self) -> bool:
        """:meth:`close` was called: new work is refused."""
        return self._closing

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads) and not self._closing

    def start(self) -> None:
        if not self._threads:
            self._threads = [
                threading.Thread(target=self._run, name=f"{self.thread_name}-{i}", daemon=True)
                for i in range(self._workers)
            ]
            for thread in self._threads:
                thread.start()

    def close(self, timeout: float | None = 60.0) -> None:
        """Refuse new work, finish the queued work, stop the threads."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    def _run(self) -> None:
        raise NotImplementedError


class DynamicBatcher(WorkerThreads):
    """``settings.graph_workers`` worker threads, one queue per side; see the module docstring."""

    thread_name = "magretrieve-batcher"

    def __init__(
        self,
        encode: EncodeFn,
        settings: EngineSettings,
        observer: BatchObserver | None = None,
        encode_all_threads: EncodeFn | None = None,
    ) -> None:
        super().__init__(settings.graph_workers)
        self._encode = encode
        self._encode_all_threads = encode_all_threads if settings.graph_workers > 1 else None
        self.settings = settings
        self.observer = observer
        self._queues: dict[str, deque[_Job]] = {side: deque() for side in SIDES}
        self._waiting = 0  # jobs queued (a split request's parts each count)
        self._requests = 0  # requests with a job still queued
        #: Batches in the graphs now, and whether one of them runs alone on every thread.
        self._running = 0
        self._alone_running = False
        self._last_side = ""  # the side of the batch taken last (queries jump documents once)

    @property
    def depth(self) -> int:
        """Requests waiting for the encoder (not counting the batches running now)."""
        return self._requests

    async def submit(self, side: str, encodings: Sequence[Any]) -> np.ndarray:
        """The vectors of ``encodings`` (one request's texts, in order) once their batch ran."""
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._enqueue(side, encodings, loop_delivery(future))
        return await future

    def submit_wait(self, side: str, encodings: Sequence[Any]) -> np.ndarray:
        """:meth:`submit` for a thread that is not an event loop: blocks until the batch ran."""
        future: concurrent.futures.Future[np.ndarray] = concurrent.futures.Future()
        self._enqueue(side, encodings, thread_delivery(future))
        return future.result()

    def _enqueue(self, side: str, encodings: Sequence[Any], deliver: Deliver) -> None:
        jobs = self._jobs(side, encodings, deliver)
        with self._cond:
            if self._closing:
                raise Draining("the encoder is shutting down and takes no new texts")
            if self._requests >= self.settings.max_queue:
                if self.observer is not None:
                    self.observer.on_rejected()
                raise QueueFull(
                    f"the encoder queue is full ({self.settings.max_queue} requests waiting); "
                    "retry later"
                )
            self._queues[side].extend(jobs)
            self._waiting += len(jobs)
            self._requests += 1
            self._cond.notify(len(jobs))

    def _jobs(self, side: str, encodings: Sequence[Any], deliver: Deliver) -> list[_Job]:
        """The request as one job, or as its token-budget parts when it would not fit one
        batch (see the module docstring)."""
        lengths = [len(e.ids) for e in encodings]
        longest, s = max(lengths, default=1), self.settings
        fits = len(lengths) <= s.max_batch_rows and len(lengths) * longest <= s.max_batch_tokens
        pieces = (
            []
            if fits or not s.batching
            else token_budget_batches(lengths, s.max_batch_tokens, s.max_batch_rows)
        )
        if len(pieces) <= 1:
            return [_Job(side, encodings, longest, sum(lengths), deliver)]
        parts = _Parts(len(encodings), len(pieces), deliver)
        now = time.monotonic()
        return [
            _Job(
                side,
                [encodings[i] for i in index],
                max(max(lengths[i] for i in index), 1),
                sum(lengths[i] for i in index),
                parts.part(index),
                enqueued=now,
                parts=parts,
            )
            for index in pieces
        ]

    def _took(self, job: _Job) -> None:
        """Count ``job`` out of the queue (its request stops waiting with its last part).
        Called with the lock held."""
        self._waiting -= 1
        if job.parts is not None:
            job.parts.untaken -= 1
            if job.parts.untaken:
                return
        self._requests -= 1

    # ------------------------------------------------------------------ worker

    def _take(self) -> tuple[list[_Job], bool] | None:
        """The next merged batch and whether it runs alone on every thread (None: closing and
        nothing left). Holds the lock only here."""
        s = self.settings
        with self._cond:
            while not self._waiting or self._alone_running:  # nothing starts beside a lone batch
                if self._closing and not self._waiting:
                    return None
                self._cond.wait()
            side = self._next_side()
            queue = self._queues[side]
            jobs = [queue.popleft()]
            self._took(jobs[0])
            if s.batching:
                batch = _Shape(len(jobs[0].encodings), jobs[0].longest, jobs[0].tokens)
                deadline = jobs[0].enqueued + s.max_wait_ms / 1000.0
                while True:
                    left_behind = self._merge(queue, jobs, batch)
                    if len(jobs) < 2 or left_behind or batch.full(s) or self._closing:
                        break
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
            alone = (
                self._encode_all_threads is not None and self._running == 0 and not self._waiting
            )
            self._running += 1
            self._alone_running = alone
            if self.observer is not None:
                self.observer.on_queue_depth(self._requests)
        return jobs, alone

    def _next_side(self) -> str:
        """The side of the next batch: the oldest request's, except that queries waiting
        behind documents go first after a document batch. A query (latency-bound, one short
        text) then waits for at most one document batch, and documents for at most one query
        batch, so neither starves. Called with the lock held."""
        waiting = [name for name, q in self._queues.items() if q]
        side = min((self._queues[name][0].enqueued, name) for name in waiting)[1]
        if side == "document" and "query" in waiting and self._last_side != "query":
            side = "query"
        self._last_side = side
        return side

    def _finished(self, alone: bool) -> None:
        with self._cond:
            self._running -= 1
            if alone:
                self._alone_running = False
            self._cond.notify_all()

    def _merge(self, queue: deque[_Job], jobs: list[_Job], batch: _Shape) -> bool:
        """Move every queued job that fits ``batch`` into ``jobs``, trying them nearest in
        length to the batch's first job first (at equal distance, oldest first); the rest keep
        their queue order. True when a job was left behind. Called with the lock held."""
        s = self.settings
        anchor = jobs[0].longest
        taken: set[int] = set()
        for job in sorted(queue, key=lambda j: abs(j.longest - anchor)):
            if batch.fits(job, s):
                batch.add(job)
                jobs.append(job)
                taken.add(id(job))
        if taken:
            kept = [job for job in queue if id(job) not in taken]
            for job in jobs[-len(taken) :]:
                self._took(job)
            queue.clear()
            queue.extend(kept)
        return bool(queue)

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            jobs, alone = taken
            side = jobs[0].side
            encodings = [e for job in jobs for e in job.encodings]
            encode = (
                self._encode_all_threads if alone and self._encode_all_threads else self._encode
            )
            try:
                vectors = encode(encodings, side)
            except BaseException as exc:  # handed to every waiting request, never lost
                logger.exception("encoding a batch of %d %s texts failed", len(encodings), side)
                for job in jobs:
                    job.deliver(None, exc)
                continue
            finally:
                self._finished(alone)
            if self.observer is not None:
                self.observer.on_batch(side, len(encodings), len(jobs))
            start = 0
            for job in jobs:
                stop = start + len(job.encodings)
                job.deliver(vectors[start:stop], None)
                start = stop
