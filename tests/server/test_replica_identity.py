"""A replica follows the store folder it serves even when the folder is deleted and built again.

A folder store has an identity, a random id written when the folder is created (state file,
generation marker). A new folder counts its generations from the start, so a replica can hold
the very generation the rebuilt folder reaches, or a higher one; the id tells the two folders
apart, and the replica loads the new one once and follows it from there. Each case is a real
store of every folder backend the server follows (``faiss``, ``memory``, ``scann``, embedded
``chroma`` and ``lancedb``); the last test runs a real ``magretrieve serve``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.support.exports import tiny_export_dir
from tests.support.server import KEY, start_server

HEADERS = {"Authorization": f"Bearer {KEY}"}
#: embedded database engines run in the test process: the integration lane (conftest.py)
EMBEDDED = [pytest.param(k, marks=pytest.mark.integration) for k in ("chroma", "lancedb")]
FOLDER_KINDS = ["faiss", "memory", "scann", *EMBEDDED]
WORDS = "zebra quantum lattice okapi violin harbour maple comet tundra falcon".split()


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tiny_model_dir) -> Path:
    return tiny_export_dir(tmp_path_factory, tiny_model_dir)


def app_client(export: Path, store: str):
    from fastapi.testclient import TestClient

    from magretrieve.server import create_app

    return TestClient(create_app(export, store=store, api_key=KEY))


def spec_of(kind: str, folder: Path) -> str:
    if kind == "scann":
        pytest.importorskip("scann")
    # embedded databases keep a collection in the folder
    return f"{kind}:{folder}/docs" if kind in ("chroma", "lancedb") else f"{kind}:{folder}"


def corpus(path: Path, prefix: str, n: int) -> Path:
    lines = [
        json.dumps({"_id": f"{prefix}-{i}", "text": f"{WORDS[i % 10]} {WORDS[(i * 3) % 10]} {i}"})
        for i in range(n)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def index(export: Path, spec: str, corpus_file: Path, *, process: bool) -> None:
    """``magretrieve index`` in another process, or the same indexing in this one. Embedded
    Chroma shares one engine between the opens of a folder in one process, so a folder
    rebuilt beside an open reader is written by another process, as in production."""
    if process:
        env = {k: v for k, v in os.environ.items() if k != "MAGRETRIEVE_API_KEY"}
        proc = subprocess.run(
            [sys.executable, "-m", "magretrieve", "index", str(export), str(corpus_file),
             "--store", spec],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    with Retriever.load(export, store=spec) as r:
        index_corpus(r, corpus_file, progress=False)


def searcher(client):
    def ids() -> set[str]:
        body = {"query": "zebra quantum lattice", "k": 100}
        resp = client.post("/search", json=body, headers=HEADERS)
        assert resp.status_code == 200, resp.text
        return {h["id"] for h in resp.json()["hits"]}

    return ids


def expected(prefix: str, n: int) -> set[str]:
    return {f"{prefix}-{i}" for i in range(n)}


@pytest.mark.parametrize("kind", FOLDER_KINDS)
def test_a_replica_follows_a_folder_deleted_and_built_again_at_the_same_generation(
    tmp_path, export_dir, kind
):
    folder = tmp_path / "store"
    spec = spec_of(kind, folder)
    embedded = kind in ("chroma", "lancedb")
    index(export_dir, spec, corpus(tmp_path / "old.jsonl", "old", 12), process=embedded)
    with app_client(export_dir, spec) as reader:
        holder = reader.app.state.magretrieve.holder
        ids = searcher(reader)
        held = holder.retriever.store.version
        assert ids() == expected("old", 12) and held is not None
        shutil.rmtree(folder)
        index(export_dir, spec, corpus(tmp_path / "new.jsonl", "new", 12), process=embedded)
        on_disk = holder.retriever.store.disk_version()
        # the case reported: the same generation, another folder
        assert on_disk.generation == held.generation and on_disk.store_id != held.store_id
        assert ids() == expected("new", 12) and holder.reloads == 1
        assert holder.retriever.store.version == on_disk
        reader_now = holder.retriever
        for _ in range(3):  # followed from there: no reload while nothing changes
            assert ids() == expected("new", 12)
        assert holder.reloads == 1 and holder.retriever is reader_now
        info = reader.get("/info").json()["store"]
        assert info["count"] == 12 and info["generation"] == on_disk.generation


@pytest.mark.parametrize("kind", ["faiss", "memory", "scann"])
def test_a_replica_ahead_of_a_rebuilt_folder_switches_once_and_stays(tmp_path, export_dir, kind):
    """Replica at generation 3, folder rebuilt to generation 1: one reload, then the new store
    answers every request without being reopened (it used to be reopened at every request
    and thrown away until the new folder's count passed 3)."""
    folder = tmp_path / "store"
    spec = spec_of(kind, folder)
    for n in range(3):
        index(export_dir, spec, corpus(tmp_path / f"old{n}.jsonl", f"old{n}", 4), process=False)
    with app_client(export_dir, spec) as reader:
        holder = reader.app.state.magretrieve.holder
        ids = searcher(reader)
        assert holder.generation == 3
        assert ids() == expected("old0", 4) | expected("old1", 4) | expected("old2", 4)
        shutil.rmtree(folder)
        index(export_dir, spec, corpus(tmp_path / "new.jsonl", "new", 5), process=False)
        assert holder.retriever.store.disk_generation() == 1
        assert ids() == expected("new", 5)
        assert holder.reloads == 1 and holder.generation == 1
        serving = holder.retriever
        opened: list[object] = []
        reopen = holder._reopen
        holder._reopen = lambda: opened.append(1) or reopen()  # count every reopen
        for _ in range(5):
            assert ids() == expected("new", 5)
        assert opened == [] and holder.reloads == 1 and holder.retriever is serving


@pytest.mark.parametrize("kind", ["faiss", "memory", "scann"])
def test_a_store_written_before_ids_opens_is_followed_and_a_rebuild_replaces_it(
    tmp_path, export_dir, kind
):
    """A state file without ``store_id`` (written by an older magretrieve) reads as the one
    legacy identity: it opens, its new generations are followed, and a folder built again in
    its place (a real id) is another store."""
    from magretrieve.stores.base import LEGACY_STORE_ID

    folder = tmp_path / "store"
    spec = spec_of(kind, folder)
    index(export_dir, spec, corpus(tmp_path / "old.jsonl", "old", 4), process=False)
    (state_file,) = folder.glob("*_store.json")
    state = json.loads(state_file.read_text())
    assert len(state.pop("store_id")) == 32  # a random hex id, written at creation
    state_file.write_text(json.dumps(state))
    with app_client(export_dir, spec) as reader:
        holder = reader.app.state.magretrieve.holder
        ids = searcher(reader)
        assert ids() == expected("old", 4)
        assert holder.retriever.store.version == (LEGACY_STORE_ID, 1)
        # another process writes into the legacy folder: it stays legacy, and is followed
        index(export_dir, spec, corpus(tmp_path / "more.jsonl", "more", 3), process=False)
        assert holder.retriever.store.disk_version() == (LEGACY_STORE_ID, 2)
        assert ids() == expected("old", 4) | expected("more", 3) and holder.reloads == 1
        shutil.rmtree(folder)
        index(export_dir, spec, corpus(tmp_path / "new.jsonl", "new", 2), process=False)
        assert holder.retriever.store.disk_version().store_id != LEGACY_STORE_ID
        assert ids() == expected("new", 2) and holder.reloads == 2
        assert ids() == expected("new", 2) and holder.reloads == 2


def test_the_generation_marker_carries_the_folder_id(tmp_path):
    """Embedded Chroma and LanceDB count writes in a marker file: its first write mints the
    folder's id, later writes keep it; a legacy marker (a number alone) stays legacy."""
    from magretrieve.stores import _generation
    from magretrieve.stores.base import LEGACY_STORE_ID

    assert _generation.read_version(tmp_path) == (LEGACY_STORE_ID, 0)
    first = _generation.bump(tmp_path)
    assert first.generation == 1 and first.store_id != LEGACY_STORE_ID
    assert _generation.bump(tmp_path) == (first.store_id, 2) == _generation.read_version(tmp_path)
    assert _generation.read(tmp_path) == 2
    rebuilt = tmp_path / "again"
    rebuilt.mkdir()
    assert _generation.bump(rebuilt).store_id not in (first.store_id, LEGACY_STORE_ID)
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / _generation.MARKER).write_text("3\n")
    assert _generation.read_version(legacy) == (LEGACY_STORE_ID, 3)
    assert _generation.bump(legacy) == (LEGACY_STORE_ID, 4)
    assert (legacy / _generation.MARKER).read_text() == "4\n"


# ----------------------------------------------------------------------------- a real server


@pytest.mark.integration
def test_a_serving_replica_answers_the_folder_built_again_under_it(tmp_path, export_dir):
    """The case reported: ``index`` 300 documents into ``faiss:idx``, ``serve`` it, delete the
    folder and ``index`` 40 others into it; the running server answers the 40 at its next
    requests (both folders are at generation 1)."""
    folder = tmp_path / "idx"
    spec = f"faiss:{folder}"
    index(export_dir, spec, corpus(tmp_path / "old.jsonl", "old", 300), process=True)
    srv = start_server(export_dir, "--store", spec, key=None, log_dir=tmp_path)
    try:

        def ids() -> set[str]:
            resp = httpx.post(srv.url + "/search", json={"query": "zebra okapi", "k": 400})
            assert resp.status_code == 200, resp.text
            return {h["id"] for h in resp.json()["hits"]}

        assert ids() == expected("old", 300)
        before = httpx.get(srv.url + "/info").json()["store"]
        shutil.rmtree(folder)
        index(export_dir, spec, corpus(tmp_path / "new.jsonl", "new", 40), process=True)
        deadline = time.monotonic() + 10
        while (found := ids()) != expected("new", 40) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert found == expected("new", 40)
        after = httpx.get(srv.url + "/info").json()["store"]
        assert after["generation"] == before["generation"] == 1 and after["count"] == 40
    finally:
        code = srv.stop()
    assert code == 0 and "Traceback" not in srv.stderr(), srv.stderr()[-3000:]
