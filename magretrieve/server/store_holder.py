"""The server's store: every store call goes through one :class:`StoreHolder`.

Two things need one place that store calls pass through:

* **Shutdown never races a write.** Each search, write (with its persist) or delete holds the
  holder for its whole run; :meth:`StoreHolder.close` waits for the calls running, then
  persists and closes the store, and any call that comes later is refused with a 503 before it
  touches the store. A write still running on a worker thread when uvicorn's grace period
  ends (uvicorn cancels the request, not the thread) therefore finishes before the store is
  closed, instead of writing into a closed one.
* **Replicas see other processes' commits.** A folder store (``faiss:``, ``scann:``,
  ``memory:DIR``) is read into memory when it opens; another process (``magretrieve index``,
  a writing replica) commits a new generation by switching the store's state file. Embedded
  ``chroma:`` and ``lancedb:`` keep what they loaded too; their writer bumps a generation
  marker file after each write (:mod:`magretrieve.stores._generation`). Before
  each call the holder compares the state on disk (the folder's id and generation) with the
  one it holds (one small file read) and, when another process moved it, reopens the store
  and answers from the new state. A folder deleted and built again has another id: it is
  loaded whatever its generation, once, and followed from there. Stores without a generation
  marker (database stores) read their engine's live state and are never reopened.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from magretrieve.core.locks import RWLock
from magretrieve.serving.errors import Draining
from magretrieve.serving.retriever import Retriever
from magretrieve.stores.base import StoreVersion

logger = logging.getLogger(__name__)


class StoreHolder:
    """The current :class:`~magretrieve.serving.retriever.Retriever` and its lifecycle.

    ``reopen`` opens the same store spec again (read-only) as a new Retriever; None turns
    reloading off (an in-memory store, or a caller that passed its own state).
    """

    def __init__(self, retriever: Retriever, reopen: Callable[[], Retriever] | None = None) -> None:
        self.retriever = retriever
        self._reopen = reopen
        self._lock = RWLock()  # calls share it; reload and close take it alone
        self._closed = False
        self._reloading = threading.Lock()
        self._failed: StoreVersion | None = None  # a state on disk that could not be read
        self.reloads = 0

    # ------------------------------------------------------------------ calls

    @contextmanager
    def use(self) -> Iterator[Retriever]:
        """The Retriever for one store call (search, write + persist, delete + persist).

        The newest committed state is loaded first when another process committed one;
        after :meth:`close` began, :class:`~magretrieve.serving.errors.Draining` (a 503).
        """
        self.refresh()
        with self._lock.read():
            if self._closed:
                raise Draining(
                    "the server is shutting down; the store is closed (retry on another replica)"
                )
            yield self.retriever

    @property
    def generation(self) -> int | None:
        """The generation of the state this server answers from (None: no such marker)."""
        return self.retriever.store.generation

    def stale(self) -> StoreVersion | None:
        """The state on disk when another process committed one this server does not hold."""
        store = self.retriever.store
        on_disk = store.disk_version()
        if on_disk is None or on_disk == store.version or store.has_unsaved_writes():
            return None
        return on_disk

    def refresh(self) -> bool:
        """Reopen the store when another process committed another state; True if it did.

        A generation that fails to open (half-written while the writer still works, or
        refused) is logged once and the current state keeps answering.
        """
        if self._reopen is None or self._closed:
            return False
        on_disk = self.stale()
        if on_disk is None or on_disk == self._failed:
            return False
        with self._reloading:  # one reload at a time; the others wait for its result
            if self._closed or self.stale() is None:
                return False
            if self.retriever.store.reloads_in_place:
                return self._reload_in_place(on_disk)
            try:
                fresh = self._reopen()
            except Exception as exc:  # keep answering from the state held
                if self._failed != on_disk:
                    logger.warning("store generation %s not loaded: %s", on_disk.generation, exc)
                self._failed = on_disk
                return False
            with self._lock.write():  # calls running on the old state finish first
                if self._holds_disk_state():
                    # a write of this server caught the store up meanwhile (a writer catches
                    # up with disk before it commits): the state held is the newest
                    old = fresh
                else:
                    old, self.retriever = self.retriever, fresh
                    self.reloads += 1
            self._failed = None
            old.close()
            if old is fresh:
                return False
            logger.info("store reloaded at generation %s", fresh.store.generation)
            return True

    def _holds_disk_state(self) -> bool:
        """Whether the state held is still the one to answer from, after a reopen (no call
        runs: the caller holds the lock alone): what is on disk now is what it holds (a
        write of this server committed it meanwhile), or it holds writes not saved yet.

        Otherwise the reopened state replaces it, whatever the generations say: a folder
        deleted and built again (another id) counts from 1 again, and a state compared by
        its number alone would be reopened at every call and thrown away."""
        store = self.retriever.store
        return store.has_unsaved_writes() or store.disk_version() == store.version

    def _reload_in_place(self, on_disk: StoreVersion) -> bool:
        """Reload a store whose engine every open in this process shares (embedded Chroma):
        the calls running finish first, then the store drops its engine and reads the disk."""
        with self._lock.write():
            try:
                self.retriever.store.reload()
            except Exception as exc:  # tried again at the next call
                logger.warning("store generation %s not loaded: %s", on_disk.generation, exc)
                return False
            self.reloads += 1
        logger.info("store reloaded at generation %s", self.generation)
        return True

    # ------------------------------------------------------------------ lifecycle

    def close(self, *, persist: bool) -> None:
        """Wait for running calls, refuse new ones, then persist (``persist``) and close."""
        with self._reloading, self._lock.write():
            if self._closed:
                return
            self._closed = True
        try:
            if persist:
                self.retriever.persist()
        finally:
            self.retriever.close()
