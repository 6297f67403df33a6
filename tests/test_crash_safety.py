"""Crash safety of indexing: SIGKILL at random points, crashes inside each write of a save,
and half-written files detected on load.

The SIGKILL test runs the procedure of benchmarks/crash_safety.py (which does ≥ 20 runs)
a few times with the tiny BERT export; the deterministic tests crash *inside* a FAISS save
at each of its writes, which random kills hit only rarely.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from conftest import load_benchmark
from test_bad_input import tiny_export_dir

from magretrieve.adapters import _faiss_files, open_store
from magretrieve.errors import StoreError


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("crash_safety")


@pytest.fixture(scope="module")
def export(tmp_path_factory, tiny_model_dir) -> Path:
    return tiny_export_dir(tmp_path_factory, tiny_model_dir)


def test_sigkill_at_random_points_then_resume_equals_an_uninterrupted_run(bench, export, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    ids = bench.write_corpus(corpus, 300)
    ref = bench.reference_run(export, "faiss", tmp_path / "ref", corpus, 8, 16)
    assert sorted(ref.ids) == sorted(ids)
    rng = random.Random(20261129)
    results = [
        bench.crash_run(export, "faiss", tmp_path / f"run{i}", corpus, ids, ref, rng, kills=1)
        for i in range(3)
    ]
    for r in results:
        assert r.ok, r.problems
    # the kills really interrupted indexing (not all after it had finished)
    assert any(r.killed[0] and r.count_after_kills[0] < len(ids) for r in results)


def test_compare_detects_a_lost_and_a_changed_document(bench, export, tmp_path):
    """The benchmark's check can fail: a store missing one document, or with one changed."""
    corpus = tmp_path / "corpus.jsonl"
    ids = bench.write_corpus(corpus, 40)
    ref = bench.reference_run(export, "faiss", tmp_path / "ref", corpus, 8, 16)
    spec = bench.spec_for("faiss", tmp_path / "ref")
    store = open_store(spec)
    vec = store.get(["doc3"])[0].vector
    store.delete(["doc5"])
    store.add(["doc3"], vec * 2.0, [{"title": "T4", "text": "changed"}])
    store.persist()
    store.close()
    problems = bench.compare(export, spec, ids, ref)
    assert any("count 39" in p for p in problems)
    assert any("missing id" in p and "doc5" in p for p in problems)
    assert any("payload of 'doc3'" in p for p in problems)


def _data(n: int, dim: int = 8) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(n)
    return [f"d{i}" for i in range(n)], rng.normal(size=(n, dim)).astype(np.float32)


class Crash(BaseException):
    """Stands in for SIGKILL inside a save (not an Exception: nothing may catch it)."""


@pytest.mark.parametrize("crash_at", [1, 2, 3, 4])
def test_crash_inside_each_write_of_the_first_save_still_resumes(tmp_path, monkeypatch, crash_at):
    """The first save writes: empty generation-0 state, index, records, state. Crash in each."""
    ids, vecs = _data(30)
    path = tmp_path / "f"
    calls = {"n": 0}
    real_bytes, real_json = _faiss_files.atomic_write_bytes, _faiss_files.atomic_write_json

    def counting(real):
        def write(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == crash_at:
                raise Crash
            return real(*args, **kwargs)

        return write

    monkeypatch.setattr(_faiss_files, "atomic_write_bytes", counting(real_bytes))
    monkeypatch.setattr(_faiss_files, "atomic_write_json", counting(real_json))
    store = open_store(f"faiss:{path}", dimension=8)
    store.add(ids[:20], vecs[:20])
    with pytest.raises(Crash):
        store.persist()
    monkeypatch.undo()
    store.close()  # a killed writer's lock dies with its process; here the object stands in
    # the folder reopens: empty (crash before the state switch) or complete (after it)
    reopened = open_store(f"faiss:{path}", dimension=8)
    assert reopened.count() in (0, 20)
    have = reopened.existing(ids)
    todo = [i for i, d in enumerate(ids) if d not in have]
    reopened.add([ids[i] for i in todo], vecs[todo])
    reopened.persist()
    final = open_store(f"faiss:{path}")
    assert final.count() == 30 and sorted(final.iter_ids()) == sorted(ids)
    np.testing.assert_array_equal(final.get_vectors(ids), vecs)
    # nothing of the crashed save is left behind
    names = sorted(p.name for p in path.iterdir())
    assert names == ["faiss_store.json", "index-2.faiss", "records-2.json"] or names == [
        "faiss_store.json",
        "index-1.faiss",
        "records-1.json",
    ]


def test_temp_files_of_an_interrupted_save_are_removed_by_the_next_save(tmp_path):
    ids, vecs = _data(10)
    path = tmp_path / "f"
    store = open_store(f"faiss:{path}", dimension=8)
    store.add(ids, vecs)
    store.persist()
    # what a SIGKILL inside atomic_write_bytes leaves: a temp file beside the real ones
    (path / ".index-2.faiss.k1ll3d.tmp").write_bytes(b"partial")
    (path / ".records-2.json.k1ll3d.tmp").write_bytes(b"[")
    assert open_store(f"faiss:{path}").count() == 10  # ignored on load
    store.add(["extra"], vecs[:1])
    store.persist()
    assert not list(path.glob(".*.tmp"))


def _faiss_folder(tmp_path: Path) -> tuple[Path, dict]:
    ids, vecs = _data(30)
    path = tmp_path / "f"
    store = open_store(f"faiss:{path}", dimension=8)
    store.add(ids, vecs, [{"n": i} for i in range(30)])
    store.persist()
    return path, json.loads((path / "faiss_store.json").read_text())


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "damage,needle",
    [
        ("truncate-index", "half-written or modified"),
        ("truncate-records", "half-written or modified"),
        ("flip-index-byte", "half-written or modified"),
        ("missing-index", "missing (the store in"),
        ("torn-state", "unreadable"),
    ],
)
def test_half_written_faiss_store_is_detected_on_load(tmp_path, damage, needle):
    path, state = _faiss_folder(tmp_path)
    index_file, records_file = path / state["index_file"], path / state["records_file"]
    if damage == "truncate-index":
        _truncate(index_file)
        culprit = index_file
    elif damage == "truncate-records":
        _truncate(records_file)
        culprit = records_file
    elif damage == "flip-index-byte":
        data = bytearray(index_file.read_bytes())
        data[len(data) // 2] ^= 0xFF
        index_file.write_bytes(bytes(data))
        culprit = index_file
    elif damage == "missing-index":
        index_file.unlink()
        culprit = index_file
    else:
        _truncate(path / "faiss_store.json")
        culprit = path / "faiss_store.json"
    with pytest.raises(StoreError) as info:
        open_store(f"faiss:{path}")
    assert str(culprit) in str(info.value) and needle in str(info.value)


def test_half_written_memory_store_is_detected_on_load(tmp_path):
    ids, vecs = _data(12)
    store = open_store(f"memory:{tmp_path / 'm'}", dimension=8)
    store.add(ids, vecs)
    store.persist()
    state = json.loads((tmp_path / "m" / "memory_store.json").read_text())
    _truncate(tmp_path / "m" / state["vectors"])
    with pytest.raises(StoreError, match="does not match its checksum"):
        open_store(f"memory:{tmp_path / 'm'}")
