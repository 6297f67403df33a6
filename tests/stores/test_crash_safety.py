"""Crash safety of indexing: SIGKILL at random points, crashes inside each write of a save,
and half-written files detected on load.

The SIGKILL test runs the procedure of benchmarks/crash_safety.py (which does ≥ 20 runs)
a few times with the tiny BERT export; the deterministic tests crash *inside* a FAISS save
at each of its writes, which random kills hit only rarely.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from magretrieve.core.errors import StoreError
from magretrieve.stores import _generation, open_store
from tests.support.benchmarks import load_benchmark
from tests.support.exports import tiny_export_dir


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("crash_safety")


@pytest.fixture(scope="module")
def export(tmp_path_factory, tiny_model_dir) -> Path:
    return tiny_export_dir(tmp_path_factory, tiny_model_dir)


@pytest.mark.integration
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


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["chroma", "lancedb"])
def test_sigkill_then_resume_on_embedded_databases(bench, export, tmp_path, backend):
    """Chroma and LanceDB folders killed mid-indexing: they open, resume, and equal the
    uninterrupted run: ids, vectors and payloads; search results too for LanceDB (an exact
    scan). Chroma always searches an HNSW graph, whose shape depends on the order vectors
    arrived in, so a resumed run may rank a near-tie differently: its hits are not compared."""
    corpus = tmp_path / "corpus.jsonl"
    ids = bench.write_corpus(corpus, 160)
    ref = bench.reference_run(export, backend, tmp_path / "ref", corpus, 8, 16)
    assert sorted(ref.ids) == sorted(ids)
    rng = random.Random(20261201)
    results = [
        bench.crash_run(export, backend, tmp_path / f"run{i}", corpus, ids, ref, rng, kills=1)
        for i in range(2)
    ]
    for r in results:
        problems = r.problems
        if backend == "chroma":
            problems = [p for p in problems if not p.startswith("query ")]
        assert not problems, problems


@pytest.mark.integration
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
    real_bytes, real_json = _generation.atomic_write_bytes, _generation.atomic_write_json

    def counting(real):
        def write(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == crash_at:
                raise Crash
            return real(*args, **kwargs)

        return write

    monkeypatch.setattr(_generation, "atomic_write_bytes", counting(real_bytes))
    monkeypatch.setattr(_generation, "atomic_write_json", counting(real_json))
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


# ----------------------------------------------------------------------------- the other multi-step writes
# Crash windows of the other multi-step writes: export --overwrite, rescale, fit-prior.


def _dead_pid() -> int:
    """The id of a process that has exited (what a SIGKILLed export leaves in its owner file)."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_export_overwrite_swaps_atomically(export, tmp_path):
    """With renameat2 the target is the old or the new export at every instant."""
    from magretrieve.export.publish import exchange, make_staging, publish

    target = tmp_path / "exp"
    shutil.copytree(export, target)
    staging = make_staging(target)
    new = staging / "fp32"
    new.mkdir()
    (new / "marker").write_text("new")
    publish(new, target, staging)
    assert (target / "marker").read_text() == "new"
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (a, b):
        folder.mkdir()
        (folder / "x").write_text(folder.name)
    if exchange(a, b):  # Linux: one atomic swap; the old export went where the new one was
        assert (a / "x").read_text() == "b" and (b / "x").read_text() == "a"
        assert (new / "magretrieve.json").is_file()
    else:  # elsewhere: two renames, the old export set aside first (see the next test)
        assert (staging / "previous" / "magretrieve.json").is_file()


def test_export_overwrite_killed_between_renames_is_reported_and_restored(
    export, tmp_path, monkeypatch
):
    """Where folders cannot be swapped, a kill between the two renames leaves no target: the
    old export sits in the staging folder, Manifest.load says so, the next export restores it."""
    import magretrieve.export.publish as publish_mod
    from magretrieve.core.errors import ManifestError
    from magretrieve.core.manifest import Manifest

    target = tmp_path / "exp"
    shutil.copytree(export, target)
    old = _folder_bytes(target)
    staging = publish_mod.make_staging(target)
    new = staging / "fp32"
    new.mkdir()
    (new / "marker").write_text("new")
    monkeypatch.setattr(publish_mod, "exchange", lambda a, b: False)
    real_rename = Path.rename

    def rename(self, dest):
        if Path(self) == new:
            raise Crash  # SIGKILL right after the old export was set aside
        return real_rename(self, dest)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(Crash):
        publish_mod.publish(new, target, staging)
    monkeypatch.undo()
    assert not target.exists()
    (staging / publish_mod.OWNER_FILE).write_text(str(_dead_pid()))  # the process died
    with pytest.raises(ManifestError, match=r"interrupted `magretrieve export --overwrite`"):
        Manifest.load(target)
    said: list[str] = []
    publish_mod.recover(target, said.append)
    assert _folder_bytes(target) == old  # the old state, byte-identical
    assert not list(tmp_path.glob(".exp.tmp-*")) and "restored" in said[0]
    Manifest.load(target)


def test_recover_leaves_a_running_exports_staging_alone(tmp_path):
    from magretrieve.export.publish import make_staging, recover

    target = tmp_path / "exp"
    mine = make_staging(target)  # owned by this (live) process
    dead = make_staging(target)
    (dead / "owner.pid").write_text(str(_dead_pid()))
    recover(target, lambda msg: None)
    assert mine.is_dir() and not dead.exists()


def _cosine_source(folder: Path, n: int = 40) -> str:
    rng = np.random.default_rng(3)
    vecs = rng.normal(size=(n, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    spec = f"faiss:{folder}"
    store = open_store(spec, dimension=8)
    store.add([f"d{i}" for i in range(n)], vecs, [{"text": f"t{i}"} for i in range(n)])
    store.write_metadata(
        {"mode": "cosine", "gamma_q": 1.0, "gamma_d": 1.0, "document_contract": "unit_norm"}
    )
    store.persist()
    store.close()
    return spec


@pytest.mark.parametrize("kind", ["faiss", "memory", "qdrant-edge", "qdrant-local"])
def test_rescale_killed_part_way_is_reported_incomplete_and_resumes(tmp_path, monkeypatch, kind):
    """A crash after some batches: the target says 'incomplete' (every Retriever refuses it),
    and re-running the same rescale finishes it equal to an uninterrupted run."""
    from magretrieve.priors import HubPrior
    from magretrieve.priors.rescale import INCOMPLETE_KEY, read_all, rescale_store
    from magretrieve.serving.retriever import check_compatible

    source = _cosine_source(tmp_path / "src")
    specs = {
        "faiss": lambda f: f"faiss:{f}",
        "memory": lambda f: f"memory:{f}",
        "qdrant-edge": lambda f: f"qdrant-edge:{f}",
        "qdrant-local": lambda f: f"qdrant-local:{f}/c",
    }
    ref_spec, spec = specs[kind](tmp_path / "ref"), specs[kind](tmp_path / "t")
    rescale_store(source, ref_spec, prior=HubPrior(0.2, 3), batch_size=8, progress=False)

    calls = {"n": 0}
    import magretrieve.stores as adapters

    real_open = adapters.open_store

    def crashing_open(*args, **kwargs):
        store = real_open(*args, **kwargs)
        real_add = store.add

        def add(*a, **k):
            calls["n"] += 1
            if calls["n"] == 3:
                store.persist()  # what was written so far is durable, as after a real kill
                raise Crash
            return real_add(*a, **k)

        store.add = add
        return store

    monkeypatch.setattr(adapters, "open_store", crashing_open)
    with pytest.raises(Crash):
        rescale_store(source, spec, prior=HubPrior(0.2, 3), batch_size=8, progress=False)
    monkeypatch.undo()
    target = open_store(spec, dimension=8)
    meta = target.read_metadata()
    assert meta[INCOMPLETE_KEY]["operation"] == "rescale" and 0 < target.count() < 40
    model = type(
        "M",
        (),
        {
            "dimension": 8,
            "index_metric": "inner_product",
            "document_contract": "magnitude_keeping",
            "mode": "cosine",
            "gamma_q": 1.0,
            "gamma_d": 1.0,
            "model_fingerprint": "x",
        },
    )()
    with pytest.raises(StoreError, match="incomplete"):
        check_compatible(model, target)
    target.close()
    rescale_store(source, spec, prior=HubPrior(0.2, 3), batch_size=8, progress=False)
    ref, got = open_store(ref_spec), open_store(spec)
    try:
        (ids_a, vec_a, pay_a), (ids_b, vec_b, pay_b) = read_all(ref), read_all(got)
        assert ids_a == ids_b and pay_a == pay_b
        np.testing.assert_allclose(vec_a, vec_b, atol=1e-6)
        assert got.read_metadata() == ref.read_metadata()  # the marker is gone
    finally:
        ref.close()
        got.close()


@pytest.mark.integration
def test_rescale_sigkill_at_random_points(tmp_path):
    """The benchmark's rescale procedure, a few kills into a FAISS target."""
    ops = load_benchmark("_crash_ops")
    setup = ops.setup_rescale(tmp_path, ("faiss",), 2000)
    rng = random.Random(7)
    results = [ops.rescale_run(setup, "faiss", tmp_path, rng, i) for i in range(3)]
    for r in results:
        assert r.ok, r.problems
        assert r.state in ("old", "new", "incomplete")


# ----------------------------------------------------------------------------- annotate
# SIGKILLs of `magretrieve annotate` on an existing Cosine collection / pgvector table.


@pytest.fixture(scope="module")
def annotate_setup(tmp_path_factory):
    ops = load_benchmark("_crash_ops")
    work = tmp_path_factory.mktemp("annotate-crash")
    setup = ops.setup_annotate(work, ops.ANNOTATE_BACKENDS, 300)
    yield ops, setup
    setup.pg.stop()


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["qdrant-local", "pgvector"])
@pytest.mark.parametrize("op", ["annotate", "re-annotate"])
def test_annotate_sigkill_at_a_random_point_is_old_new_or_incomplete(annotate_setup, op, backend):
    ops, setup = annotate_setup
    rng = random.Random(hash((op, backend)) % 1000)
    result = ops.annotate_run(setup, op, backend, rng, 0)
    assert result.ok, result.problems
    assert result.state in ("old", "new", "incomplete")


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["qdrant-local", "pgvector"])
def test_annotate_classifier_catches_mixed_magnitudes(annotate_setup, backend):
    """A store whose record says "annotated" while half its m are another β is a failure."""
    from magretrieve.priors.annotate import open_for_annotation

    ops, setup = annotate_setup
    spec = setup.make(f"{backend}:annotated", f"{backend}-mixed")
    ref_m, _ = setup.new[("re-annotate", backend)]
    store = open_for_annotation(spec)
    try:
        pages = list(store.iter_points(100))
        store.set_magnitudes(pages[0], np.array([ref_m[str(p.id)] for p in pages[0]]))
    finally:
        store.close()
    state, problems = ops.classify_annotate(spec, "re-annotate", backend, setup)
    assert state == "" and "differ from the old ones" in problems[0]
