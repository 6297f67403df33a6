"""FAISS and ScaNN searches run side by side; a change waits for the searches inside.

Both libraries search a built index from many threads at once (a const search), so the
stores take their lock shared for a search and alone for a change (add, delete, build,
the compaction before a save). Checked by holding searches inside the index: two of them
meet at a barrier there (they would time out taking turns), and a write issued meanwhile
returns only once they left, after which every search sees it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from magretrieve.stores import open_store
from tests.support.ann_data import ann_data

DIM = 32
WAIT = 10.0


def _faiss(path, kind: str):
    store = open_store(f"faiss:{path}", dimension=DIM, index_type=kind)
    return store, "raw_search"


def _scann(path, kind: str):
    pytest.importorskip("scann")
    store = open_store(f"scann:{path}", dimension=DIM, exact_below=100)
    return store, "_search_rows"


STORES: dict[str, Callable[[Any], tuple[Any, str]]] = {
    "faiss-flat": lambda p: _faiss(p, "flat"),
    "faiss-hnsw": lambda p: _faiss(p, "hnsw"),
    "scann": lambda p: _scann(p, ""),
}


def _filled(tmp_path, name: str):
    store, inside = STORES[name](tmp_path / "s")
    ids, docs, queries = ann_data(n=1000)
    store.add(ids, docs)
    store.optimize()
    return store, inside, queries


def _hold_inside(monkeypatch, store, inside: str, gate: Callable[[], None]) -> None:
    """Run ``gate()`` in each search, inside the store lock, before the index answers."""
    real = getattr(store, inside)

    def held(*args: Any, **kwargs: Any) -> Any:
        gate()
        return real(*args, **kwargs)

    monkeypatch.setattr(store, inside, held)


def _thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # reported by the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("name", list(STORES))
def test_two_searches_are_inside_the_index_at_once(tmp_path, monkeypatch, name):
    store, inside, queries = _filled(tmp_path, name)
    assert store.thread_safe_search
    # one query a call, as in the threads (ScaNN may answer a batch of two a little
    # differently from each query alone)
    want = [[h.id for h in store.search(queries[n : n + 1], 10)[0]] for n in range(2)]
    meet = threading.Barrier(2, timeout=WAIT)
    _hold_inside(monkeypatch, store, inside, meet.wait)
    runs = [_thread(lambda n=n: store.search(queries[n : n + 1], 10)) for n in range(2)]
    for t, _ in runs:
        t.join(2 * WAIT)
    for n, (_, out) in enumerate(runs):
        assert not isinstance(out[0], BaseException), out[0]  # BrokenBarrierError: in turns
        assert [h.id for h in out[0][0]] == want[n]
    store.close()


@pytest.mark.parametrize("name", list(STORES))
def test_a_write_waits_for_the_searches_inside_and_every_later_search_sees_it(
    tmp_path, monkeypatch, name
):
    store, inside, queries = _filled(tmp_path, name)
    entered, release = threading.Event(), threading.Event()

    def gate() -> None:
        entered.set()
        assert release.wait(2 * WAIT)

    _hold_inside(monkeypatch, store, inside, gate)
    searcher, found = _thread(lambda: store.search(queries[:1], 5))
    assert entered.wait(WAIT)
    new = np.asarray(queries[:1]) * 50.0  # the best hit of that query from now on
    writer, wrote = _thread(lambda: store.add(["new"], new))
    writer.join(0.5)
    assert writer.is_alive() and not wrote  # waits for the search inside the index
    release.set()
    searcher.join(WAIT)
    writer.join(WAIT)
    assert wrote == [1]
    assert not isinstance(found[0], BaseException), found[0]
    assert "new" not in [h.id for h in found[0][0]]  # searched before the write applied
    monkeypatch.undo()
    assert store.search(queries[:1], 5)[0][0].id == "new"
    store.close()


def test_a_faiss_batch_beside_another_search_takes_its_share_of_the_threads(tmp_path, monkeypatch):
    faiss = pytest.importorskip("faiss")
    from magretrieve.stores import _faiss_index

    store, _, queries = _filled(tmp_path, "faiss-flat")
    every = _faiss_index.default_threads()
    first_in, release = threading.Event(), threading.Event()
    asked: dict[str, int] = {}
    real = faiss.omp_set_num_threads

    def record(n: int) -> None:  # called inside the search, before FAISS runs
        name = threading.current_thread().name
        asked[name] = n
        real(n)
        if name == "first":
            first_in.set()
            assert release.wait(WAIT)

    monkeypatch.setattr(faiss, "omp_set_num_threads", record)
    first = threading.Thread(name="first", target=lambda: store.search(queries[:4], 5))
    first.start()
    assert first_in.wait(WAIT)
    second = threading.Thread(name="second", target=lambda: store.search(queries[4:8], 5))
    second.start()
    second.join(WAIT)
    release.set()
    first.join(WAIT)
    assert asked == {"first": every, "second": max(1, every // 2)}
    lone = threading.Thread(name="lone", target=lambda: store.search(queries[:1], 5))
    lone.start()
    lone.join(WAIT)
    assert asked["lone"] == 1  # one query: single_query_threads, beside others or not
    store.close()
