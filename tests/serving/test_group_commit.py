"""Writes beside searches through one Retriever: saves hold off writers, not searches.

- a search issued while a save is writing its files answers before the save ends (memory,
  FAISS and ScaNN stores, the save blocked inside its own file writes), and sees the batch
  the save is writing; a store that does not declare ``persists_beside_search`` is saved with
  searches held off;
- writers that arrive while a save runs share the one save that follows (group commit), and
  every write acknowledged that way is in the store when it is opened again;
- a save cut short at any file write leaves the generation before it or the new one, and the
  same Retriever saves again afterwards.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from magretrieve.serving.retriever import Retriever
from magretrieve.stores import _generation, memory_store, open_store
from tests.support.fake_encoder import DIM, FakeEncoder, corpus

KINDS = ["memory", "faiss", "scann"]


def _open(kind: str, folder: Path, built: bool = False) -> Retriever:
    """A Retriever over a folder store holding 40 documents, saved once (ScaNN: ``built`` with
    a searcher over 300, so its next save serializes that searcher)."""
    if kind == "scann":
        pytest.importorskip("scann")
    options: dict[str, Any] = {"exact_below": 200} if kind == "scann" else {}
    store = open_store(f"{kind}:{folder}", dimension=DIM, **options)
    r = Retriever(FakeEncoder(), store)
    r.add_documents(corpus(300 if built else 40))
    if built:
        store.optimize()
    r.persist()
    return r


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # reported by the test, not lost in the thread
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _block_file_writes(monkeypatch, kind: str) -> tuple[threading.Event, threading.Event]:
    """Make the store's save stop at its first file write until ``release`` is set."""
    started, release = threading.Event(), threading.Event()
    module: Any = memory_store if kind == "memory" else _generation
    real = module.atomic_write_bytes

    def slow(*args: Any, **kwargs: Any) -> Any:
        started.set()
        assert release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "atomic_write_bytes", slow)
    return started, release


def _write_one(r: Retriever, doc_id: str, text: str = "statins heart dose") -> Callable[[], None]:
    def write() -> None:
        r.add_documents([{"_id": doc_id, "text": text}])
        r.persist()

    return write


@pytest.mark.parametrize("kind", KINDS)
def test_a_search_answers_while_a_save_writes_its_files(tmp_path, monkeypatch, kind):
    r = _open(kind, tmp_path / "s", built=kind == "scann")
    started, release = _block_file_writes(monkeypatch, kind)
    writer, failed = _in_thread(_write_one(r, "new", "zyzzyva quokka " * 4))
    assert started.wait(60)  # the save is inside its file writes, and stays there
    searcher, hits = _in_thread(lambda: r.search("zyzzyva quokka", k=5))
    searcher.join(30)
    assert not searcher.is_alive() and writer.is_alive()  # answered; the save still runs
    assert not isinstance(hits[0], BaseException), hits[0]
    assert hits[0][0].id == "new"  # the batch being saved is already searchable
    assert r.existing(["new", "d1"]) == {"new", "d1"}
    release.set()
    writer.join(60)
    assert not writer.is_alive() and failed == [None]
    r.close()
    with open_store(f"{kind}:{tmp_path / 's'}") as reopened:
        assert reopened.existing(["new"]) == {"new"}


def test_a_store_not_declared_safe_is_saved_with_searches_held_off(tmp_path, monkeypatch):
    r = _open("memory", tmp_path / "s")
    r.store.persists_beside_search = False  # as a store that changes what searches read
    started, release = _block_file_writes(monkeypatch, "memory")
    writer, _ = _in_thread(_write_one(r, "new"))
    assert started.wait(60)
    searcher, hits = _in_thread(lambda: r.search("statins heart", k=5))
    searcher.join(0.5)
    assert searcher.is_alive() and not hits  # waits for the save
    release.set()
    searcher.join(30)
    writer.join(30)
    assert len(hits) == 1 and not isinstance(hits[0], BaseException)
    r.close()


def _wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


@pytest.mark.parametrize("kind", ["memory", "faiss"])
def test_writers_arriving_during_a_save_share_the_next_one(tmp_path, kind):
    r = _open(kind, tmp_path / "s")
    saves_before = r.persists
    real = r.store.persist
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def persist() -> None:  # the first save waits until the other writers are queued
        calls.append(len(calls))
        started.set()
        assert release.wait(60)
        real()

    r.store.persist = persist  # type: ignore[method-assign]
    first, _ = _in_thread(_write_one(r, "w0"))
    assert started.wait(60)
    others = [_in_thread(_write_one(r, f"w{n}", f"cell brain {n}")) for n in range(1, 8)]
    _wait_for(lambda: r._entered - r._left == 7, "seven writers waiting for their turn")
    release.set()
    for t, out in [(first, []), *others]:
        t.join(60)
        assert not t.is_alive()
        assert out in ([], [None]), out
    assert len(calls) == 2  # the first save, then one for the seven that waited
    assert r.persists - saves_before == 2
    r.close()
    with open_store(f"{kind}:{tmp_path / 's'}") as reopened:
        assert reopened.existing([f"w{n}" for n in range(8)]) == {f"w{n}" for n in range(8)}


def test_many_concurrent_writers_all_survive_a_reopen_with_fewer_saves(tmp_path):
    """Free-running: 8 threads x 10 batches, each acknowledged only after a save."""
    r = _open("faiss", tmp_path / "s")
    acknowledged: list[str] = []

    def writer(n: int) -> None:
        for j in range(10):
            _write_one(r, f"t{n}-{j}", f"lung flow {n} {j}")()
            acknowledged.append(f"t{n}-{j}")

    threads = [_in_thread(lambda n=n: writer(n)) for n in range(8)]
    for t, out in threads:
        t.join(120)
        assert out == [None]
    assert len(acknowledged) == 80
    r.close()
    with open_store(f"faiss:{tmp_path / 's'}") as reopened:
        assert reopened.existing(acknowledged) == set(acknowledged)
        assert reopened.count() == 40 + 80


class Crash(BaseException):
    """Stands in for SIGKILL inside a save (not an Exception: nothing may catch it)."""


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("crash_at", [1, 2, 3, 4])
def test_a_save_cut_short_leaves_the_old_or_the_new_generation(
    tmp_path, monkeypatch, kind, crash_at
):
    folder = tmp_path / "s"
    r = _open(kind, folder, built=kind == "scann")
    before = r.store.count()
    module: Any = memory_store if kind == "memory" else _generation
    calls = {"n": 0}

    def counting(real: Callable[..., Any]) -> Callable[..., Any]:
        def write(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == crash_at:
                raise Crash
            return real(*args, **kwargs)

        return write

    monkeypatch.setattr(module, "atomic_write_bytes", counting(module.atomic_write_bytes))
    monkeypatch.setattr(module, "atomic_write_json", counting(module.atomic_write_json))
    r.add_documents([{"_id": f"late{n}", "text": f"kiwi{n} " * 4} for n in range(5)])
    crashed = False
    try:
        r.persist()
    except Crash:
        crashed = True
    monkeypatch.undo()
    assert crashed == (calls["n"] >= crash_at)
    with open_store(f"{kind}:{folder}") as seen:  # what a restart after the crash finds
        assert seen.count() in (before, before + 5)
        assert len(seen.existing([f"late{n}" for n in range(5)])) in (0, 5)
        assert seen.existing(["d0", "d39"]) == {"d0", "d39"}
    r.persist()  # the Retriever saves again after a failed save
    assert r.search("kiwi3", k=1)[0].id == "late3"
    written = r.store.get_vectors(["late3"])
    r.close()
    with open_store(f"{kind}:{folder}") as after:
        assert after.count() == before + 5
        np.testing.assert_array_equal(after.get_vectors(["late3"]), written)
