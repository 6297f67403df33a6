"""Careless reads and reopens, answered alike by every store.

- A read-only open (no dimension) of a store that does not exist creates nothing, on every
  folder backend and through ``magretrieve search``, and says the store is missing.
- Reopening with build options other than the recorded ones is refused (FAISS's rule) on
  Chroma, LanceDB, Milvus Lite, Qdrant Edge and pgvector; search-time knobs may differ, and
  leaving the build options out opens the store as built.
- A search returns ``min(k, count)`` hits or says why: Chroma's HNSW graph in space ``ip``
  stops short of k on clustered vectors, and the store answers those rows by an exact scan,
  so the server's filtered search finds every matching document; an index that cannot
  (FAISS IVF probing one list) is refused naming the shortfall.
- LanceDB's Rust log stays out of the terminal on a successful ``index``.
- A ``milvus:`` path that is another program's file is refused as not a Milvus Lite store.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import uuid

import numpy as np
import pytest

from magretrieve.core.errors import StoreError
from magretrieve.stores import open_store
from tests.support.ann_data import search_indexes_at_every_size
from tests.support.cli import run
from tests.support.exports import tiny_export_dir
from tests.support.fake_encoder import FakeEncoder, write_corpus

MISSING = {
    "faiss": "faiss:{d}/a/store",
    "scann": "scann:{d}/a/store",
    "memory": "memory:{d}/a/store",
    "qdrant-local": "qdrant-local:{d}/a/db/docs",
    "qdrant-edge": "qdrant-edge:{d}/a/store",
    "milvus": "milvus:{d}/a/lite.db/docs",
    "chroma": "chroma:{d}/a/db/docs",
    "lancedb": "lancedb:{d}/a/db/docs",
}


def clustered(n: int, dim: int = 32, seed: int = 0) -> np.ndarray:
    """Vectors around one common direction, with varied norms: Chroma's HNSW graph in space
    ``ip`` answers far fewer than k of them."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, dim)) * 0.3 + 3.0
    return (base * rng.uniform(0.5, 2.0, size=(n, 1))).astype(np.float32)


@pytest.mark.parametrize("backend", list(MISSING))
def test_a_read_only_open_of_a_missing_store_creates_nothing(tmp_path, backend):
    spec = MISSING[backend].format(d=tmp_path)
    with pytest.raises(StoreError, match=r"the store is missing and nothing was created") as info:
        open_store(spec)
    assert "pass a dimension" not in str(info.value)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("dimension", [0, -3, True, 2.5])
@pytest.mark.parametrize("backend", list(MISSING))
def test_creating_with_a_bad_dimension_creates_nothing(tmp_path, backend, dimension):
    """Refused alike, in one line naming the store, before any backend makes a file (Chroma,
    Milvus Lite and embedded Qdrant create theirs when they connect)."""
    spec = MISSING[backend].format(d=tmp_path)
    with pytest.raises(StoreError) as info:
        open_store(spec, dimension=dimension)
    assert str(info.value) == f"{spec}: dimension must be a positive integer, got {dimension!r}"
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    "spec",
    ["pgvector:postgresql://u:sekret@127.0.0.1:9/db#t", "qdrant:http://u:sekret@127.0.0.1:9/docs"],
)
def test_a_bad_dimension_for_a_server_store_names_it_without_its_secret(spec):
    with pytest.raises(StoreError, match="dimension must be a positive integer") as info:
        open_store(spec, dimension=0)
    assert "sekret" not in str(info.value) and "u:***@127.0.0.1:9" in str(info.value)


@pytest.mark.parametrize("backend", ["chroma", "lancedb", "faiss"])
def test_search_on_a_mistyped_store_path_creates_nothing(use_fake, tmp_path, backend):
    spec = MISSING[backend].format(d=tmp_path)
    res = run("search", "EXPORT", "wing flow", "--store", spec)
    assert res.exit_code == 1, res.output
    assert "the store is missing" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "a").exists()


def test_a_missing_collection_in_an_existing_chroma_folder_is_not_created(tmp_path):
    store = open_store(f"chroma:{tmp_path}/db/docs", dimension=4)
    store.close()
    with pytest.raises(StoreError, match=r"no Chroma collection 'other' here; the store is"):
        open_store(f"chroma:{tmp_path}/db/other")
    reopened = open_store(f"chroma:{tmp_path}/db/docs")
    try:
        names = {c.name for c in reopened.client.list_collections()}
    finally:
        reopened.close()
    assert names == {"docs"}


# ----------------------------------------------------------------------------- reopen


REOPEN = [
    ("chroma", {"hnsw_m": 8}, {"hnsw_m": 24}, r"--hnsw-m 24 differs from the 8"),
    (
        "chroma",
        {"ef_construction": 64},
        {"ef_construction": 200},
        r"--ef-construction 200 differs from the 64",
    ),
    ("lancedb", {"index_type": "IVF_FLAT"}, {"index_type": "IVF_HNSW_SQ"}, r"IVF_HNSW_SQ differs"),
    (
        "lancedb",
        {"index_type": "IVF_HNSW_SQ", "hnsw_m": 8},
        {"hnsw_m": 16},
        r"--hnsw-m 16 differs from the 8",
    ),
    ("milvus", {"index_type": "HNSW", "hnsw_m": 8}, {"hnsw_m": 24}, r"--hnsw-m 24 differs"),
    (
        "milvus",
        {"index_type": "HNSW", "ef_construction": 64},
        {"ef_construction": 200},
        r"--ef-construction 200 differs from the 64",
    ),
    ("milvus", {"index_type": "IVF_FLAT", "nlist": 8}, {"nlist": 16}, r"--nlist 16 differs"),
    ("milvus", {}, {"index_type": "HNSW"}, r"HNSW differs from the FLAT"),
    ("qdrant-edge", {"hnsw_m": 8}, {"hnsw_m": 24}, r"--hnsw-m 24 differs from the 8"),
    (
        "qdrant-edge",
        {"ef_construction": 64},
        {"ef_construction": 200},
        r"--ef-construction 200 differs from the 64",
    ),
    ("qdrant-edge", {}, {"quantization": "int8"}, r"int8 differs from the none"),
    (
        "qdrant-edge",
        {"indexing_threshold": 10},
        {"indexing_threshold": 20},
        r"20 differs from the 10",
    ),
    ("pgvector", {"hnsw_m": 8}, {"hnsw_m": 24}, r"--hnsw-m 24 differs from the 8"),
    (
        "pgvector",
        {"ef_construction": 32},
        {"ef_construction": 200},
        r"--ef-construction 200 differs from the 32",
    ),
    ("pgvector", {}, {"hnsw_m": 24}, r"--hnsw-m 24 differs from the 16"),  # pgvector's default
    (
        "pgvector",
        {"index_type": "ivfflat", "nlist": 4},
        {"nlist": 8},
        r"--nlist 8 differs from the 4",
    ),
    ("pgvector", {"index_type": "flat"}, {"index_type": "hnsw"}, r"hnsw differs from the flat"),
]


@pytest.mark.parametrize(("backend", "built", "asked", "message"), REOPEN)
def test_reopening_with_other_build_options_is_refused(
    request, tmp_path, monkeypatch, backend, built, asked, message
):
    search_indexes_at_every_size(monkeypatch)  # 300 vectors: the index is built and used
    if backend == "pgvector":  # a table on the session's PostgreSQL server
        spec = f"pgvector:{request.getfixturevalue('pg_uri')}#t_{uuid.uuid4().hex[:10]}"
    else:
        spec = MISSING[backend].format(d=tmp_path)
    vectors = np.random.default_rng(0).normal(size=(300, 8)).astype(np.float32)
    store = open_store(spec, dimension=8, **built)
    store.add([f"d{i}" for i in range(300)], vectors)
    store.optimize()
    before = store.describe()["parameters"]
    store.close()
    with pytest.raises(StoreError, match=message) as info:
        open_store(spec, dimension=8, **asked)
    assert "cannot change on reopen" in str(info.value)
    same = open_store(spec, dimension=8, **built)  # the recorded options: accepted
    same.close()
    reopened = open_store(spec)  # none given: the store as built, labelled as built
    try:
        assert reopened.describe()["parameters"] == before
        assert reopened.count() == 300
    finally:
        reopened.close()
    tuned = open_store(spec, dimension=8, ef_search=77)  # a search-time knob may differ
    try:
        assert tuned.describe()["parameters"].get("ef_search", 77) == 77
    finally:
        tuned.close()


# ----------------------------------------------------------------------------- k hits


def test_chroma_answers_k_hits_where_its_graph_stops_short(tmp_path):
    vectors = clustered(2400)
    ids = [f"d{i}" for i in range(len(vectors))]
    store = open_store(f"chroma:{tmp_path}/db/docs", dimension=32)
    try:
        store.add(ids, vectors, [{"n": i} for i in range(len(ids))])
        queries = np.random.default_rng(1).normal(size=(3, 32)).astype(np.float32) + 3.0
        raw = store._query(queries, 500, False)
        assert min(len(row) for row in raw) < 500  # the engine's own answer is short
        hits = store.search(queries, 500, with_vectors=False)
        exact = queries @ vectors.T
        for row, scores in zip(hits, exact, strict=True):
            assert len(row) == 500
            assert [h.id for h in row] == [ids[i] for i in np.argsort(-scores, kind="stable")[:500]]
            assert row[0].payload == {"n": int(row[0].id[1:])}
            np.testing.assert_allclose(
                [h.score for h in row], np.sort(scores)[::-1][:500], rtol=1e-5
            )
    finally:
        store.close()


def test_an_index_that_answers_short_is_completed_by_an_exact_scan(tmp_path, monkeypatch):
    """FAISS IVF probing one of 16 lists holds fewer than k points in the lists it probes:
    the base answers those rows from the stored points themselves, exactly."""
    search_indexes_at_every_size(monkeypatch)  # 400 vectors: searched through the index
    vectors = np.random.default_rng(0).normal(size=(400, 8)).astype(np.float32)
    ids = [f"d{i}" for i in range(400)]
    store = open_store(f"faiss:{tmp_path}/f", dimension=8, index_type="ivf", nlist=16, nprobe=1)
    store.add(ids, vectors, [{"n": i} for i in range(400)])
    assert min(len(row) for row in store._query(vectors[:2], 200, False)) < 200
    hits = store.search(vectors[:2], 200)
    for row, scores in zip(hits, vectors[:2] @ vectors.T, strict=True):
        assert [h.id for h in row] == [ids[i] for i in np.argsort(-scores, kind="stable")[:200]]
        np.testing.assert_allclose([h.score for h in row], np.sort(scores)[::-1][:200], rtol=1e-5)
        assert row[0].payload == {"n": int(row[0].id[1:])}
        np.testing.assert_allclose(row[0].doc_norm, np.linalg.norm(vectors[int(row[0].id[1:])]))
    assert len(store.search(vectors[:2], 5)[0]) == 5  # what it can answer, it answers


def test_a_store_that_cannot_scan_says_why_it_answered_short(tmp_path, monkeypatch):
    from magretrieve.stores.faiss_store import FaissStore

    search_indexes_at_every_size(monkeypatch)  # 400 vectors: searched through the index
    vectors = np.random.default_rng(0).normal(size=(400, 8)).astype(np.float32)
    store = open_store(f"faiss:{tmp_path}/f", dimension=8, index_type="ivf", nlist=16, nprobe=1)
    store.add([f"d{i}" for i in range(400)], vectors)

    def no_scan(self):
        raise NotImplementedError

    monkeypatch.setattr(FaissStore, "_scan_ids", no_scan)
    with pytest.raises(
        StoreError, match=r"answered \d+ of the 200 hits asked \(k=200, 400 stored\)"
    ):
        store.search(vectors[:2], 200)


def test_the_filtered_search_finds_every_match_on_chroma(tmp_path):
    from magretrieve.serving.retriever import Retriever

    vectors = clustered(2400)
    ids = [f"d{i}" for i in range(len(vectors))]
    store = open_store(f"chroma:{tmp_path}/db/docs", dimension=32)
    try:
        store.add(
            ids, vectors, [{"group": "wanted" if i % 120 == 7 else "other"} for i in range(2400)]
        )
        retriever = Retriever(FakeEncoder(dim=32), store, force=True)
        query = np.random.default_rng(2).normal(size=(1, 32)).astype(np.float32)
        hits = retriever.search_vectors(query, 20, where={"group": "wanted"})[0]
        assert sorted(h.id for h in hits) == sorted(ids[i] for i in range(7, 2400, 120))
    finally:
        store.close()


# ----------------------------------------------------------------------------- terminal


def test_lancedb_index_leaves_the_terminal_clean(tmp_path, tiny_model_dir, tmp_path_factory):
    export = tiny_export_dir(tmp_path_factory, tiny_model_dir)
    corpus = write_corpus(tmp_path / "c.jsonl", 600)
    spec = f"lancedb:{tmp_path}/db/docs"
    env = {k: v for k, v in os.environ.items() if k not in ("LANCEDB_LOG", "RUST_LOG")}
    native = re.compile(r"^\[\S+ +(WARN|INFO|DEBUG) +lance", re.MULTILINE)

    def index(*flags: str, into: str) -> subprocess.CompletedProcess:
        args = [*flags, "index", str(export), str(corpus), "--store", into, "--no-progress"]
        args += ["--faiss-index", "IVF_HNSW_SQ", "--force"]
        return subprocess.run(
            [sys.executable, "-m", "magretrieve", *args], capture_output=True, text=True, env=env
        )

    res = index(into=spec)
    assert res.returncode == 0, res.stderr[-2000:]
    assert not native.search(res.stderr), res.stderr[:2000]
    assert "600 added" in res.stdout
    verbose = index("-v", into=f"lancedb:{tmp_path}/db/verbose")  # -v shows the native log
    assert verbose.returncode == 0, verbose.stderr[-2000:]
    assert native.search(verbose.stderr), verbose.stderr[:2000]


def test_a_milvus_path_that_is_another_programs_file_is_refused(tmp_path):
    other = tmp_path / "notes.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    before = other.read_bytes()
    for dimension in (None, 4):
        with pytest.raises(StoreError, match=r"is a file, not a Milvus Lite store") as info:
            open_store(f"milvus:{other}/docs", dimension=dimension)
        assert "another process" not in str(info.value)
    assert other.read_bytes() == before
    assert json.dumps(sorted(os.listdir(tmp_path))) == '["notes.db"]'


# ----------------------------------------------------------------------------- LanceDB tuning


def partitioned(n: int = 3000, dim: int = 32) -> np.ndarray:
    """Tight clusters with log-normal norms: an IVF index over them needs its nprobe tuned."""
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(40, dim))
    docs = centers[rng.integers(0, 40, n)] + 0.2 * rng.normal(size=(n, dim))
    return (docs * np.exp(rng.normal(0, 0.6, size=(n, 1)))).astype(np.float32)


def test_lancedb_target_recall_tunes_nprobe_on_ivf_hnsw(tmp_path, monkeypatch):
    search_indexes_at_every_size(monkeypatch)  # 3,000 rows: the index answers
    vectors = partitioned()
    spec = f"lancedb:{tmp_path}/db/docs"
    store = open_store(spec, dimension=32, index_type="IVF_HNSW_SQ", nlist=200, target_recall=0.95)
    store.add([f"d{i}" for i in range(len(vectors))], vectors)
    store.optimize()
    recall = store.recall
    assert recall["target_met_on_tuning_queries"] is True
    assert recall["recall_at_10"] >= 0.95
    assert 1 <= recall["nprobe"] <= 200 and recall["ef_search"] < 4096
    store.close()
    reopened = open_store(spec)  # the tuned pair is what a later search uses
    params = reopened.describe()["parameters"]
    assert (params["nprobe"], params["ef_search"]) == (recall["nprobe"], recall["ef_search"])
    assert params["index"] == "IVF_HNSW_SQ"


def test_lancedb_refusal_advises_a_way_out_that_exists(tmp_path, monkeypatch):
    search_indexes_at_every_size(monkeypatch)  # 3,000 rows: the index answers
    vectors = partitioned()
    ids = [f"d{i}" for i in range(len(vectors))]
    spec = f"lancedb:{tmp_path}/db/docs"
    store = open_store(spec, dimension=32, index_type="IVF_HNSW_SQ", nlist=400)
    store.add(ids, vectors)
    with pytest.raises(StoreError, match=r"IVF_HNSW_SQ measured recall@10 0\.\d+") as info:
        store.optimize()
    message = str(info.value)
    assert "use IVF_HNSW_SQ" not in message  # not the index it just refused
    assert "--target-recall 0.99" in message and "nprobe" in message
    assert store.describe()["parameters"]["index"] == "exact scan"
    store.close()
    advised = open_store(
        spec, dimension=32, index_type="IVF_HNSW_SQ", nlist=400, target_recall=0.99
    )
    advised.optimize()  # the advice works: no refusal
    assert advised.recall["recall_at_10"] >= 0.95
    advised.close()


def test_chroma_raises_ef_search_itself_below_its_warning_line(tmp_path):
    """A measurement below the warning line is not only reported: the store raises
    ef_search until its own measurement clears the line, and keeps that value."""
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(2000, 64)) * np.exp(rng.normal(0, 0.5, size=(2000, 1)))
    spec = f"chroma:{tmp_path}/db/docs"
    store = open_store(spec, dimension=64, ef_search=16, hnsw_m=4)
    store.add([f"d{i}" for i in range(2000)], vectors.astype(np.float32))
    store.optimize()
    recall = store.recall
    assert recall["raised_from"]["ef_search"] == 16
    assert recall["raised_from"]["recall_at_10"] < 0.95 <= recall["recall_at_10"]
    assert recall["ef_search"] > 16 and store.ef_search == recall["ef_search"]
    store.close()
