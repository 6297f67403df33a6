"""Concurrent searches merged into one store call, beside the embedding engine's batcher.

A server answering many batch-1 ``/search`` requests would otherwise ask the store once per
request, each call on its own worker thread; most stores then serialize them (ScaNN,
pgvector and Milvus take one search at a time) or pay a fixed cost per call that a batch
pays once (the Python around an index, an exact scan's matrix product, the OpenMP fan-out of
FAISS). A :class:`SearchBatcher` queues the searches and its worker thread takes the oldest
one together with every queued search of the same ``k`` and the same payload filter
(``where``), and runs them as one call of the search function (the server's: the current
Retriever's ``search_vectors``), handing each request its own rows.

Only searches that would be asked the same thing are merged: a different ``k`` or filter
changes what the store is asked for (more candidates for a filter, another top-k width of
the index), so those wait for a batch of their own (the oldest search always goes first, so
none starves). Per query, exact stores and FAISS answer a batch as they answer each row
alone, so the hits are those of a search per request; ScaNN's batched search may differ a
little from its one-query search (its own behaviour, at the same recall). A search that
finds nobody waiting runs at once when no other search is on its way; but a request that is
still being embedded announces itself (:meth:`SearchBatcher.coming`), and while such searches
are coming a batch smaller than :data:`LINGER_ROWS` waits for them, at most :data:`LINGER_MS`
after it was taken. Under load the embedding batches of concurrent requests end a few
milliseconds apart, and a store call costs less per query the more rows it carries (ScaNN
scans its quantized codes for several queries at once, FAISS fans out per call; see
``benchmarks/results/serve_search.md``). A lone client never waits (nothing else is
coming). A merged batch that fails is run again request by request, so one bad request gets
its own error and the others their hits. :meth:`SearchBatcher.close` finishes the queued searches and
refuses new ones.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from magretrieve.serving.batcher import WorkerThreads, loop_delivery, thread_delivery
from magretrieve.serving.errors import Draining

logger = logging.getLogger(__name__)

#: ``search(query_vectors, k, where) -> hits per row``: one store call for a merged batch.
SearchFn = Callable[[np.ndarray, int, Mapping[str, Any] | None], list[Any]]
#: Query rows merged into one store call at most.
MAX_ROWS = 256
#: A batch smaller than this waits for searches that are still being embedded...
LINGER_ROWS = 16
#: ...at most this long after it was taken.
LINGER_MS = 15.0


@dataclass
class _Search:
    vectors: np.ndarray
    k: int
    where: Mapping[str, Any] | None
    key: tuple[int, str]
    deliver: Callable[[Any, BaseException | None], None]


def _key(k: int, where: Mapping[str, Any] | None) -> tuple[int, str]:
    """Searches with equal keys ask the store the same thing (``true`` is not ``1``)."""
    return int(k), json.dumps(where or None, sort_keys=True, default=repr)


class SearchBatcher(WorkerThreads):
    """Worker threads that merge queued searches into store calls; see the module docstring.

    ``workers`` threads run batches side by side (1 for a store that serializes searches
    anyway); ``observer(queries, requests)`` is told the size of every store call made.
    """

    thread_name = "magretrieve-search"

    def __init__(
        self,
        search: SearchFn,
        *,
        workers: int = 1,
        max_rows: int = MAX_ROWS,
        observer: Callable[[int, int], None] | None = None,
        linger_rows: int = LINGER_ROWS,
        linger_ms: float = LINGER_MS,
    ) -> None:
        if workers < 1 or max_rows < 1:
            raise ValueError(f"workers and max_rows must be positive, got {workers}, {max_rows}")
        super().__init__(workers)
        self._search = search
        self.max_rows = int(max_rows)
        self.observer = observer
        self.linger_rows = int(linger_rows)
        self.linger_s = float(linger_ms) / 1000.0
        self._queue: deque[_Search] = deque()
        self._coming = 0  # searches announced by coming() and not yet queued
        self._lingering = False  # a worker holds a batch open for coming searches

    @contextlib.contextmanager
    def coming(self) -> Iterator[None]:
        """Announce a search while its query is embedded: batches taken meanwhile may wait
        for it (see the module docstring). Leave the block right before :meth:`search`."""
        with self._cond:
            self._coming += 1
        try:
            yield
        finally:
            with self._cond:
                self._coming -= 1
                self._cond.notify_all()

    @property
    def depth(self) -> int:
        """Searches waiting for a worker."""
        return len(self._queue)

    async def search(
        self, vectors: np.ndarray, k: int, where: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """The hits of each row of ``vectors`` once its batch ran (from an event loop)."""
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._enqueue(vectors, k, where, loop_delivery(future))
        return await future

    def search_wait(
        self, vectors: np.ndarray, k: int, where: Mapping[str, Any] | None = None
    ) -> list[Any]:
        """:meth:`search` for a thread that is not an event loop: blocks until it ran."""
        future: concurrent.futures.Future[list[Any]] = concurrent.futures.Future()
        self._enqueue(vectors, k, where, thread_delivery(future))
        return future.result()

    def _enqueue(
        self,
        vectors: np.ndarray,
        k: int,
        where: Mapping[str, Any] | None,
        deliver: Callable[[Any, BaseException | None], None],
    ) -> None:
        vectors = np.asarray(vectors)
        if vectors.ndim == 1:
            vectors = vectors.reshape(1, -1)
        job = _Search(vectors, k, where, _key(k, where), deliver)
        with self._cond:
            if self._closing:
                raise Draining("the server is shutting down and takes no new searches")
            if not self._threads:
                self.start()
            self._queue.append(job)
            self._cond.notify_all()  # a lingering worker as well as an idle one

    # ------------------------------------------------------------------ worker

    def _take(self) -> list[_Search] | None:
        """The oldest search and every queued one it can share a store call with (None:
        closing and nothing left)."""
        with self._cond:
            # while one worker waits for coming searches, the others leave them to it
            while not self._queue or self._lingering:
                if self._closing and not self._queue:
                    return None
                self._cond.wait()
            first = self._queue.popleft()
            jobs, rows = [first], len(first.vectors)
            deadline = time.monotonic() + self.linger_s
            while True:
                rows = self._merge(jobs, rows)
                remaining = deadline - time.monotonic()
                if (
                    rows >= min(self.linger_rows, self.max_rows)
                    or not self._coming
                    or self._closing
                    or remaining <= 0
                ):
                    break
                self._lingering = True
                self._cond.wait(remaining)
            if self._lingering:
                self._lingering = False
                self._cond.notify_all()
        return jobs

    def _merge(self, jobs: list[_Search], rows: int) -> int:
        """Move every queued search that shares the first one's store call into ``jobs``;
        the new row count. Called with the lock held."""
        kept: deque[_Search] = deque()
        while self._queue:
            job = self._queue.popleft()
            if job.key == jobs[0].key and rows + len(job.vectors) <= self.max_rows:
                jobs.append(job)
                rows += len(job.vectors)
            else:
                kept.append(job)
        self._queue = kept
        return rows

    def _run(self) -> None:
        while True:
            jobs = self._take()
            if jobs is None:
                return
            if len(jobs) == 1 or not self._run_merged(jobs):
                for job in jobs:
                    self._run_alone(job)

    def _run_merged(self, jobs: list[_Search]) -> bool:
        """One store call for every job; False when it failed (each job then runs alone)."""
        first = jobs[0]
        try:
            hits = self._search(np.concatenate([j.vectors for j in jobs]), first.k, first.where)
        except Exception as exc:
            logger.debug("a merged search of %d requests failed (%s); running each", len(jobs), exc)
            return False
        self._observe(sum(len(j.vectors) for j in jobs), len(jobs))
        start = 0
        for job in jobs:
            stop = start + len(job.vectors)
            job.deliver(hits[start:stop], None)
            start = stop
        return True

    def _run_alone(self, job: _Search) -> None:
        try:
            hits = self._search(job.vectors, job.k, job.where)
        except BaseException as exc:  # handed to the request, never lost
            job.deliver(None, exc)
            return
        self._observe(len(job.vectors), 1)
        job.deliver(hits, None)

    def _observe(self, queries: int, requests: int) -> None:
        if self.observer is not None:
            self.observer(queries, requests)


def search_workers(store: Any) -> int:
    """Worker threads for ``store``: one when it serializes searches (a second thread would
    only wait for the first), else one per core this process may use, at most 4."""
    if not getattr(store, "thread_safe_search", False):
        return 1
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS / Windows
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))
