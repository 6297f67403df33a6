"""Every way a client names the side, in process (Starlette's test client over ``create_app``).

The side comes from the route (``/query/...``, ``/document/...``), the model id (``ID:query``,
``ID:document``, listed at ``GET /v1/models``) or a body field (``input_type``, TEI's
``prompt_name``, Cohere's ``search_query``/``search_document``); none is ever guessed, and two
places that disagree are a 422. Vectors are compared with ``OnnxEncoder`` on the same tiny
qnorm export (unit queries, documents with their norm). The real client packages against a
real server process are in tests/server/test_serve_clients.py.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.support.server import KEY, LONG, TEXTS, assert_clean_error

HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def client(export_dir):
    from fastapi.testclient import TestClient

    from magretrieve.server import create_app

    with TestClient(create_app(export_dir, api_key=KEY), headers=HEADERS) as c:
        yield c


@pytest.fixture(scope="module")
def named_client(export_dir):
    """A server started with a model id of its own (``--model-id``)."""
    from fastapi.testclient import TestClient

    from magretrieve.server import create_app
    from magretrieve.server.settings import ServerSettings

    settings = ServerSettings(api_key=KEY, model_id="acme/minilm-qnorm")
    with TestClient(create_app(export_dir, settings=settings), headers=HEADERS) as c:
        yield c


@pytest.fixture(scope="module")
def encoder(export_dir):
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    return OnnxEncoder.load(export_dir, threads=1)


@pytest.fixture(scope="module")
def expected(encoder):
    """The reference vectors of TEXTS per side; documents keep their (differing) norms."""
    out = {"query": encoder.encode_queries(TEXTS), "document": encoder.encode_documents(TEXTS)}
    assert np.allclose(np.linalg.norm(out["query"], axis=1), 1.0, atol=1e-5)
    assert not np.allclose(np.linalg.norm(out["document"], axis=1), 1.0, atol=1e-2)
    return out


def vectors(resp) -> np.ndarray:
    """The vectors of an OpenAI, TEI or Cohere answer."""
    assert resp.status_code == 200, resp.text
    body = resp.json()
    if isinstance(body, list):  # TEI
        return np.array(body, dtype=np.float32)
    if "data" in body:  # OpenAI
        rows = [d["embedding"] for d in body["data"]]
        if rows and isinstance(rows[0], str):
            return np.stack([np.frombuffer(base64.b64decode(r), "<f4") for r in rows])
        return np.array(rows, dtype=np.float32)
    emb = body["embeddings"]  # Cohere
    return np.array(emb["float"] if isinstance(emb, dict) else emb, dtype=np.float32)


def assert_side(resp, expected, side: str) -> None:
    got = vectors(resp)
    assert np.abs(got - expected[side]).max() <= 1e-6, side


# ----------------------------------------------------------------------------- model ids


def test_models_lists_one_id_per_side_named_after_the_export_folder(client, export_dir) -> None:
    resp = client.get("/v1/models")
    assert resp.status_code == 200
    body = resp.json()
    name = export_dir.name  # "export": the folder the serve command names
    assert body["object"] == "list"
    assert [(m["id"], m["input_type"], m["object"]) for m in body["data"]] == [
        (f"{name}:query", "query", "model"),
        (f"{name}:document", "document", "model"),
    ]
    assert all(m["dimension"] == 32 and isinstance(m["created"], int) for m in body["data"])
    assert client.get("/info").json()["model_id"] == name
    one = client.get(f"/v1/models/{name}:document").json()
    assert one["id"] == f"{name}:document" and one["input_type"] == "document"
    assert_clean_error(client.get("/v1/models/gpt-4o"), 404, "'gpt-4o' is not served here")
    assert_clean_error(client.get(f"/v1/models/{name}"), 404, "names no side")
    assert client.get("/v1/models", headers={"Authorization": "Bearer nope"}).status_code == 401


def test_model_id_option_names_the_served_ids(named_client, expected) -> None:
    ids = [m["id"] for m in named_client.get("/v1/models").json()["data"]]
    assert ids == ["acme/minilm-qnorm:query", "acme/minilm-qnorm:document"]
    resp = named_client.post(
        "/v1/embeddings", json={"model": "acme/minilm-qnorm:document", "input": TEXTS}
    )
    assert_side(resp, expected, "document")
    assert resp.json()["model"] == "acme/minilm-qnorm:document"
    assert named_client.get("/v1/models/acme/minilm-qnorm:query").json()["input_type"] == "query"
    assert_clean_error(
        named_client.post("/v1/embeddings", json={"model": "export:query", "input": "x"}),
        404,
        "'export:query' is not served here",
        "'acme/minilm-qnorm:query'",
    )


@pytest.mark.parametrize("bad", ["", "two words", "x:query", "tab\there", "y:document", "z" * 201])
def test_a_model_id_that_cannot_be_served_is_refused(bad) -> None:
    from magretrieve.core.errors import ConfigError
    from magretrieve.server.settings import ServerSettings

    with pytest.raises(ConfigError, match="model id"):
        ServerSettings(model_id=bad)


def test_a_bad_model_id_flag_is_one_line(export_dir) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "magretrieve", "serve", str(export_dir), "--model-id", "m:query"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "must not end in :query or :document" in lines[0], proc.stderr


def test_the_model_id_names_the_side(client, expected, export_dir) -> None:
    name = export_dir.name
    for side in ("query", "document"):
        resp = client.post("/v1/embeddings", json={"model": f"{name}:{side}", "input": TEXTS})
        assert_side(resp, expected, side)
        assert resp.json()["input_type"] == side and resp.json()["model"] == f"{name}:{side}"
    # the model's side and input_type agreeing (either spelling) is fine
    agree = {"model": f"{name}:query", "input": TEXTS, "input_type": "search_query"}
    assert_side(client.post("/v1/embeddings", json=agree), expected, "query")
    # the bare id and an input_type: the body names the side
    bare = {"model": name, "input": TEXTS, "input_type": "document"}
    assert_side(client.post("/v1/embeddings", json=bare), expected, "document")
    # no model at all: the answer names the side's id
    plain = client.post("/v1/embeddings", json={"input": "x", "input_type": "query"})
    assert plain.json()["model"] == f"{name}:query"


def test_no_side_or_two_sides_is_a_422(client, export_dir) -> None:
    name = export_dir.name
    for body in ({"input": "x"}, {"input": "x", "model": name}):
        message = assert_clean_error(
            client.post("/v1/embeddings", json=body), 422, "input_type is required"
        )
        for way in (f"'{name}:query'", "/query/v1/embeddings", "GET /v1/models", "guessed"):
            assert way in message
    clash = {"model": f"{name}:query", "input": "x", "input_type": "document"}
    assert_clean_error(
        client.post("/v1/embeddings", json=clash),
        422,
        f"model '{name}:query' and input_type 'document' name different sides",
    )


def test_an_unknown_model_is_a_404_as_openai_answers(client, export_dir) -> None:
    name = export_dir.name
    for model in ("text-embedding-3-small", f"{name}:passage", f"{name}-query", "magretrieve"):
        assert_clean_error(
            client.post(
                "/v1/embeddings", json={"model": model, "input": "x", "input_type": "query"}
            ),
            404,
            "is not served here",
            f"'{name}:query'",
            "GET /v1/models",
        )
    # a lone surrogate in the model name: still a JSON answer, the name escaped
    resp = client.post(
        "/v1/embeddings",
        content=b'{"input": "x", "input_type": "query", "model": "m\\ud800"}',
        headers={"content-type": "application/json"},
    )
    assert_clean_error(resp, 404, "'m\\\\ud800' is not served here")


# ----------------------------------------------------------------------------- routes per side


@pytest.mark.parametrize(
    "path",
    [
        "/query/v1/embeddings",
        "/document/v1/embeddings",
        "/query/embeddings",
        "/document/embeddings",
    ],
)
def test_openai_routes_per_side(client, expected, export_dir, path) -> None:
    side = path.split("/")[1]
    other = "document" if side == "query" else "query"
    for fmt in ("float", "base64"):
        resp = client.post(path, json={"input": TEXTS, "encoding_format": fmt})
        assert_side(resp, expected, side)
        assert resp.json()["input_type"] == side
    # the same side named again is fine; another side is a 422 naming both places
    same = {"input": TEXTS, "input_type": side, "model": f"{export_dir.name}:{side}"}
    assert_side(client.post(path, json=same), expected, side)
    assert_clean_error(
        client.post(path, json={"input": "x", "input_type": other}),
        422,
        f"the route {path} and input_type '{other}' name different sides",
    )
    assert_clean_error(
        client.post(path, json={"input": "x", "model": f"{export_dir.name}:{other}"}),
        422,
        "name different sides",
    )
    assert_clean_error(client.post(path, json={"input": "x", "model": "gpt"}), 404, "not served")


@pytest.mark.parametrize("path", ["/query/embed", "/document/embed", "/query", "/document"])
def test_tei_routes_per_side(client, expected, path) -> None:
    side = path.split("/")[1]
    other = "document" if side == "query" else "query"
    assert_side(client.post(path, json={"inputs": TEXTS}), expected, side)
    assert_side(client.post(path, json={"inputs": TEXTS, "prompt_name": side}), expected, side)
    assert_clean_error(
        client.post(path, json={"inputs": "x", "prompt_name": other}),
        422,
        f"the route {path} and prompt_name '{other}' name different sides",
    )


def test_tei_aliases_of_the_root_and_embeddings(client, expected) -> None:
    """TEI serves POST / as /embed and /embeddings as /v1/embeddings."""
    for side in ("query", "document"):
        root = client.post("/", json={"inputs": TEXTS, "prompt_name": side})
        assert_side(root, expected, side)
        assert_side(
            client.post("/embeddings", json={"input": TEXTS, "input_type": side}), expected, side
        )
    assert_clean_error(
        client.post("/embeddings", json={"input": "x"}), 422, "input_type is required"
    )


def test_the_embed_422_names_prompt_name(client) -> None:
    for path in ("/embed", "/"):
        message = assert_clean_error(
            client.post(path, json={"inputs": ["x"]}),
            422,
            "prompt_name (TEI's field) or input_type is required",
        )
        assert "/query/embed" in message and "guessed" in message
    both = {"inputs": "x", "prompt_name": "query", "input_type": "document"}
    assert_clean_error(client.post("/embed", json=both), 422, "name different sides")


# ----------------------------------------------------------------------------- Cohere


@pytest.mark.parametrize("version", [1, 2])
def test_cohere_embed_names_the_side_per_call(client, expected, version) -> None:
    path = f"/v{version}/embed"
    for input_type, side in (("search_query", "query"), ("search_document", "document")):
        resp = client.post(
            path, json={"texts": TEXTS, "input_type": input_type, "embedding_types": ["float"]}
        )
        assert_side(resp, expected, side)
        body = resp.json()
        assert body["response_type"] == "embeddings_by_type"
        assert set(body["embeddings"]) == {"float"}
        assert body["texts"] == TEXTS and body["input_type"] == side
        assert body["meta"]["api_version"]["version"] == str(version)
        assert body["meta"]["billed_units"]["input_tokens"] > len(TEXTS)
        assert body["truncated"] == [False] * len(TEXTS) and len(body["id"]) == 36


def test_cohere_v1_without_embedding_types_answers_a_list_of_vectors(client, expected) -> None:
    resp = client.post("/v1/embed", json={"texts": TEXTS, "input_type": "search_document"})
    assert resp.json()["response_type"] == "embeddings_floats"
    assert isinstance(resp.json()["embeddings"], list)
    assert_side(resp, expected, "document")
    v2 = client.post("/v2/embed", json={"texts": TEXTS, "input_type": "search_document"})
    assert v2.json()["response_type"] == "embeddings_by_type"
    assert_side(v2, expected, "document")


def test_cohere_truncate_and_the_model_side(client, encoder, export_dir) -> None:
    texts = ["short", LONG]
    for truncate in (None, "END"):  # END is Cohere's default: cut at the side's max length
        body = {"texts": texts, "input_type": "search_document"}
        if truncate:
            body["truncate"] = truncate
        resp = client.post("/v1/embed", json=body)
        assert resp.json()["truncated"] == [False, True]
        assert np.abs(vectors(resp) - encoder.encode_documents(texts)).max() <= 1e-6
    assert_clean_error(
        client.post(
            "/v1/embed", json={"texts": texts, "input_type": "search_query", "truncate": "NONE"}
        ),
        413,
        "texts #1",
    )
    # the model may carry the side too, and then input_type may be left out
    name = export_dir.name
    by_model = client.post("/v2/embed", json={"texts": ["x y"], "model": f"{name}:query"})
    assert np.abs(vectors(by_model) - encoder.encode_queries(["x y"])).max() <= 1e-6
    assert_clean_error(
        client.post(
            "/v1/embed",
            json={"texts": ["x"], "model": f"{name}:query", "input_type": "search_document"},
        ),
        422,
        "name different sides",
    )
    assert_clean_error(
        client.post("/v1/embed", json={"texts": ["x"], "model": "embed-english-v3.0"}),
        404,
        "not served here",
    )


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/embed", {"texts": ["x"]}, 422, "input_type is required: 'search_query'"),
        ("/v1/embed", {"texts": ["x"], "input_type": "classification"}, 422, "names no side"),
        ("/v1/embed", {"texts": ["x"], "input_type": "clustering"}, 422, "names no side"),
        (
            "/v1/embed",
            {"texts": ["x"], "input_type": "search_query", "embedding_types": ["float", "int8"]},
            422,
            "embedding_types 'int8' is refused",
        ),
        (
            "/v2/embed",
            {"texts": ["x"], "input_type": "search_query", "embedding_types": []},
            422,
            "embedding_types is empty",
        ),
        (
            "/v1/embed",
            {"texts": ["x"], "input_type": "search_query", "truncate": "START"},
            422,
            "truncate START is refused",
        ),
        (
            "/v1/embed",
            {"texts": ["x"], "input_type": "search_query", "truncate": "MIDDLE"},
            422,
            "truncate",
        ),
        ("/v1/embed", {"input_type": "search_query"}, 422, "texts is required"),
        (
            "/v1/embed",
            {"images": ["data:image/png;base64,AA=="], "input_type": "search_query"},
            422,
            "images is refused",
        ),
        (
            "/v2/embed",
            {"inputs": [{"content": []}], "input_type": "search_query"},
            422,
            "inputs is refused",
        ),
        (
            "/v2/embed",
            {"texts": ["x"], "input_type": "search_query", "output_dimension": 256},
            422,
            "output_dimension is refused",
        ),
        (
            "/v2/embed",
            {"texts": ["x"], "input_type": "search_query", "max_tokens": 16},
            422,
            "max_tokens is refused",
        ),
        (
            "/v1/embed",
            {"texts": ["x"], "input_type": "search_query", "output_dimension": 256},
            422,
            "output_dimension",  # not a v1 field
        ),
        ("/v1/embed", {"texts": [], "input_type": "search_query"}, 422, "texts is empty"),
    ],
)
def test_cohere_refusals(client, path, body, status, needle) -> None:
    assert_clean_error(client.post(path, json=body), status, needle)


def test_cohere_nulls_and_priority_are_accepted(client, expected) -> None:
    """What the SDK sends for unset fields (langchain-cohere sends truncate: null)."""
    body = {
        "texts": TEXTS,
        "model": None,
        "input_type": "search_query",
        "embedding_types": None,
        "truncate": None,
        "images": None,
        "inputs": None,
        "max_tokens": None,
        "output_dimension": None,
        "priority": 0,
    }
    assert_side(client.post("/v2/embed", json=body), expected, "query")


# ----------------------------------------------------------------------------- Voyage, token ids


def test_voyage_fields_are_accepted_or_refused_like_ours(client, encoder, expected) -> None:
    voyage = {
        "input": TEXTS,
        "input_type": "document",
        "truncation": True,
        "output_dtype": None,
        "output_dimension": None,
        "encoding_format": "base64",
    }
    assert_side(client.post("/v1/embeddings", json=voyage), expected, "document")
    assert_side(
        client.post("/v1/embeddings", json={**voyage, "output_dtype": "float"}),
        expected,
        "document",
    )
    long = {"input": ["x", LONG], "input_type": "query"}
    cut = client.post("/v1/embeddings", json={**long, "truncation": True}).json()["data"]
    assert [d["truncated"] for d in cut] == [False, True]
    assert_clean_error(
        client.post("/v1/embeddings", json={**long, "truncation": False}), 413, "input #1"
    )
    assert_clean_error(
        client.post("/v1/embeddings", json={**long, "truncation": False, "truncate": True}),
        422,
        "truncate true and truncation false disagree",
    )
    for dtype in ("int8", "ubinary"):
        assert_clean_error(
            client.post("/v1/embeddings", json={**voyage, "output_dtype": dtype}),
            422,
            f"output_dtype '{dtype}' is refused",
        )
    assert_clean_error(
        client.post("/v1/embeddings", json={**voyage, "output_dimension": 256}),
        422,
        "output_dimension is refused",
    )
    assert_clean_error(
        client.post("/v1/embeddings", json={**voyage, "dimensions": 16}),
        422,
        "dimensions is refused",
    )


@pytest.mark.parametrize(
    ("path", "field"),
    [("/v1/embeddings", "input"), ("/query/v1/embeddings", "input"), ("/embed", "inputs")],
)
@pytest.mark.parametrize("ids", [[101, 2023, 102], [[101, 2023], [102]]])
def test_token_ids_are_told_to_send_text(client, path, field, ids) -> None:
    body = {field: ids, "input_type": "query"}
    if path.startswith("/query"):
        del body["input_type"]
    assert_clean_error(
        client.post(path, json=body), 422, "send text", "check_embedding_ctx_length=False"
    )


# ----------------------------------------------------------------------------- limits


def test_max_inputs_defaults_to_openais_2048_within_the_body_limit(client, encoder) -> None:
    from magretrieve.server.settings import ServerSettings

    s = ServerSettings()
    assert s.max_inputs == 2048
    # 2,048 texts of 8 KB each (a long abstract) fit in the default body limit
    body = json.dumps({"input": ["w" * 8000] * 2048, "input_type": "document"})
    assert len(body.encode()) < s.max_body_bytes
    texts = [f"{TEXTS[i % 4]} {i}" for i in range(2048)]
    resp = client.post("/v1/embeddings", json={"input": texts, "input_type": "document"})
    got = vectors(resp)
    assert got.shape == (2048, 32)
    assert np.abs(got - encoder.encode_documents(texts)).max() <= 1e-5
    assert_clean_error(
        client.post("/v1/embeddings", json={"input": ["x"] * 2049, "input_type": "query"}),
        413,
        "2049 texts",
        "at most 2048",
    )
    assert_clean_error(
        client.post("/v1/embed", json={"texts": ["x"] * 2049, "input_type": "search_query"}),
        413,
        "texts holds 2049 texts",
    )


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/query",
        "/document",
        "/embeddings",
        "/query/v1/embeddings",
        "/document/embed",
        "/v1/embed",
        "/v2/embed",
    ],
)
def test_every_new_encoding_route_needs_the_key(client, path) -> None:
    """Each alias encodes, so each is behind the key like /v1/embeddings (POST / included,
    whatever a GET of / may show)."""
    resp = client.post(path, json={"inputs": "x"}, headers={"Authorization": "Bearer nope"})
    assert_clean_error(resp, 401, "API key")
