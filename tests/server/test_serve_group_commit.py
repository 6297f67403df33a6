"""``POST /documents`` while the store is being saved: searches answer, writes share one save.

Eight write requests, the first held inside its save until the other seven wait for their
turn: ``/search`` answers meanwhile, the seven are acknowledged after one more save (two in
all), and every acknowledged id is in the store when it is opened again.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.exports import tiny_export_dir
from tests.support.server import KEY

HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tiny_model_dir) -> Path:
    return tiny_export_dir(tmp_path_factory, tiny_model_dir)


def test_writes_during_a_save_share_the_next_and_survive_a_restart(tmp_path, export_dir):
    from fastapi.testclient import TestClient

    from magretrieve.server import create_app
    from magretrieve.stores import open_store

    spec = f"faiss:{tmp_path / 'ix'}"
    with TestClient(create_app(export_dir, store=spec, api_key=KEY)) as client:
        seed = {"_id": "seed", "text": "statins lower cholesterol"}
        assert client.post("/documents", json={"documents": [seed]}, headers=HEADERS).is_success
        retriever = client.app.state.magretrieve.holder.retriever
        saves_before = retriever.persists
        real = retriever.store.persist
        started, release = threading.Event(), threading.Event()
        saves: list[int] = []

        def persist() -> None:
            saves.append(len(saves))
            started.set()
            assert release.wait(60)
            real()

        retriever.store.persist = persist
        answers: dict[int, Any] = {}

        def post(n: int) -> None:
            docs = [{"_id": f"r{n}-{j}", "text": f"aspirin dose {n} {j}"} for j in range(4)]
            answers[n] = client.post("/documents", json={"documents": docs}, headers=HEADERS)

        first = threading.Thread(target=post, args=(0,))
        first.start()
        rest = [threading.Thread(target=post, args=(n,)) for n in range(1, 8)]
        try:
            assert started.wait(60)
            for t in rest:
                t.start()
            deadline = time.monotonic() + 60
            while retriever._entered - retriever._left < 7:  # seven wait for their turn
                assert time.monotonic() < deadline, (retriever._entered, retriever._left)
                time.sleep(0.01)
            found = client.post(  # the save still runs
                "/search", json={"query": "statins", "k": 3}, headers=HEADERS
            )
            assert found.status_code == 200 and not release.is_set()
            assert found.json()["hits"][0]["id"] in ("seed", "r0-0", "r0-1", "r0-2", "r0-3")
        finally:
            release.set()
        for t in (first, *rest):
            t.join(60)
            assert not t.is_alive()
        assert sorted(answers) == list(range(8))
        assert all(a.status_code == 200 for a in answers.values()), answers
        acknowledged = [i for a in answers.values() for i in a.json()["ids"]]
        assert len(acknowledged) == 32
        assert len(saves) == 2 and retriever.persists - saves_before == 2
    with open_store(spec) as restarted:
        assert restarted.existing(acknowledged) == set(acknowledged)
        assert restarted.count() == 33
