"""Dynamic batching: concurrent requests merged into token-budget batches on worker threads.

A CPU replica has one set of cores to give the graphs. By default every encode goes through
one worker thread that runs one graph call at a time with every intra-op thread; with
``graph_workers`` N, N workers each run their own batch at once on their share of the
threads (onnxruntime sessions may be run from several threads). Given ``encode_alone`` (a
graph run on every thread), a batch that would run alone (no other batch running, nothing else
queued) runs there instead, and no other batch starts until it ends: a lone client gets every
core, a busy replica N batches side by side. A worker takes
the oldest waiting request and merges the requests of the same side queued behind it (looking
past ones that do not fit) while the merged batch stays within the padded-token budget
(rows × longest, the rule of :func:`magretrieve.core.batching.token_budget_batches`), the row
cap, and the fill floor ``min_batch_fill``: the batch's real tokens over its padded tokens.
A batch pays for its longest text in every row, so merging a 60-token query with 10-token ones
costs more than running them apart; requests of very different lengths wait for a batch of
their own length instead (the oldest request always goes first, so none starves).

The wait: a request that finds nobody else queued runs at once (a lone client never pays
``max_wait_ms``). Once a batch holds two requests or more, the worker holds it at most
``max_wait_ms`` after its first request arrived for more to join, unless the batch is full
or a request it could not take is waiting (then the cores have work and waiting only idles
them). Under load the queue fills while a batch runs, so batches grow without waiting.

The queue is bounded: past ``max_queue`` waiting requests :meth:`DynamicBatcher.submit` raises
:class:`QueueFull` (the server answers 503 with ``Retry-After``). :meth:`DynamicBatcher.close`
refuses new requests and finishes every queued one before the thread ends, so a SIGTERM drains.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from magretrieve.core.config import SIDES
from magretrieve.server.metrics import Metrics
from magretrieve.server.settings import ServerSettings

logger = logging.getLogger(__name__)

#: ``encode(encodings, side) -> (n, dim) float32``: the graph run of one merged batch.
EncodeFn = Callable[[Sequence[Any], str], np.ndarray]


class QueueFull(Exception):
    """More requests are waiting for the encoder than the server's ``max_queue``."""


class Draining(Exception):
    """The server is shutting down and takes no new encode requests."""


@dataclass
class _Job:
    side: str
    encodings: Sequence[Any]
    longest: int
    #: Real (unpadded) tokens of the request's texts.
    tokens: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.monotonic)


@dataclass
class _Shape:
    """Rows, longest text and real tokens of a batch being merged."""

    rows: int
    longest: int
    tokens: int

    def fits(self, job: _Job, s: ServerSettings) -> bool:
        rows, longest = self.rows + len(job.encodings), max(self.longest, job.longest)
        padded = rows * longest
        return (
            rows <= s.max_batch_rows
            and padded <= s.max_batch_tokens
            and self.tokens + job.tokens >= s.min_batch_fill * padded
        )

    def add(self, job: _Job) -> None:
        self.rows += len(job.encodings)
        self.longest = max(self.longest, job.longest)
        self.tokens += job.tokens

    def full(self, s: ServerSettings) -> bool:
        return self.rows >= s.max_batch_rows or self.rows * self.longest >= s.max_batch_tokens


def _resolve(future: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if future.done():  # the client went away and its handler was cancelled
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class DynamicBatcher:
    """``settings.graph_workers`` worker threads, one queue per side; see the module docstring."""

    def __init__(
        self,
        encode: EncodeFn,
        settings: ServerSettings,
        metrics: Metrics | None = None,
        encode_alone: EncodeFn | None = None,
    ) -> None:
        self._encode = encode
        self._encode_alone = encode_alone if settings.graph_workers > 1 else None
        self.settings = settings
        self.metrics = metrics
        self._queues: dict[str, deque[_Job]] = {side: deque() for side in SIDES}
        self._waiting = 0
        #: Batches in the graphs now, and whether one of them runs alone on every thread.
        self._running = 0
        self._alone_running = False
        self._cond = threading.Condition()
        self._closing = False
        self._threads: list[threading.Thread] = []

    @property
    def depth(self) -> int:
        """Requests waiting for the encoder (not counting the batch running now)."""
        return self._waiting

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads) and not self._closing

    def start(self) -> None:
        if not self._threads:
            self._threads = [
                threading.Thread(target=self._run, name=f"magretrieve-batcher-{i}", daemon=True)
                for i in range(self.settings.graph_workers)
            ]
            for thread in self._threads:
                thread.start()

    def close(self, timeout: float | None = 60.0) -> None:
        """Refuse new requests, finish the queued ones, stop the threads."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)

    async def submit(self, side: str, encodings: Sequence[Any]) -> np.ndarray:
        """The vectors of ``encodings`` (one request's texts, in order) once their batch ran."""
        loop = asyncio.get_running_loop()
        job = _Job(
            side,
            encodings,
            max((len(e.ids) for e in encodings), default=1),
            sum(len(e.ids) for e in encodings),
            loop.create_future(),
            loop,
        )
        with self._cond:
            if self._closing:
                raise Draining()
            if self._waiting >= self.settings.max_queue:
                if self.metrics is not None:
                    self.metrics.rejected.inc()
                raise QueueFull()
            self._queues[side].append(job)
            self._waiting += 1
            self._cond.notify()
        return await job.future

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
            side = min((q[0].enqueued, name) for name, q in self._queues.items() if q)[1]
            queue = self._queues[side]
            jobs = [queue.popleft()]
            self._waiting -= 1
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
            alone = self._encode_alone is not None and self._running == 0 and not self._waiting
            self._running += 1
            self._alone_running = alone
            if self.metrics is not None:
                self.metrics.queue_depth.set(self._waiting)
        return jobs, alone

    def _finished(self, alone: bool) -> None:
        with self._cond:
            self._running -= 1
            if alone:
                self._alone_running = False
            self._cond.notify_all()

    def _merge(self, queue: deque[_Job], jobs: list[_Job], batch: _Shape) -> bool:
        """Move every queued job that fits ``batch`` into ``jobs`` (queue order kept for the
        rest); True when a job was left behind. Called with the lock held."""
        s = self.settings
        kept: list[_Job] = []
        while queue:
            job = queue.popleft()
            if batch.fits(job, s):
                batch.add(job)
                jobs.append(job)
                self._waiting -= 1
            else:
                kept.append(job)
        queue.extend(kept)
        return bool(kept)

    def _run(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            jobs, alone = taken
            side = jobs[0].side
            encodings = [e for job in jobs for e in job.encodings]
            encode = self._encode_alone if alone and self._encode_alone else self._encode
            try:
                vectors = encode(encodings, side)
            except BaseException as exc:  # handed to every waiting request, never lost
                logger.exception("encoding a batch of %d %s texts failed", len(encodings), side)
                for job in jobs:
                    job.loop.call_soon_threadsafe(_resolve, job.future, None, exc)
                continue
            finally:
                self._finished(alone)
            if self.metrics is not None:
                self.metrics.batch_texts.labels(side).observe(len(encodings))
                self.metrics.batch_requests.labels(side).observe(len(jobs))
            start = 0
            for job in jobs:
                stop = start + len(job.encodings)
                job.loop.call_soon_threadsafe(_resolve, job.future, vectors[start:stop], None)
                start = stop
