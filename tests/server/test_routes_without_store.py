"""A server started without --store says, for each store route, that it has no store."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from fastapi.testclient import TestClient

from magretrieve.server.app import create_app
from magretrieve.server.settings import ServerSettings
from magretrieve.server.state import ServerState
from magretrieve.serving.engine import EmbeddingEngine


class TinyEncoder:
    """Enough of an encoder for a state: these routes refuse before any graph runs."""

    def __init__(self) -> None:
        self.manifest = SimpleNamespace(folder=None, dimension=2)

    def session(self, side: str) -> None:
        return None

    def encode_tokenized(self, encodings, side, **_):
        return np.zeros((len(encodings), 2), dtype=np.float32)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/search", {"query": "statins"}),
        ("POST", "/documents", {"documents": [{"_id": "d1", "text": "statins"}]}),
        ("DELETE", "/documents", {"ids": ["d1"]}),
    ],
)
def test_a_store_route_names_itself_and_the_missing_store(
    method: str, path: str, body: dict
) -> None:
    settings = ServerSettings(graph_workers=1, api_key="k")  # writes on: only the store lacks
    state = ServerState(EmbeddingEngine(TinyEncoder(), settings), settings)
    with TestClient(create_app(state=state)) as client:
        response = client.request(method, path, json=body, headers={"Authorization": "Bearer k"})
    assert response.status_code == 404, response.text
    message = response.json()["error"]["message"]
    assert message.startswith(f"{method} {path}: this server has no store")
    assert "--store SPEC" in message and "\n" not in message
