"""An advisory writer lock on a folder store, so two writers cannot lose each other's documents.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on the store *folder itself* (no lock file is left in
it), taken by the first write of a store object (add, delete, metadata, persist) and held until
``close()``. Readers never take it, so searches keep working while an index is being built.
A second writer gets a one-line error naming the holder (pid and program, read from
``/proc/locks`` where the system has it; never its arguments, which may hold secrets). The kernel drops the lock when its holder dies, so a
killed writer never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from magretrieve.core.errors import WriterLockHeld
from magretrieve.core.redact import redact

T = TypeVar("T")

try:  # POSIX only; elsewhere the lock is a no-op (documented in docs/stores.md)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def _holder(folder: Path) -> str | None:
    """``pid N (command line)`` of whoever holds a flock on ``folder``; ``another process``
    where the kernel's lock table cannot be read; None when it lists no holder (the holder
    let go after our flock failed)."""
    try:
        st = os.stat(folder)
        inode = f":{st.st_ino}"
        with open("/proc/locks") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return "another process"
    for line in lines:
        parts = line.split()
        if "->" in parts:  # a blocked waiter, not the holder
            continue
        if "FLOCK" in parts and len(parts) >= 6 and parts[5].endswith(inode):
            pid = parts[4]
            if pid == str(os.getpid()):
                return f"this process (pid {pid}, another open store object)"
            try:
                raw = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                raw = b""
            program = _program(raw.decode(errors="replace").split("\x00"))
            return f"pid {pid}" + (f" ({program})" if program else "")
    return None


#: Looks at a lock before calling it held: a holder that lets go between our failed flock
#: and our reading of the lock table is gone, so the flock is tried again.
ATTEMPTS = 3


def _take_or_name(fd: int, path: Path) -> str | None:
    """Take the flock on ``fd`` (None) or name who holds ``path`` (``pid N (program)``)."""
    holder: str | None = None
    for _ in range(ATTEMPTS):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return None
        except BlockingIOError:
            holder = _holder(path)
            if holder is not None:
                return holder
    return holder or "another process"


def _program(argv: list[str]) -> str:
    """What runs, without its arguments: the names of the first words before any option
    (``python magretrieve serve``). Options and their values stay out of the message, since a
    command line may hold an API key or a database password."""
    words: list[str] = []
    module = False
    for word in argv:
        if word == "-m" and len(words) == 1:  # python -m magretrieve index
            module = True
            continue
        if not word or word.startswith("-") or len(words) == 3:
            break
        words.append(word if module else Path(word).name)
        module = False
    return redact(" ".join(words))


class WriterLock:
    """Exclusive, non-blocking, per-folder; ``acquire`` is idempotent.

    ``engine``: the name of an engine that opens a store in one process at a time (readers
    too); its refusal is then worded as :func:`engine_busy`'s.
    """

    def __init__(self, folder: Path, where: str, engine: str | None = None) -> None:
        self.folder = Path(folder)
        self.where = where
        self.engine = engine
        self._fd: int | None = None
        #: Folders ``acquire`` created (deepest first): removed again by ``discard_empty``.
        self.created: list[Path] = []

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None or fcntl is None:
            return
        missing = [p for p in (self.folder, *self.folder.parents) if not p.exists()]
        self.folder.mkdir(parents=True, exist_ok=True)
        self.created = missing
        fd = os.open(self.folder, os.O_RDONLY)
        holder = _take_or_name(fd, self.folder)
        if holder is not None:
            os.close(fd)
            if self.engine is not None:
                raise engine_busy(self.where, holder, self.engine) from None
            raise WriterLockHeld(
                f"{self.where}: another writer holds this store ({holder}); wait for it to "
                "finish, or write to another folder (searching it is fine meanwhile)"
            ) from None
        self._fd = fd

    def __del__(self) -> None:  # an unclosed store must not keep its folder locked forever
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.release()

    def discard_empty(self) -> None:
        """Remove the folders ``acquire`` created if they are still empty (a failed create)."""
        for folder in self.created:
            with contextlib.suppress(OSError):  # not empty, or gone: leave it
                folder.rmdir()
        self.created = []

    def release(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            finally:
                os.close(self._fd)
                self._fd = None


def holder_of(path: Path) -> str | None:
    """Who holds a flock on ``path`` (``pid N (program)``), or None when nobody does.

    For engines that lock their own files and open a store in one process at a time
    (Milvus Lite, embedded Qdrant, Qdrant Edge): when their open fails, this tells a store
    held by another process from a damaged one.
    """
    if fcntl is None or not path.exists():
        return None
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        holder = _take_or_name(fd, path)
        if holder is None:
            fcntl.flock(fd, fcntl.LOCK_UN)
        return holder
    finally:
        os.close(fd)


def engine_busy(where: str, holder: str, engine: str) -> WriterLockHeld:
    """The refusal of a store whose engine another process holds open (one process at a time:
    readers wait too); worded like :class:`WriterLock`'s, so every store answers alike."""
    return WriterLockHeld(
        f"{where}: another process holds this store ({holder}); {engine} opens a store in one "
        "process at a time, so wait for it to finish"
    )


def open_engine(open_fn: Callable[[], T], lock_path: Path, where: str, engine: str) -> T:
    """``open_fn()`` for an engine that locks its own files. When it fails while another
    process holds ``lock_path``, the refusal names that process (:func:`engine_busy`); when
    nobody holds it by the time we look (the holder just let go), the open is tried once more;
    a second failure is the engine's own error, for the caller to word."""
    for attempt in range(2):
        try:
            return open_fn()
        except Exception:
            holder = holder_of(lock_path)
            if holder is not None:
                raise engine_busy(where, holder, engine) from None
            if attempt:
                raise
    raise AssertionError("unreachable")  # pragma: no cover
