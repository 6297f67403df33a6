"""One writer rule for every embedded store, tried with real processes.

Two or three ``magretrieve index`` runs started at once into one folder store, and a
``magretrieve serve`` with writes on beside an ``index`` run, on every embedded backend:
each run either finishes or is refused with one line naming the process that holds the
store; afterwards every document is there once (``count()`` equals the distinct ids, every
id reads back) and re-running the refused command completes the store. Searching a store
while another process writes it keeps working where the engine allows readers (the folder
writer lock of faiss/scann/memory/chroma/lancedb); Milvus Lite, embedded Qdrant and Qdrant
Edge open a store in one process at a time, and say so alike.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from magretrieve.stores import open_store
from tests.support.exports import tiny_export_dir
from tests.support.server import KEY, start_server

pytestmark = pytest.mark.integration

#: Store spec of each embedded backend under a folder.
SPECS = {
    "faiss": "faiss:{d}/store",
    "scann": "scann:{d}/store",
    "memory": "memory:{d}/store",
    "chroma": "chroma:{d}/db/docs",
    "lancedb": "lancedb:{d}/db/docs",
    "qdrant-edge": "qdrant-edge:{d}/store",
    "qdrant-local": "qdrant-local:{d}/db/docs",
    "milvus": "milvus:{d}/lite.db/docs",
}
#: Extras each backend needs (a missing one fails the test: the test venv has them all).
MODULES = {"scann": "scann", "chroma": "chromadb", "lancedb": "lancedb", "milvus": "milvus_lite"}
#: Backends whose engine lets a process search while another one writes.
READ_BESIDE_WRITER = {"faiss", "scann", "memory", "chroma", "lancedb"}
#: Documents of the concurrent runs: enough, in batches of 8, for three runs to overlap.
N = 1000
REFUSAL = re.compile(r"another (writer|process) holds this store \(pid \d+")


@pytest.fixture(scope="module")
def export(tmp_path_factory, tiny_model_dir) -> Path:
    return tiny_export_dir(tmp_path_factory, tiny_model_dir)


def corpus(path: Path, ids: range, prefix: str = "doc") -> list[str]:
    with path.open("w") as fh:
        for i in ids:
            text = f"topic {i % 17} words {i} statin wing flow {i * 7 % 31}"
            fh.write(json.dumps({"_id": f"{prefix}{i}", "title": f"T{i}", "text": text}) + "\n")
    return [f"{prefix}{i}" for i in ids]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "magretrieve", *args]


def env() -> dict[str, str]:
    out = dict(os.environ)
    out["MAGRETRIEVE_ONNX_THREADS"] = "1"
    out.pop("MAGRETRIEVE_API_KEY", None)
    return out


def index_cmd(export: Path, docs: Path, spec: str) -> list[str]:
    return cli(
        "index", str(export), str(docs), "--store", spec, "--batch-size", "8", "--no-progress"
    )


def finished_or_refused(proc: subprocess.CompletedProcess | subprocess.Popen, err: str) -> bool:
    """True when the run finished; a refusal must be one line naming the holder."""
    if proc.returncode == 0:
        return True
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == 1 and REFUSAL.search(err), err[-3000:]
    assert len(lines) == 1, err[-3000:]
    return False


def check_whole(spec: str, expected: list[str]) -> None:
    """Every expected id stored once, readable, and ``count()`` telling the truth."""
    store = open_store(spec)
    try:
        ids = list(store.iter_ids())
        assert len(ids) == len(set(ids)), "an id is stored twice"
        assert sorted(ids) == sorted(expected)
        assert store.count() == len(expected)
        records = store.get(expected)
        assert all(r is not None for r in records)
        hits = store.search(records[0].vector, 5, with_vectors=False)[0]
        assert len(hits) == 5 and len({h.id for h in hits}) == 5
    finally:
        store.close()


def need(backend: str) -> None:
    module = MODULES.get(backend)
    if module is not None:
        assert importlib.util.find_spec(module) is not None, f"{backend}: {module} missing"


@pytest.mark.parametrize("backend", list(SPECS))
def test_concurrent_index_runs_lose_nothing_and_duplicate_nothing(export, tmp_path, backend):
    need(backend)
    spec = SPECS[backend].format(d=tmp_path)
    ids = corpus(tmp_path / "c.jsonl", range(N))
    procs = [
        subprocess.Popen(
            index_cmd(export, tmp_path / "c.jsonl", spec),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env(),
        )
        for _ in range(3)
    ]
    results = [(p, *p.communicate(timeout=600)) for p in procs]
    finished = [finished_or_refused(p, err) for p, _, err in results]
    assert any(finished), [err[-500:] for _, _, err in results]
    check_whole(spec, ids)
    # a refused run, repeated, finds everything stored
    again = subprocess.run(
        index_cmd(export, tmp_path / "c.jsonl", spec), capture_output=True, text=True, env=env()
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"0 added, {N} already stored, {N} in store" in again.stdout
    check_whole(spec, ids)


@pytest.mark.parametrize("backend", list(SPECS))
def test_a_writing_server_beside_an_index_run(export, tmp_path, backend):
    need(backend)
    spec = SPECS[backend].format(d=tmp_path)
    first = corpus(tmp_path / "a.jsonl", range(60))
    done = subprocess.run(
        index_cmd(export, tmp_path / "a.jsonl", spec), capture_output=True, text=True, env=env()
    )
    assert done.returncode == 0, done.stderr[-2000:]
    more = corpus(tmp_path / "b.jsonl", range(60, 120))
    posted = [{"_id": f"srv{i}", "text": f"posted document {i} about wing flow"} for i in range(5)]
    server = start_server(export, "--store", spec, key=KEY, log_dir=tmp_path)
    try:
        resp = server.post("/documents", {"documents": posted})
        assert resp.status_code == 200, resp.text
        refused = subprocess.run(
            index_cmd(export, tmp_path / "b.jsonl", spec), capture_output=True, text=True, env=env()
        )
        assert not finished_or_refused(refused, refused.stderr)
        if backend in READ_BESIDE_WRITER:  # searching beside a writer works
            found = subprocess.run(
                cli("search", str(export), "wing flow", "--store", spec, "-k", "3", "--json"),
                capture_output=True,
                text=True,
                env=env(),
            )
            assert found.returncode == 0, found.stderr[-2000:]
            assert len(json.loads(found.stdout)["hits"]) == 3
        info = httpx.get(server.url + "/info", headers=server.headers, timeout=30)
        assert info.status_code == 200
    finally:
        assert server.stop() == 0, server.stderr()[-3000:]
    time.sleep(0.2)
    rerun = subprocess.run(
        index_cmd(export, tmp_path / "b.jsonl", spec), capture_output=True, text=True, env=env()
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    check_whole(spec, first + more + [d["_id"] for d in posted])
