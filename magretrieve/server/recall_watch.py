"""Recall on live traffic: a sample of ``/search`` queries re-run exactly, in the background.

A store tuned to ``--target-recall`` promises recall@10 on queries like the ones it tuned on;
live traffic may differ. So the server keeps checking: a share (``recall_sample``) of the
unfiltered ``/search`` queries is queued (the request path only copies a vector and the hit
ids, and drops the sample when the queue is full), and one background thread answers every
query waiting in one pass over the stored vectors: the store hands them over in large blocks
(:meth:`~magretrieve.stores.base.VectorStore.iter_vectors`: views of its own arrays in the
memory and ScaNN stores, rebuilt a block at a time by FAISS, never a list of every id nor a
second copy of the store),
each block is scored for the whole batch in one matrix product, and the thread sleeps after
each block so that it uses at most ``cpu_share`` of one core (the server's
``--recall-cpu-share``; :data:`CPU_SHARE` here): a block costs the CPU
time the thread got (on a busy machine, waiting for a core costs nothing), charged once per
BLAS thread, as the product may run on each of them. recall@10 =
|served top-10 ∩ exact top-10| / 10, averaged over the last :data:`WINDOW` checked queries,
is exported as the ``magretrieve_recall_at_10`` gauge and in ``GET /info``; below the store's
target (its ``target_recall``, else the target it was tuned to) a warning is logged.
Documents written between the search and its check can move the exact answer, so under
heavy writes the figure is a little pessimistic.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from magretrieve.core.topk import top_k
from magretrieve.serving.settings import ServerSettings
from magretrieve.stores.base import VECTOR_BLOCK

logger = logging.getLogger(__name__)

K = 10
#: Checked queries the reported recall averages over.
WINDOW = 200
#: Sampled queries waiting for their exact answer; more are dropped (never block a request).
#: Every query waiting when a pass starts is answered by that pass.
QUEUE = 128
#: Stored vectors scored per step (the memory the check needs beyond the store's own).
CHUNK = VECTOR_BLOCK
#: Share of one core the background check may use, unless given: the server's default.
CPU_SHARE: float = ServerSettings.named("recall_cpu_share").default
#: Checked queries before a warning may be logged (a few queries are noise).
MIN_QUERIES = 20


class RecallWatch:
    """Samples served queries and keeps their recall@10 against exact inner product."""

    @property
    def retriever(self) -> Any:
        """The retriever whose store the exact answers come from (the one serving now)."""
        if self._current is not None:
            now = self._current()
            if now is not None:
                return now
        return self._retriever

    def __init__(
        self,
        retriever: Any,
        metrics: Any,
        sample: float,
        *,
        target: float | None = None,
        cpu_share: float = CPU_SHARE,
        chunk: int = CHUNK,
        seed: int | None = None,
        current: Callable[[], Any] | None = None,
    ) -> None:
        # ``current`` gives the retriever in use now: a serve replica reopens its store when
        # another process writes a newer generation, and the watch must follow it.
        self._retriever = retriever
        self._current = current
        self.sample = float(sample)
        self.target = target if target is not None else store_target(retriever.store)
        self.cpu_share = cpu_share
        self.chunk = chunk
        self.gauge = metrics.recall_at_10
        self.counter = metrics.recall_checked
        self._rng = random.Random(seed)
        self._queue: queue.Queue[tuple[np.ndarray, list[str], int]] = queue.Queue(QUEUE)
        self._window: deque[float] = deque(maxlen=WINDOW)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._warned = False
        self.checked = 0
        self.dropped = 0
        self.skipped = 0  # queries whose pass failed (the first failure is logged as a warning)
        #: Wall seconds of the last pass (sleeps included) and the vectors it scanned.
        self.last_pass: dict[str, float | int] | None = None
        self._cores = blas_cores()
        self._resume_at = 0.0  # monotonic time before which the thread rests (CPU share)
        self._thread = threading.Thread(
            target=self._run, name="magretrieve-recall-watch", daemon=True
        )
        self._thread.start()

    # ------------------------------------------------------------------ request path

    def offer(self, vectors: np.ndarray, hits: list[list[Any]], k: int = K) -> None:
        """Maybe queue these served searches (asked for ``k`` hits) for a check; cheap, never
        blocks. A search that returned fewer than ``min(k, 10)`` hits counts the missing ones
        as misses."""
        want = min(int(k), K)
        for vec, row in zip(vectors, hits, strict=True):
            if want < 1 or self._rng.random() >= self.sample:
                continue
            q = np.asarray(vec, dtype=np.float32).copy()
            if getattr(self.retriever, "offset", False):
                q = np.append(q, np.float32(1.0))
            try:
                self._queue.put_nowait((q, [h.id for h in row[:want]], want))
            except queue.Full:
                self.dropped += 1

    # ------------------------------------------------------------------ background

    @property
    def recall(self) -> float | None:
        with self._lock:
            return float(np.mean(self._window)) if self._window else None

    def info(self) -> dict[str, Any]:
        """What ``GET /info`` shows under ``recall_watch``."""
        value = self.recall
        return {
            f"recall_at_{K}": None if value is None else round(value, 4),
            "queries": len(self._window),
            "checked": self.checked,
            "dropped": self.dropped,
            "skipped": self.skipped,
            "sample": self.sample,
            "target": self.target,
            "cpu_share": self.cpu_share,
            "last_pass": self.last_pass,
            "ground_truth": "exact inner product over the stored vectors",
        }

    def close(self) -> None:
        """Stop the thread (a pass under way ends at its next block)."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batch = [self._queue.get(timeout=0.5)]
            except queue.Empty:
                continue
            while True:  # every query waiting now goes into this pass
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._check(batch)
            except Exception as exc:  # a store closing under us, a write racing: skip, go on
                self.skipped += len(batch)
                logger.log(
                    logging.DEBUG if self.skipped > len(batch) else logging.WARNING,
                    "recall check of %d live queries skipped: %s",
                    len(batch),
                    exc,
                )

    def _check(self, batch: list[tuple[np.ndarray, list[str], int]]) -> None:
        """One pass over the stored vectors answers every query of ``batch`` exactly."""
        started = time.monotonic()
        best = BlockTopK(np.stack([b[0] for b in batch]), max(b[2] for b in batch))
        scanned = self._scan(best, self.retriever.store.iter_vectors(self.chunk))
        if scanned is None:
            return  # closing
        self.last_pass = {
            "queries": len(batch),
            "vectors": scanned,
            "seconds": round(time.monotonic() - started, 3),
        }
        for (_, served, want), truth in zip(batch, best.ids, strict=True):
            exact = list(truth[:want])
            if exact:  # an empty store has nothing to miss
                self._record(len(set(served) & set(exact)) / len(exact))

    def _scan(self, best: BlockTopK, blocks: Iterable[tuple[list[str], np.ndarray]]) -> int | None:
        """Feed every block to ``best``; the vectors scanned (None: stopped). Each block's
        work buys a rest of ``busy × (1 − share) / share`` before the next block (of this
        pass or the next one; time spent waiting for queries counts as rest), so a pass
        reports as soon as its last block is scored."""
        scanned = 0
        iterator = iter(blocks)
        while True:
            if self._stop.wait(max(0.0, self._resume_at - time.monotonic())):
                return None
            c0 = time.thread_time()
            try:
                ids, vectors = next(iterator)
            except StopIteration:
                return scanned
            best.add(ids, vectors)
            scanned += len(ids)
            # CPU this thread got (not wall time: waiting for a busy core is no use of one),
            # once per BLAS thread, as the product ran on each of them
            busy = (time.thread_time() - c0) * self._cores
            self._resume_at = time.monotonic() + busy * (1.0 - self.cpu_share) / self.cpu_share

    def _record(self, value: float) -> None:
        with self._lock:
            self._window.append(value)
            current = float(np.mean(self._window))
            n = len(self._window)
        self.checked += 1
        self.counter.inc()
        self.gauge.set(current)
        if self.target is None or n < MIN_QUERIES:
            return
        if current < self.target and not self._warned:
            logger.warning(
                "%s: recall@%d on %d live queries re-run exactly is %.3f, below the store's "
                "target %.3f; raise the search setting (magretrieve recall EXPORT --store SPEC "
                "--queries FILE --target %.2f finds one)",
                getattr(self.retriever.store, "location", "store"),
                K,
                n,
                current,
                self.target,
                self.target,
            )
            self._warned = True
        elif current >= self.target:
            self._warned = False  # warn again if it falls again


def store_target(store: Any) -> float | None:
    """The recall the store was asked for: its ``target_recall``, else the recorded target."""
    target = getattr(store, "target_recall", None)
    if target is not None:
        return float(target)
    recall = store.describe().get("parameters", {}).get("recall") or {}
    value = recall.get("target")
    return float(value) if value is not None else None


class BlockTopK:
    """The exact top ``k`` by inner product of each query, fed the stored vectors block by
    block: one matrix product per block for every query, the block's ``k`` best by
    :func:`~magretrieve.core.topk.top_k`, then a merge with the best so far. ``ids`` holds the
    winners' ids, best first (ties at equal score go to the earlier block, then row)."""

    def __init__(self, queries: np.ndarray, k: int) -> None:
        self.queries = np.ascontiguousarray(queries, dtype=np.float32)
        self.k = int(k)
        m = len(self.queries)
        self.scores = np.zeros((m, 0), dtype=np.float32)
        self.ids = np.empty((m, 0), dtype=object)

    def add(self, ids: list[str], vectors: np.ndarray) -> None:
        if not len(ids):
            return
        cols, scores = top_k(self.queries @ vectors.T, self.k)
        names = np.asarray(ids, dtype=object)[cols]
        scores = np.concatenate([self.scores, scores], axis=1)
        names = np.concatenate([self.ids, names], axis=1)
        keep, self.scores = top_k(scores, self.k)
        self.ids = np.take_along_axis(names, keep, axis=1)


def blas_cores() -> int:
    """Cores one matrix product may run on: the BLAS thread pool (threadpoolctl, when
    installed), at most the CPUs this process may use."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS / Windows
        cpus = os.cpu_count() or 1
    try:
        from threadpoolctl import threadpool_info

        pools = [int(i["num_threads"]) for i in threadpool_info() if i.get("user_api") == "blas"]
    except Exception:  # not installed, or a library it cannot read: assume every CPU
        pools = []
    return max(1, min(max(pools, default=cpus), cpus))
