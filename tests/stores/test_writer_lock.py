"""The folder writer lock and the engines that lock their own files: a holder that lets go
while a refused writer looks it up is not reported as a holder; the writer takes the lock
(or the engine opens) instead. A holder that stays is named by pid."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

from magretrieve.core.errors import WriterLockHeld
from magretrieve.stores import _writer_lock
from magretrieve.stores._writer_lock import WriterLock, holder_of, open_engine


@pytest.fixture
def held(tmp_path):
    """A folder whose flock another open file description holds (released by the test)."""
    folder = tmp_path / "store"
    folder.mkdir()
    fd = os.open(folder, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    yield folder, fd
    os.close(fd)


def let_go_while_looking(monkeypatch, fd: int) -> list[Path]:
    """The holder releases right after the refused flock, before the lock table is read."""
    real, looked = _writer_lock._holder, []

    def holder(path: Path) -> str | None:
        looked.append(path)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return real(path)

    monkeypatch.setattr(_writer_lock, "_holder", holder)
    return looked


def test_a_writer_takes_a_lock_its_holder_let_go_of_while_it_looked(held, monkeypatch):
    folder, fd = held
    looked = let_go_while_looking(monkeypatch, fd)
    lock = WriterLock(folder, "faiss:store")
    lock.acquire()
    assert lock.held and looked == [folder]
    lock.release()


def test_a_holder_that_stays_is_named_by_pid(held):
    folder, _ = held
    with pytest.raises(WriterLockHeld, match=rf"faiss:store: .*\(this process \(pid {os.getpid()}"):
        WriterLock(folder, "faiss:store").acquire()
    assert holder_of(folder) == f"this process (pid {os.getpid()}, another open store object)"


def test_holder_of_a_lock_let_go_while_looking_is_nobody(held, monkeypatch):
    folder, fd = held
    let_go_while_looking(monkeypatch, fd)
    assert holder_of(folder) is None


def test_an_engine_open_refused_by_a_holder_that_let_go_is_tried_again(held, monkeypatch):
    folder, fd = held
    let_go_while_looking(monkeypatch, fd)
    calls: list[int] = []

    def open_fn() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("locked by another process")
        return "opened"

    assert open_engine(open_fn, folder, "qdrant-local:db/docs", "embedded Qdrant") == "opened"
    assert len(calls) == 2


def test_an_engine_open_refused_by_a_holder_that_stays_names_it(held):
    folder, _ = held

    def open_fn() -> str:
        raise RuntimeError("locked by another process")

    with pytest.raises(WriterLockHeld, match=r"another process holds this store \(this process"):
        open_engine(open_fn, folder, "qdrant-local:db/docs", "embedded Qdrant")


def test_an_engine_that_fails_with_nobody_holding_the_lock_gives_its_own_error(tmp_path):
    def open_fn() -> str:
        raise RuntimeError("damaged")

    with pytest.raises(RuntimeError, match="damaged"):
        open_engine(open_fn, tmp_path, "qdrant-local:db/docs", "embedded Qdrant")


def test_a_chroma_folder_another_writer_is_creating_is_refused_by_name(held):
    """Chroma creates its tables when a folder's first client opens; two processes doing it at
    once fail inside Chroma, so creating takes the writer lock first."""
    pytest.importorskip("chromadb")
    from magretrieve.stores import open_store

    folder, _ = held
    with pytest.raises(
        WriterLockHeld, match=rf"another writer holds this store \(this process \(pid {os.getpid()}"
    ):
        open_store(f"chroma:{folder}/docs", dimension=4)
    assert not (folder / "chroma.sqlite3").exists()  # nothing created meanwhile


def test_a_qdrant_edge_folder_another_process_holds_is_refused_before_edge_touches_it(held):
    """Edge locks only its WAL, and only after a new shard's files are written; a second
    process creating or loading beside a writer damaged the shard, so the store takes the
    folder first and refuses with the one-process-at-a-time wording."""
    pytest.importorskip("qdrant_edge")
    from magretrieve.stores import open_store

    folder, _ = held
    refusal = rf"another process holds this store \(this process \(pid {os.getpid()}.*Qdrant Edge"
    with pytest.raises(WriterLockHeld, match=refusal):
        open_store(f"qdrant-edge:{folder}", dimension=4)
    assert list(folder.iterdir()) == []  # no shard created meanwhile


def test_an_open_qdrant_edge_store_holds_its_folder_until_closed(tmp_path):
    pytest.importorskip("qdrant_edge")
    import numpy as np

    from magretrieve.stores import open_store

    folder = tmp_path / "edge"
    store = open_store(f"qdrant-edge:{folder}", dimension=4)
    store.add(["a", "b"], np.eye(4, dtype=np.float32)[:2])
    assert holder_of(folder) == f"this process (pid {os.getpid()}, another open store object)"
    with pytest.raises(WriterLockHeld, match=r"another process holds this store .*Qdrant Edge"):
        open_store(f"qdrant-edge:{folder}")  # a reader too: Edge opens in one process at a time
    store.close()
    assert holder_of(folder) is None
    again = open_store(f"qdrant-edge:{folder}")
    try:
        assert sorted(again.iter_ids()) == ["a", "b"]
    finally:
        again.close()
