"""``magretrieve index`` / ``magretrieve search``: resumable indexing, tables, refusals.

The encoder is the deterministic FakeEncoder of tests/support/fake_encoder.py (substituted at the one seam,
``magretrieve.serving.retriever.load_encoder``); the real ONNX path is covered in test_retriever.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from magretrieve.stores import open_store
from tests.support.ann_data import search_indexes_at_every_size
from tests.support.cli import run
from tests.support.fake_encoder import LOAD_IN_CHILD, FakeEncoder, write_corpus


def test_index_then_rerun_skips_everything(use_fake, tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 30)
    spec = f"faiss:{tmp_path / 'ix'}"
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--batch-size", "8", "--no-progress")
    assert res.exit_code == 0, res.output
    assert "30 added, 0 already stored, 30 in store" in res.output
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--no-progress")
    assert res.exit_code == 0, res.output
    assert "0 added, 30 already stored, 30 in store" in res.output


@pytest.mark.parametrize("kind", ["faiss", "faiss-hnsw", "qdrant-local", "qdrant-edge"])
def test_search_table_and_json(use_fake, tmp_path, kind):
    corpus = write_corpus(tmp_path / "c.jsonl", 40)
    spec = {
        "faiss": f"faiss:{tmp_path / 'ix'}",
        "faiss-hnsw": f"faiss:{tmp_path / 'hx'}",
        "qdrant-local": f"qdrant-local:{tmp_path / 'q'}/docs",
        "qdrant-edge": f"qdrant-edge:{tmp_path / 'e'}",
    }[kind]
    extra = ["--faiss-index", "hnsw", "--hnsw-m", "8"] if kind == "faiss-hnsw" else []
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--no-progress", *extra)
    assert res.exit_code == 0, res.output
    res = run("search", "EXPORT", "--store", spec, "statins heart", "-k", "3")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split() == ["rank", "id", "score", "doc_norm", "cosine", "title"]
    assert len([ln for ln in lines if ln[:1].isdigit()]) == 3
    res = run("search", "EXPORT", "--store", spec, "statins", "heart", "-k", "4", "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["query"] == "statins heart"
    hits = out["hits"]
    assert [h["rank"] for h in hits] == [1, 2, 3, 4]
    for h in hits:
        assert h["score"] == pytest.approx(h["query_norm"] * h["doc_norm"] * h["cosine"], rel=1e-4)
        assert h["payload"]["title"].startswith("T")
    # the table shows the same first hit as the JSON
    assert lines[2].split()[1] == hits[0]["id"]


def test_interrupted_index_resumes_without_duplicates(use_fake, tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 50)
    spec = f"faiss:{tmp_path / 'ix'}"
    use_fake["fail_after"] = 3  # the 4th batch dies
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--batch-size", "5", "--no-progress")
    assert res.exit_code == 1 and "Aborted" in res.output  # click's answer to Ctrl-C
    partial = open_store(spec).count()
    assert partial == 15
    use_fake["fail_after"] = None
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--batch-size", "5", "--no-progress")
    assert res.exit_code == 0, res.output
    assert "35 added, 15 already stored, 50 in store" in res.output
    store = open_store(spec)
    ids = list(store.iter_ids())
    assert len(ids) == len(set(ids)) == 50


_KILL_SCRIPT = """
import time
{load_fake}
from magretrieve.stores import open_store
from magretrieve.serving.indexing import index_corpus
from magretrieve.serving.retriever import Retriever

class Slow(FakeEncoder):
    def encode_documents(self, texts, batch_size=32):
        time.sleep(0.02)
        return super().encode_documents(texts, batch_size)

r = Retriever(Slow(), open_store({spec!r}, dimension=24))
index_corpus(r, {corpus!r}, batch_size=4, checkpoint_every=8, progress=False)
print("done")
"""


@pytest.mark.parametrize("kind", ["faiss", "qdrant-edge"])
def test_sigkill_during_indexing_then_resume(tmp_path, kind):
    """SIGKILL at an arbitrary point: the resumed store equals an uninterrupted run."""
    corpus = write_corpus(tmp_path / "c.jsonl", 120)
    spec = f"{kind}:{tmp_path / 'ix'}"
    script = _KILL_SCRIPT.format(load_fake=LOAD_IN_CHILD, spec=spec, corpus=str(corpus))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    marker = tmp_path / "ix" / ("faiss_store.json" if kind == "faiss" else "magretrieve_store.json")
    deadline = time.time() + 60
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    time.sleep(0.15)  # let it get further than the first checkpoint
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "indexing finished before it could be killed"

    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    r = Retriever(FakeEncoder(), open_store(spec, dimension=24))
    before = r.store.count()
    assert 0 < before < 120
    report = index_corpus(r, corpus, batch_size=4, progress=False)
    assert report.count == 120 and report.added == 120 - before
    ids = list(r.store.iter_ids())
    assert len(ids) == len(set(ids)) == 120
    ref = Retriever(FakeEncoder(), open_store("memory:", dimension=24))
    index_corpus(ref, corpus, batch_size=50, progress=False)
    for q in ("statins heart", "wing flow lung", "vitamin"):
        got = [(h.id, round(h.score, 4)) for h in r.search(q, k=10)]
        want = [(h.id, round(h.score, 4)) for h in ref.search(q, k=10)]
        assert got == want
    r.close()


def test_model_mismatch_refused_on_the_cli(use_fake, tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 10)
    spec = f"faiss:{tmp_path / 'ix'}"
    assert run("index", "EXPORT", str(corpus), "--store", spec, "--no-progress").exit_code == 0
    use_fake["fingerprint"] = "b" * 64
    res = run("search", "EXPORT", "--store", spec, "statins")
    assert res.exit_code == 1
    assert "built by another model" in res.output and "aaaaaaaa" in res.output
    assert "bbbbbbbb" in res.output and "Traceback" not in res.output
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--no-progress")
    assert res.exit_code == 1 and "--force" in res.output
    res = run("search", "EXPORT", "--store", spec, "statins", "--force", "-k", "2")
    assert res.exit_code == 0, res.output


def test_cli_refusals_are_one_line_errors(use_fake, tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 10)
    spec = f"faiss:{tmp_path / 'ix'}"
    assert run("index", "EXPORT", str(corpus), "--store", spec, "--no-progress").exit_code == 0
    use_fake["dim"] = 32
    res = run("search", "EXPORT", "--store", spec, "statins")
    assert res.exit_code == 1 and "dimension 24" in res.output and "dimension 32" in res.output
    res = run("index", "EXPORT", str(corpus), "--store", "redis:x", "--no-progress")
    assert res.exit_code == 1 and "not understood" in res.output
    res = run("search", "EXPORT", "--store", f"faiss:{tmp_path / 'none'}", "x")
    assert res.exit_code == 1 and "no FAISS store here" in res.output
    # a corpus with a duplicate id: error names the line, the store keeps what it had
    use_fake["dim"] = 24
    bad = tmp_path / "dup.jsonl"
    bad.write_text(
        json.dumps({"_id": "n1", "text": "statins"})
        + "\n"
        + json.dumps({"_id": "n1", "text": "heart"})
        + "\n"
    )
    res = run("index", "EXPORT", str(bad), "--store", spec, "--no-progress")
    assert res.exit_code == 1 and "dup.jsonl:2: duplicate document id 'n1'" in res.output
    assert "first on line 1" in res.output and "Traceback" not in res.output
    assert open_store(spec).count() == 10


def test_index_reports_measured_ann_recall_and_tunes_to_a_target(use_fake, tmp_path, monkeypatch):
    """An ANN index states its recall@10 against exact search; --target-recall tunes efSearch."""
    search_indexes_at_every_size(monkeypatch)  # 400 documents: the index answers
    corpus = write_corpus(tmp_path / "c.jsonl", 400)
    spec = f"faiss:{tmp_path / 'hx'}"
    res = run(
        "index", "EXPORT", str(corpus), "--store", spec, "--no-progress",
        "--faiss-index", "hnsw", "--hnsw-m", "4", "--target-recall", "0.99",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "ANN recall@10" in res.output and "ef_search=" in res.output, res.output
    store = open_store(spec)
    recall = store.describe()["parameters"]["recall"]
    assert recall["target"] == 0.99 and recall["recall_at_10"] >= 0.95
    # the state file keeps it: a reopened store reports the same measurement
    assert json.loads((tmp_path / "hx" / "faiss_store.json").read_text())["recall"] == recall
    # the tuned efSearch is what the store now searches with
    assert store.parameters()["ef_search"] == recall["ef_search"]


def test_index_into_a_non_persisting_store_or_a_file_is_refused_before_encoding(use_fake, tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 10)
    use_fake["fail_after"] = 0  # any encoding would fail: the refusal must come first
    res = run("index", "EXPORT", str(corpus), "--store", "memory:", "--no-progress")
    assert res.exit_code == 1 and "keeps nothing after the command ends" in res.output
    f = tmp_path / "ix.faiss"
    f.write_text("x")
    res = run("index", "EXPORT", str(corpus), "--store", f"faiss:{f}", "--no-progress")
    assert res.exit_code == 1 and "is a file, not a folder" in res.output, res.output
    assert f.read_text() == "x"


@pytest.mark.parametrize("prefix", ["milvus", "lancedb", "chroma", "qdrant-local", "pgvector"])
def test_rows_in_an_existing_table_without_model_metadata_need_force(use_fake, tmp_path, prefix):
    """Every database store: a table or collection that existed before, holding rows but no
    magretrieve model metadata, is someone else's: indexing refuses without --force and
    writes nothing; with --force it writes and stamps it."""
    from tests.support import store_examples

    ex = store_examples.exact_example(prefix, tmp_path)
    assert ex is not None, f"{prefix}: no example (extra or pgserver missing?)"
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(3, 24)).astype(np.float32)
    if prefix == "chroma":  # made by chromadb itself (in a process of its own), the old way
        make = (
            "import chromadb, json, sys\n"
            "col = chromadb.PersistentClient(path=sys.argv[1]).create_collection(sys.argv[2], "
            "metadata={'hnsw:space': 'ip', 'team': 'billing'}, embedding_function=None)\n"
            "col.add(ids=['t1', 't2', 't3'], embeddings=json.loads(sys.argv[3]))\n"
        )
        path, name = ex.spec.removeprefix("chroma:").rsplit("/", 1)
        made = subprocess.run(
            [sys.executable, "-c", make, path, name, json.dumps(vectors.tolist())],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert made.returncode == 0, made.stderr
    else:
        with open_store(ex.spec, dimension=24, **ex.options) as theirs:  # rows, no metadata
            theirs.add(["t1", "t2", "t3"], vectors)
    corpus = write_corpus(tmp_path / "c.jsonl", 5)
    res = run("index", "EXPORT", str(corpus), "--store", ex.spec, "--no-progress")
    assert res.exit_code == 1, res.output
    assert "already holds 3 point(s) that magretrieve did not write" in res.output
    with open_store(ex.spec, **ex.options) as store:
        assert store.count() == 3 and store.read_metadata() is None
    res = run("index", "EXPORT", str(corpus), "--store", ex.spec, "--no-progress", "--force")
    assert res.exit_code == 0, res.output
    with open_store(ex.spec, **ex.options) as store:
        assert store.count() == 8 and store.read_metadata()["mode"] == "qnorm"
        if prefix == "chroma":  # the owner's own metadata is kept
            assert store.col.metadata["team"] == "billing"


def test_index_into_a_foreign_qdrant_collection_needs_force(use_fake, tmp_path):
    """A non-empty collection magretrieve did not write is neither written nor stamped."""
    from qdrant_client import QdrantClient, models

    corpus = write_corpus(tmp_path / "c.jsonl", 12)
    client = QdrantClient(path=str(tmp_path / "q"))
    client.create_collection(
        "theirs", vectors_config=models.VectorParams(size=24, distance=models.Distance.DOT)
    )
    client.upsert(
        "theirs",
        points=[models.PointStruct(id=1, vector=[0.1] * 24, payload={"doc_id": "x"})],
    )
    client.close()
    spec = f"qdrant-local:{tmp_path / 'q'}/theirs"
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--no-progress")
    assert res.exit_code == 1, res.output
    assert "already holds 1 point(s) that magretrieve did not write" in res.output
    with open_store(spec) as store:
        assert store.count() == 1 and store.read_metadata() is None  # untouched
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--no-progress", "--force")
    assert res.exit_code == 0, res.output
    with open_store(spec) as store:
        assert store.count() == 13 and store.read_metadata()["mode"] == "qnorm"
    # once stamped, re-indexing needs no --force
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--no-progress")
    assert res.exit_code == 0 and "12 already stored" in res.output, res.output


def test_index_corpus_writes_inside_one_bulk_load_that_optimize_ends(tmp_path):
    """Every write of ``index_corpus`` happens inside the store's ``bulk_load()`` (a store may
    leave its index to optimize()), and optimize() runs after the load has ended."""
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    corpus = write_corpus(tmp_path / "c.jsonl", 40)
    store = open_store("memory:", dimension=24)
    seen: list[tuple[str, bool]] = []
    add, optimize = store.add, store.optimize

    def spy_add(*args, **kwargs):
        seen.append(("add", store.bulk_loading))
        return add(*args, **kwargs)

    def spy_optimize():
        seen.append(("optimize", store.bulk_loading))
        optimize()

    store.add, store.optimize = spy_add, spy_optimize  # type: ignore[method-assign]
    report = index_corpus(Retriever(FakeEncoder(), store), corpus, batch_size=8, progress=False)
    assert report.added == 40
    assert seen[:-1] == [("add", True)] * 5 and seen[-1] == ("optimize", False)
