"""One lock for readers that may run together and writers that run alone.

Searches of a store (and of a Retriever) only read: any number may run at once. A change
(a write applied to memory, a rebuild, a compaction before a save) must run alone. An
exclusive lock for both makes concurrent searches take turns even where the index searches
from many threads (FAISS, ScaNN); :class:`RWLock` lets them share.

Rules, the ones ``threading.RLock`` code relies on kept:

* ``with lock:`` / ``with lock.write():`` is exclusive and reentrant (a change that calls
  another change of the same object);
* ``with lock.read():`` is shared; a thread already holding the lock (either way) takes it
  again at once, so a search inside a tuning pass or a nested read never waits for itself;
* a writer waiting keeps new readers out (writers are not starved by a stream of searches);
* a thread holding only a read cannot upgrade: asking for the write lock then raises
  ``RuntimeError`` (it would wait for itself forever).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType


class RWLock:
    """Many readers or one (reentrant) writer; see the module docstring."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0  # reads held by threads other than the writer
        self._owner: int | None = None  # the writing thread
        self._depth = 0  # its nested write holds
        self._waiting_writers = 0
        self._mine = threading.local()  # reads this thread holds

    def _my_reads(self) -> int:
        return int(getattr(self._mine, "reads", 0))

    # ------------------------------------------------------------------ write (exclusive)

    def acquire(self) -> None:
        """Take the lock alone (reentrant); waits for readers and any other writer."""
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                self._depth += 1
                return
            if self._my_reads():
                raise RuntimeError("a thread holding a read lock asked for the write lock")
            self._waiting_writers += 1
            try:
                while self._owner is not None or self._readers:
                    self._cond.wait()
            finally:
                self._waiting_writers -= 1
            self._owner, self._depth = me, 1

    def release(self) -> None:
        with self._cond:
            if self._owner != threading.get_ident():
                raise RuntimeError("release of a write lock this thread does not hold")
            self._depth -= 1
            if not self._depth:
                self._owner = None
                self._cond.notify_all()

    def __enter__(self) -> RWLock:
        self.acquire()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    @contextmanager
    def write(self) -> Iterator[None]:
        """``with lock.write():``, the same as ``with lock:``."""
        with self:
            yield

    # ------------------------------------------------------------------ read (shared)

    @contextmanager
    def read(self) -> Iterator[None]:
        """Hold the lock shared with other readers for the block."""
        me = threading.get_ident()
        reads = self._my_reads()
        counted = False
        with self._cond:
            if self._owner != me and not reads:
                while self._owner is not None or self._waiting_writers:
                    self._cond.wait()
            if self._owner != me:
                self._readers += 1
                counted = True
        self._mine.reads = reads + 1
        try:
            yield
        finally:
            self._mine.reads = reads
            if counted:
                with self._cond:
                    self._readers -= 1
                    if not self._readers:
                        self._cond.notify_all()


class Counter:
    """How many threads are inside :meth:`inside` now."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0

    @contextmanager
    def inside(self) -> Iterator[int]:
        """Count the caller in for the block; yields the count with the caller."""
        with self._lock:
            self._inside += 1
            now = self._inside
        try:
            yield now
        finally:
            with self._lock:
                self._inside -= 1
