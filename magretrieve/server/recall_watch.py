"""Recall on live traffic: a sample of ``/search`` queries re-run exactly, in the background.

A store tuned to ``--target-recall`` promises recall@10 on queries like the ones it tuned on;
live traffic may differ. So the server keeps checking: a share (``recall_sample``) of the
unfiltered ``/search`` queries is queued (the request path only copies a vector and the hit
ids, and drops the sample when the queue is full), and one background thread answers them
exactly, streaming the stored vectors in chunks (memory stays at one chunk, never a second copy
of the store) and sleeping between chunks so that it uses at most :data:`CPU_SHARE` of one
core. recall@10 = |served top-10 ∩ exact top-10| / 10, averaged over the last :data:`WINDOW`
checked queries, is exported as the ``magretrieve_recall_at_10`` gauge and in ``GET /info``;
below the store's target (its ``target_recall``, else the target it was tuned to) a warning
is logged. Documents written between the search and its check can move the exact answer, so
under heavy writes the figure is a little pessimistic.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from magretrieve.core.topk import exact_search

logger = logging.getLogger(__name__)

K = 10
#: Checked queries the reported recall averages over.
WINDOW = 200
#: Sampled queries waiting for their exact answer; more are dropped (never block a request).
QUEUE = 64
#: Queries answered together in one pass over the stored vectors.
BATCH = 16
#: Stored vectors scored per step (the memory the check needs).
CHUNK = 8192
#: Share of one core the background check may use.
CPU_SHARE = 0.1
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
        self._queue: queue.Queue[tuple[np.ndarray, list[str], int] | None] = queue.Queue(QUEUE)
        self._window: deque[float] = deque(maxlen=WINDOW)
        self._lock = threading.Lock()
        self._warned = False
        self.checked = 0
        self.dropped = 0
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
            "sample": self.sample,
            "target": self.target,
            "ground_truth": "exact inner product over the stored vectors",
        }

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < BATCH:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            try:
                self._check(batch)
            except Exception as exc:  # a store closing under us, a write racing: skip, go on
                logger.debug("recall check skipped: %s", exc)

    def _check(self, batch: list[tuple[np.ndarray, list[str], int]]) -> None:
        q = np.stack([b[0] for b in batch])
        k = max(b[2] for b in batch)
        best_scores = np.full((len(q), 0), -np.inf, dtype=np.float32)
        best_ids = np.empty((len(q), 0), dtype=object)
        store = self.retriever.store
        ids = list(store.iter_ids())
        for start in range(0, len(ids), self.chunk):
            t0 = time.perf_counter()
            part = ids[start : start + self.chunk]
            vecs = store.get_vectors(part)
            rows, scores = exact_search(q, vecs, k)
            best_scores = np.concatenate([best_scores, scores], axis=1)
            best_ids = np.concatenate([best_ids, np.asarray(part, dtype=object)[rows]], axis=1)
            keep = np.argsort(-best_scores, axis=1, kind="stable")[:, :k]
            best_scores = np.take_along_axis(best_scores, keep, axis=1)
            best_ids = np.take_along_axis(best_ids, keep, axis=1)
            busy = time.perf_counter() - t0
            time.sleep(busy * (1.0 - self.cpu_share) / self.cpu_share)  # bounded CPU share
        for (_, served, want), truth in zip(batch, best_ids, strict=True):
            exact = list(truth[:want])
            if exact:  # an empty store has nothing to miss
                self._record(len(set(served) & set(exact)) / len(exact))

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
