"""``RWLock``: readers together, one reentrant writer, writers not starved, no self-deadlock.

Each test drives threads with events and short timeouts: a thread that should be let in
gets in within seconds, one that should wait is still waiting after a pause.
"""

from __future__ import annotations

import threading
import time

import pytest

from magretrieve.core.locks import RWLock

WAIT = 5.0


def _start(target) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def test_readers_hold_it_together_and_a_writer_waits_for_them():
    lock = RWLock()
    inside = threading.Barrier(3, timeout=WAIT)  # both readers and the test at once
    release = threading.Event()
    order: list[str] = []

    def reader() -> None:
        with lock.read():
            inside.wait()
            release.wait(WAIT)
            order.append("read done")

    readers = [_start(reader), _start(reader)]
    inside.wait()  # would time out if the readers took turns

    def writer() -> None:
        with lock:
            order.append("write")

    w = _start(writer)
    time.sleep(0.2)
    assert order == []  # the writer waits while reads are held
    release.set()
    for t in [*readers, w]:
        t.join(WAIT)
    assert order == ["read done", "read done", "write"]


def test_a_waiting_writer_keeps_new_readers_out():
    lock = RWLock()
    held, release = threading.Event(), threading.Event()
    order: list[str] = []

    def first_reader() -> None:
        with lock.read():
            held.set()
            release.wait(WAIT)

    def writer() -> None:
        with lock.write():
            order.append("write")

    def late_reader() -> None:
        with lock.read():
            order.append("late read")

    r = _start(first_reader)
    held.wait(WAIT)
    w = _start(writer)
    time.sleep(0.2)  # the writer is waiting now
    late = _start(late_reader)
    time.sleep(0.2)
    assert order == []  # the late reader queues behind the writer
    release.set()
    for t in (r, w, late):
        t.join(WAIT)
    assert order == ["write", "late read"]


def test_the_writer_reenters_and_reads_without_waiting_for_itself():
    lock = RWLock()
    with lock, lock.write(), lock.read(), lock:  # a search inside a tuning pass, a change
        pass
    # released as many times as taken: another thread gets it at once
    got = threading.Event()
    t = _start(lambda: (lock.acquire(), got.set(), lock.release()))
    assert got.wait(WAIT)
    t.join(WAIT)


def test_a_nested_read_does_not_wait_behind_a_waiting_writer():
    lock = RWLock()
    outer, done = threading.Event(), threading.Event()
    go_on = threading.Event()

    def reader() -> None:
        with lock.read():
            outer.set()
            go_on.wait(WAIT)
            with lock.read():  # a writer waits now: a first read would queue, this one not
                done.set()

    wrote = threading.Event()

    def writer() -> None:
        with lock:
            wrote.set()

    r = _start(reader)
    outer.wait(WAIT)
    w = _start(writer)
    time.sleep(0.2)
    assert not wrote.is_set()
    go_on.set()
    assert done.wait(WAIT)
    assert wrote.wait(WAIT)  # the writer got in once the reads ended
    r.join(WAIT)
    w.join(WAIT)


def test_upgrading_a_read_to_a_write_is_refused_and_a_stray_release_too():
    lock = RWLock()
    with (
        lock.read(),
        pytest.raises(RuntimeError, match="holding a read lock asked for the write lock"),
    ):
        lock.acquire()
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.release()
    with lock:  # nothing was left held by the refusals
        pass
