"""The server's one error table: each typed error answers its status with a one-line JSON
message that holds no server path and no writer's pid, through the real app's handlers."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from fastapi.testclient import TestClient

from magretrieve.core.errors import ConfigError, StoreError, WriterLockHeld
from magretrieve.server.app import create_app
from magretrieve.server.errors import (
    STATUS,
    InvalidRequest,
    NotServed,
    RequestTooLarge,
    WritesOff,
    status_of,
)
from magretrieve.server.settings import ServerSettings
from magretrieve.server.state import ServerState
from magretrieve.serving.engine import EmbeddingEngine
from magretrieve.serving.errors import (
    Draining,
    InputTooLarge,
    InvalidInput,
    QueueFull,
)

EXPORT = "/data/models/secret-export"


class TinyEncoder:
    """Enough of an encoder for a state: no graph is ever run by these tests."""

    def __init__(self) -> None:
        self.manifest = SimpleNamespace(folder=None, dimension=2)

    def session(self, side: str) -> None:
        return None

    def tokenize(self, texts, side):
        return [SimpleNamespace(ids=[1], overflowing=[]) for _ in texts]

    def encode_tokenized(self, encodings, side, **_):
        return np.zeros((len(encodings), 2), dtype=np.float32)


#: (error raised by a route, status, words the message must hold)
CASES = [
    (NotServed("model 'x' is not served here"), 404, "not served"),
    (WritesOff("write endpoints are off"), 403, "write endpoints are off"),
    (
        WriterLockHeld(f"{EXPORT}/store: another writer holds this store (pid 4242: index)"),
        409,
        "another process holds the store's writer lock",
    ),
    (InputTooLarge("input #0 has 40000 characters"), 413, "40000 characters"),
    (RequestTooLarge("ids holds 5000 ids"), 413, "5000 ids"),
    (QueueFull("the encoder queue is full (512 requests waiting)"), 503, "queue is full"),
    (Draining("the server is shutting down"), 503, "shutting down"),
    (InvalidRequest("normalize: true is refused for documents"), 422, "normalize"),
    (InvalidInput("input #1 is empty"), 422, "is empty"),
    (StoreError(f"{EXPORT}/store: store metric cosine\nis not inner product"), 422, "metric"),
    (ConfigError("k must be at least 1"), 422, "at least 1"),
]


@pytest.fixture(scope="module")
def client():
    encoder = TinyEncoder()
    engine = EmbeddingEngine(encoder, ServerSettings(graph_workers=1))
    state = ServerState(engine, ServerSettings(graph_workers=1, retry_after_s=7), store_spec=EXPORT)
    app = create_app(state=state)
    errors = {str(n): exc for n, (exc, _, _) in enumerate(CASES)}

    @app.get("/raise/{n}")
    async def raise_it(n: str) -> None:
        if n == "bug":
            raise RuntimeError(f"{EXPORT} broke")
        raise errors[n]

    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize("n", range(len(CASES)), ids=[type(c[0]).__name__ for c in CASES])
def test_each_error_answers_its_status_in_one_line(client, n: int) -> None:
    exc, status, words = CASES[n]
    r = client.get(f"/raise/{n}")
    assert r.status_code == status == status_of(exc)
    body = r.json()
    assert set(body) == {"error"} and body["error"]["code"] == status
    message = body["error"]["message"]
    assert words in message
    assert "\n" not in message and EXPORT not in message and "/data/" not in message
    assert "4242" not in message and "Traceback" not in message
    if status == 503:
        assert r.headers["retry-after"] == "7"
    else:
        assert "retry-after" not in r.headers


def test_a_path_in_a_message_is_named_not_shown(client) -> None:
    store_error = next(i for i, c in enumerate(CASES) if type(c[0]) is StoreError)
    message = client.get(f"/raise/{store_error}").json()["error"]["message"]
    assert message == "the store/store: store metric cosine is not inner product"


def test_a_message_written_from_the_request_keeps_its_routes() -> None:
    from magretrieve.server.errors import public_message

    def scrub(message: str) -> str:
        return message.replace("/", "<path>")

    refused = InvalidRequest("input_type is required; or use /query/v1/embeddings")
    assert public_message(refused, scrub) == str(refused)  # not scrubbed: no server state
    assert public_message(StoreError("/data/ix: corrupt"), scrub) == "<path>data<path>ix: corrupt"


def test_a_bug_is_a_500_naming_only_its_type(client) -> None:
    r = client.get("/raise/bug")
    assert r.status_code == 500
    assert json.loads(r.content)["error"]["message"] == (
        "internal error (RuntimeError); see the server log"
    )


def test_the_table_maps_classes_not_messages() -> None:
    # a store error that reads like the writer lock's is still an ordinary 422
    assert status_of(StoreError("another writer holds this store")) == 422
    assert status_of(WriterLockHeld("x")) == 409
    assert status_of(ValueError("another writer")) == 500
    assert set(STATUS.values()) == {403, 404, 409, 413, 422, 503}
