"""``magretrieve serve`` as a real uvicorn process on a free 127.0.0.1 port, over a tiny export.

Clients as users run them: the official ``openai`` client, TEI-shaped requests over ``httpx``,
and the ``curl`` lines of docs/serve.md exactly as printed. Every server here runs with torch and
transformers blocked in ``sys.modules`` (torch-free). Vectors are compared with ``OnnxEncoder``
in-process; search answers with ``magretrieve search --json``.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support.server import (
    KEY,
    LONG,
    SERVE,
    TEXTS,
    Server,
    assert_clean_error,
    free_port,
    start_server,
    store_copy,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store_template(tmp_path_factory, export_dir, tiny_beir_dir) -> Path:
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    folder = tmp_path_factory.mktemp("serve-store") / "ix"
    with Retriever.load(export_dir, store=f"faiss:{folder}") as r:
        index_corpus(r, tiny_beir_dir / "corpus.jsonl", progress=False)
    return folder


@pytest.fixture(scope="module")
def encoder(export_dir):
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    return OnnxEncoder.load(export_dir, threads=1)


@pytest.fixture(scope="module")
def server(tmp_path_factory, export_dir, store_template):
    """The main server: a store, and a key (so the write endpoints are on)."""
    tmp = tmp_path_factory.mktemp("serve-main")
    store = store_copy(store_template, tmp, "ix")
    srv = start_server(export_dir, "--store", f"faiss:{store}", key=KEY, log_dir=tmp)
    srv.store = store  # type: ignore[attr-defined]
    yield srv
    assert srv.stop() == 0, srv.stderr()[-3000:]
    assert "Traceback" not in srv.stderr()


@pytest.fixture(scope="module")
def open_server(tmp_path_factory, export_dir, store_template):
    """No key: everything readable without auth, the write endpoints off."""
    tmp = tmp_path_factory.mktemp("serve-open")
    store = store_copy(store_template, tmp, "ix")
    srv = start_server(export_dir, "--store", f"faiss:{store}", key=None, log_dir=tmp)
    yield srv
    assert srv.stop() == 0, srv.stderr()[-3000:]


def openai_client(server: Server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=server.key, max_retries=0)


# ----------------------------------------------------------------------------- embeddings


@pytest.mark.integration
@pytest.mark.parametrize("encoding_format", [None, "float", "base64"])
def test_openai_client_documents_keep_magnitude(server, encoder, encoding_format) -> None:
    client = openai_client(server)
    resp = client.embeddings.create(
        model="export:document",
        input=TEXTS,
        extra_body={"input_type": "document"},
        **({"encoding_format": encoding_format} if encoding_format else {}),
    )  # no format: the client asks for base64 and decodes it itself
    expected = encoder.encode_documents(TEXTS)
    if encoding_format == "base64":
        got = np.stack([np.frombuffer(base64.b64decode(d.embedding), "<f4") for d in resp.data])
    else:
        got = np.array([d.embedding for d in resp.data], dtype=np.float32)
    assert np.abs(got - expected).max() <= 1e-6
    norms = np.array([d.model_extra["norm"] for d in resp.data])
    np.testing.assert_allclose(norms, np.linalg.norm(expected, axis=1), rtol=1e-6)
    assert len(set(np.round(norms, 3))) > 1  # magnitudes differ: nothing was normalized
    assert not np.allclose(norms, 1.0)
    assert resp.model == "export:document"
    tokens = sum(len(e.ids) for e in encoder.tokenize(TEXTS, "document"))
    assert resp.usage.prompt_tokens == resp.usage.total_tokens == tokens
    assert [d.index for d in resp.data] == [0, 1, 2, 3]
    assert [d.model_extra["truncated"] for d in resp.data] == [False] * 4


@pytest.mark.integration
def test_openai_client_queries_come_from_the_query_graph(server, encoder) -> None:
    client = openai_client(server)
    resp = client.embeddings.create(
        model="export", input=TEXTS[0], extra_body={"input_type": "search_query"}
    )
    expected = encoder.encode_queries([TEXTS[0]])[0]
    assert np.abs(np.array(resp.data[0].embedding) - expected).max() <= 1e-6
    # qnorm: queries are unit vectors, documents are not, and the two graphs differ
    assert resp.data[0].model_extra["norm"] == pytest.approx(1.0, abs=1e-5)
    doc = encoder.encode_documents([TEXTS[0]])[0]
    assert not np.allclose(doc / np.linalg.norm(doc), expected, atol=1e-3) or np.linalg.norm(
        doc
    ) != pytest.approx(1.0)


@pytest.mark.integration
def test_openai_client_sees_side_errors_as_exceptions(server) -> None:
    import openai

    client = openai_client(server)
    with pytest.raises(openai.UnprocessableEntityError, match="input_type is required"):
        client.embeddings.create(model="export", input="x")
    with pytest.raises(openai.UnprocessableEntityError, match="dimensions is refused"):
        client.embeddings.create(model="export:query", input="x", dimensions=8)
    with pytest.raises(openai.NotFoundError, match="'text-embedding-3-small' is not served"):
        client.embeddings.create(model="text-embedding-3-small", input="x")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(
            base_url=server.url + "/v1", api_key="wrong", max_retries=0
        ).embeddings.create(model="export:query", input="x")


@pytest.mark.integration
def test_base64_is_little_endian_float32(server, encoder) -> None:
    resp = server.post(
        "/v1/embeddings",
        {"input": "lung cancer", "input_type": "document", "encoding_format": "base64"},
    )
    raw = base64.b64decode(resp.json()["data"][0]["embedding"])
    vec = np.frombuffer(raw, dtype="<f4")
    assert np.array_equal(vec, encoder.encode_documents(["lung cancer"])[0])


@pytest.mark.integration
def test_tei_embed_shape_and_side_rules(server, encoder) -> None:
    resp = server.post("/embed", {"inputs": TEXTS, "input_type": "document"})
    assert resp.status_code == 200
    got = np.array(resp.json(), dtype=np.float32)
    assert np.abs(got - encoder.encode_documents(TEXTS)).max() <= 1e-6
    one = server.post("/embed", {"inputs": "lung cancer", "prompt_name": "query"}).json()
    assert np.abs(np.array(one[0]) - encoder.encode_queries(["lung cancer"])[0]).max() <= 1e-6
    # normalize: true is refused for documents, allowed for queries (unit vectors)
    assert_clean_error(
        server.post("/embed", {"inputs": ["x"], "input_type": "document", "normalize": True}),
        422,
        "refused for documents",
    )
    q = server.post("/embed", {"inputs": ["x y"], "input_type": "query", "normalize": True}).json()
    assert np.linalg.norm(q[0]) == pytest.approx(1.0, abs=1e-6)
    # normalize false on documents is what they are anyway
    same = server.post("/embed", {"inputs": TEXTS, "input_type": "document", "normalize": False})
    assert np.abs(np.array(same.json(), dtype=np.float32) - got).max() <= 1e-6
    assert_clean_error(
        server.post("/embed", {"inputs": ["x"]}), 422, "prompt_name (TEI's field) or input_type"
    )
    both = {"inputs": "x", "prompt_name": "query", "input_type": "document"}
    assert_clean_error(server.post("/embed", both), 422, "name different sides")
    same_side = {"inputs": "x", "prompt_name": "search_query", "input_type": "query"}
    assert server.post("/embed", same_side).status_code == 200


@pytest.mark.integration
def test_truncation_is_reported_per_item_or_refused(server, encoder) -> None:
    texts = ["short one", LONG, "another"]
    # TEI's default truncate=false: refused, naming the item
    assert_clean_error(
        server.post("/embed", {"inputs": texts, "input_type": "document"}),
        413,
        "inputs #1",
        "max_document_length=128",
    )
    resp = server.post("/embed", {"inputs": texts, "input_type": "document", "truncate": True})
    assert resp.status_code == 200 and resp.headers["x-truncated-inputs"] == "1"
    assert np.abs(np.array(resp.json()) - encoder.encode_documents(texts)).max() <= 1e-6
    data = server.post("/v1/embeddings", {"input": texts, "input_type": "query"}).json()["data"]
    assert [d["truncated"] for d in data] == [False, True, False]
    assert_clean_error(
        server.post("/v1/embeddings", {"input": texts, "input_type": "query", "truncate": False}),
        413,
        "input #1",
        "max_query_length=128",
    )


@pytest.mark.integration
def test_limits_and_malformed_requests(server) -> None:
    assert_clean_error(
        server.post("/v1/embeddings", {"input": ["x"] * 2049, "input_type": "query"}),
        413,
        "2049 texts",
        "at most 2048",
    )
    assert_clean_error(
        server.post("/v1/embeddings", {"input": ["ok", "y" * 40_000], "input_type": "query"}),
        413,
        "input #1",
        "40000 characters",
    )
    assert_clean_error(
        server.post("/v1/embeddings", {"input": ["ok", "  "], "input_type": "query"}),
        422,
        "input #1 is empty",
    )
    for invisible in ("\u200b", "\ufeff\u200b", "\u0001", "\u0301\u0301", " \u2028 "):
        assert_clean_error(  # zero-width, BOM, controls, lone combining marks: no tokens
            server.post("/v1/embeddings", {"input": ["ok", invisible], "input_type": "document"}),
            422,
            "input #1 is empty or only whitespace and invisible characters",
        )
    assert_clean_error(server.post("/v1/embeddings", {"input": [], "input_type": "query"}), 422)
    assert_clean_error(server.post("/v1/embeddings", {"input": [1, 2], "input_type": "query"}), 422)
    assert_clean_error(
        server.post("/v1/embeddings", {"input": "x", "input_type": "passage"}), 422, "input_type"
    )
    assert_clean_error(
        server.post("/v1/embeddings", {"input": "x", "input_type": "query", "normalise": True}),
        422,
        "normalise",
    )
    bad_json = httpx.post(
        server.url + "/v1/embeddings",
        content=b'{"input": ',
        headers={**server.headers, "content-type": "application/json"},
    )
    assert_clean_error(bad_json, 422, "invalid request")
    lone = httpx.post(
        server.url + "/v1/embeddings",
        content=b'{"input": "bad \\ud800 text", "input_type": "query"}',
        headers={**server.headers, "content-type": "application/json"},
    )
    assert lone.status_code == 422 and "Traceback" not in lone.text
    assert_clean_error(httpx.get(server.url + "/nowhere", headers=server.headers), 404, "/nowhere")
    assert_clean_error(httpx.get(server.url + "/v1/embeddings", headers=server.headers), 405)


# ----------------------------------------------------------------------------- auth


@pytest.mark.integration
def test_auth_with_a_key(server) -> None:
    body = {"input": "x", "input_type": "query"}
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Basic {KEY}"}):
        resp = httpx.post(server.url + "/v1/embeddings", json=body, headers=headers)
        assert_clean_error(resp, 401, "API key")
        assert resp.headers["www-authenticate"] == "Bearer"
    # the probes, the manifest and the API docs with their schema (no data) are open to read
    for path in ("/health", "/ready", "/info", "/metrics", "/docs", "/openapi.json"):
        assert httpx.get(server.url + path).status_code == 200, path
    # the schema says which routes need the key, so Swagger UI's Authorize can send it
    schema = httpx.get(server.url + "/openapi.json").json()
    assert schema["paths"]["/v1/embeddings"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in schema["paths"]["/health"]["get"]


@pytest.mark.integration
def test_without_a_key_reads_are_open_and_writes_are_off(open_server) -> None:
    ok = httpx.post(open_server.url + "/v1/embeddings", json={"input": "x", "input_type": "query"})
    assert ok.status_code == 200
    assert httpx.post(open_server.url + "/search", json={"query": "statin"}).status_code == 200
    assert_clean_error(
        httpx.post(open_server.url + "/documents", json={"documents": [{"_id": "a", "text": "t"}]}),
        403,
        "write endpoints are off",
    )
    assert_clean_error(
        httpx.request("DELETE", open_server.url + "/documents", json={"ids": ["d00"]}), 403
    )
    assert httpx.get(open_server.url + "/info").json()["writes_enabled"] is False


# ----------------------------------------------------------------------------- info, metrics


@pytest.mark.integration
def test_info_is_the_manifest(server, export_dir) -> None:
    from magretrieve.core.manifest import Manifest

    m = Manifest.load(export_dir)
    info = httpx.get(server.url + "/info").json()
    for key in ("mode", "gamma_q", "gamma_d", "dimension", "max_query_length", "model_fingerprint"):
        assert info[key] == getattr(m, key), key
    assert info["document_contract"] == "magnitude_keeping"
    assert info["query_prefix"] == m.query_prefix and info["document_prefix"] == m.document_prefix
    assert info["store"]["kind"] == "faiss" and info["writes_enabled"] is True
    assert info["recall_watch"]["sample"] == 0.01  # the default share of /search re-run exactly
    assert "/tmp" not in json.dumps(info)


@pytest.mark.integration
def test_live_recall_is_checked_in_the_background(tmp_path, export_dir, store_template) -> None:
    """Every /search query re-run exactly (--recall-sample 1): an exact store reads 1.0 in the
    gauge and in /info; a filtered search is not sampled (its exact answer differs); the
    check runs within the CPU share it was given."""
    store = store_copy(store_template, tmp_path, "ix")
    srv = start_server(
        export_dir,
        "--store",
        f"faiss:{store}",
        "--recall-sample",
        "1",
        "--recall-cpu-share",
        "0.5",
        key=None,
        log_dir=tmp_path,
    )
    try:
        for q in ("lung cancer", "heart", "protein", "statins dose"):
            assert srv.post("/search", {"query": q, "k": 5}).status_code == 200
        assert srv.post("/search", {"query": "heart", "filter": {"x": 1}}).status_code == 200
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            watch = httpx.get(srv.url + "/info").json()["recall_watch"]
            if watch["checked"] >= 4:
                break
            time.sleep(0.1)
        assert watch["checked"] == 4 and watch["recall_at_10"] == 1.0 and watch["sample"] == 1.0
        assert watch["cpu_share"] == 0.5
        text = httpx.get(srv.url + "/metrics").text
        assert "magretrieve_recall_at_10 1.0" in text
        assert "magretrieve_recall_checked_queries_total 4.0" in text
    finally:
        assert srv.stop() == 0, srv.stderr()[-3000:]


@pytest.mark.integration
def test_metrics_count_requests_batches_and_tokens(server) -> None:
    server.post("/v1/embeddings", {"input": ["lung cancer", "heart"], "input_type": "query"})
    text = httpx.get(server.url + "/metrics").text
    assert re.search(
        r'magretrieve_requests_total\{method="POST",route="/v1/embeddings",status="200"\} [1-9]',
        text,
    )
    assert 'magretrieve_request_seconds_bucket{le="0.001",route="/v1/embeddings"}' in text
    assert re.search(r'magretrieve_batch_texts_count\{side="query"\} [1-9]', text)
    assert re.search(r'magretrieve_tokens_total\{side="query"\} [1-9]', text)
    assert "magretrieve_queue_depth" in text


# ----------------------------------------------------------------------------- store routes


def cli_search(export_dir: Path, store: Path, query: str, k: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, "search", str(export_dir), "--store", f"faiss:{store}",
         query, "-k", str(k), "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def assert_same_result(got: dict, want: dict) -> None:
    assert got["query"] == want["query"] and got["truncated"] == want["truncated"]
    assert [h["id"] for h in got["hits"]] == [h["id"] for h in want["hits"]]
    for a, b in zip(got["hits"], want["hits"], strict=True):
        assert set(a) == set(b)
        for key in ("score", "doc_norm", "cosine", "query_norm", "multiplier", "offset"):
            assert a[key] == pytest.approx(b[key], abs=1e-5), key
        assert a["rank"] == b["rank"] and a["payload"] == b["payload"]


@pytest.mark.integration
def test_search_answers_what_search_json_prints(server, export_dir) -> None:
    resp = server.post("/search", {"query": "statin mortality", "k": 4})
    assert resp.status_code == 200
    want = cli_search(export_dir, server.store, "statin mortality", 4)
    assert_same_result(resp.json(), want)
    hits = resp.json()["hits"]
    for h in hits:  # the decomposition holds
        assert h["score"] == pytest.approx(h["query_norm"] * h["doc_norm"] * h["cosine"], rel=1e-5)
    many = server.post("/search", {"queries": ["statin mortality", "wing flow"], "k": 4}).json()
    assert isinstance(many, list) and len(many) == 2
    assert_same_result(many[0], want)
    assert many[1]["query"] == "wing flow"


@pytest.mark.integration
def test_search_filter_and_errors(server) -> None:
    hits = server.post(
        "/search", {"query": "statin", "k": 3, "filter": {"title": "wing flow"}}
    ).json()["hits"]
    assert hits and all(h["payload"]["title"] == "wing flow" for h in hits)
    assert [h["rank"] for h in hits] == list(range(1, len(hits) + 1))
    assert_clean_error(server.post("/search", {"k": 3}), 422, "exactly one of query")
    assert_clean_error(server.post("/search", {"query": "x", "queries": ["y"]}), 422)
    assert_clean_error(server.post("/search", {"query": "x", "k": 0}), 422, "k")
    assert_clean_error(server.post("/search", {"query": "x", "k": 5000}), 422, "max_k=1000")


@pytest.mark.integration
def test_filter_values_match_as_json_values(server) -> None:
    """true is not 1, and null matches a field holding null, not a missing field."""
    docs = [
        {"_id": "f-true", "text": "filter probe text", "flag": True, "note": None},
        {"_id": "f-one", "text": "filter probe text", "flag": 1},
    ]
    assert server.post("/documents", {"documents": docs}).is_success
    try:

        def ids(wanted: dict) -> set[str]:
            body = {"query": "filter probe text", "k": 50, "filter": wanted}
            return {h["id"] for h in server.post("/search", body).json()["hits"]}

        assert ids({"flag": True}) == {"f-true"}
        assert ids({"flag": 1}) == {"f-one"}
        assert ids({"note": None}) == {"f-true"}
    finally:
        httpx.request(
            "DELETE",
            server.url + "/documents",
            json={"ids": ["f-true", "f-one"]},
            headers=server.headers,
        )


@pytest.mark.integration
def test_upsert_then_search_then_delete(server, encoder) -> None:
    doc = {"_id": "new-1", "title": "aspirin", "text": "aspirin dose and liver", "year": 2020}
    resp = server.post("/documents", {"documents": [doc]})
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"upserted": 1, "ids": ["new-1"], "truncated": []}
    hits = server.post("/search", {"query": "aspirin dose liver", "k": 20}).json()["hits"]
    mine = [h for h in hits if h["id"] == "new-1"]
    assert mine and mine[0]["payload"] == {
        "title": "aspirin",
        "text": "aspirin dose and liver",
        "year": 2020,
    }
    from magretrieve.data.readers import Document

    full = Document("new-1", doc["text"], doc["title"]).full_text
    expected = encoder.encode_documents([full])
    assert mine[0]["doc_norm"] == pytest.approx(float(np.linalg.norm(expected)), rel=1e-5)
    gone = httpx.request(
        "DELETE",
        server.url + "/documents",
        json={"ids": ["new-1", "never"]},
        headers=server.headers,
    )
    assert gone.json() == {"deleted": 1}
    hits = server.post("/search", {"query": "aspirin dose liver", "k": 30}).json()["hits"]
    assert "new-1" not in [h["id"] for h in hits]


@pytest.mark.integration
def test_a_bad_document_writes_nothing_of_its_request(server) -> None:
    before = httpx.get(server.url + "/info").json()["store"]["count"]
    docs = [{"_id": "ok-1", "text": "fine text"}, {"_id": "bad", "title": "", "text": "   "}]
    assert_clean_error(server.post("/documents", {"documents": docs}), 422, "'bad'")
    dup = [{"_id": "x1", "text": "a"}, {"_id": "x1", "text": "b"}]
    assert_clean_error(server.post("/documents", {"documents": dup}), 422, "'x1'", "twice")
    assert_clean_error(server.post("/documents", {"documents": [{"text": "no id"}]}), 422, "_id")
    lone = httpx.post(  # a lone surrogate in a payload value: no store can keep it
        server.url + "/documents",
        content=b'{"documents": [{"_id": "s1", "text": "fine", "note": "a\\udc80"}]}',
        headers={**server.headers, "content-type": "application/json"},
    )
    assert_clean_error(lone, 422, "'s1'", "field 'note'", "lone surrogate")
    assert httpx.get(server.url + "/info").json()["store"]["count"] == before


@pytest.mark.integration
def test_a_model_name_with_a_lone_surrogate_is_still_json(server) -> None:
    resp = httpx.post(
        server.url + "/v1/embeddings",
        content=b'{"input": "x", "input_type": "query", "model": "m\\ud800"}',
        headers={**server.headers, "content-type": "application/json"},
    )
    assert_clean_error(resp, 404, "'m\\\\ud800' is not served here")


@pytest.mark.integration
def test_another_writer_is_a_409_without_paths(tmp_path, export_dir, store_template) -> None:
    from magretrieve.stores._writer_lock import WriterLock

    store = store_copy(store_template, tmp_path, "ix")
    srv = start_server(export_dir, "--store", f"faiss:{store}", key=KEY, log_dir=tmp_path)
    lock = WriterLock(store, "test")
    lock.acquire()
    try:
        resp = srv.post("/documents", {"documents": [{"_id": "z", "text": "zz"}]})
        message = assert_clean_error(resp, 409, "writer lock")
        assert str(store) not in message
    finally:
        lock.release()
        assert srv.stop() == 0


# ----------------------------------------------------------------------------- docs/serve.md curl


def doc_curl_lines() -> list[str]:
    text = (ROOT / "docs" / "serve.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    return [line for block in blocks for line in block.splitlines() if line.startswith("curl ")]


@pytest.mark.integration
def test_curl_lines_of_the_docs_run_as_printed(tmp_path, export_dir, store_template) -> None:
    lines = doc_curl_lines()
    assert len(lines) >= 6
    store = store_copy(store_template, tmp_path, "ix")
    srv = start_server(export_dir, "--store", f"faiss:{store}", key=KEY, log_dir=tmp_path)
    outputs = []
    try:
        env = {**os.environ, "MAGRETRIEVE_API_KEY": KEY}
        for line in lines:
            command = line.replace("127.0.0.1:8080", f"127.0.0.1:{srv.port}")
            proc = subprocess.run(
                ["bash", "-c", command], capture_output=True, text=True, env=env, timeout=60
            )
            assert proc.returncode == 0, (shlex.split(line)[:3], proc.stderr)
            outputs.append(proc.stdout)
    finally:
        assert srv.stop() == 0
    by_route = dict(
        zip([re.search(r"8080(/[\w/]+)", x).group(1) for x in lines], outputs, strict=True)
    )
    assert json.loads(by_route["/info"])["dimension"] == 32
    data = json.loads(by_route["/v1/embeddings"])["data"]
    assert data[0]["norm"] > 0 and len(data[0]["embedding"]) == 32
    assert len(json.loads(by_route["/embed"])[0]) == 32
    models = [m["id"] for m in json.loads(by_route["/v1/models"])["data"]]
    assert models == ["export:query", "export:document"]  # the export folder's name
    routed = json.loads(by_route["/document/v1/embeddings"])
    assert routed["input_type"] == "document" and routed["data"][0]["norm"] == pytest.approx(
        data[0]["norm"], rel=1e-6
    )
    cohere = json.loads(by_route["/v1/embed"])
    assert cohere["input_type"] == "query" and len(cohere["embeddings"][0]) == 32
    hits = json.loads(by_route["/search"])["hits"]
    assert [h["id"] for h in hits] == ["d1"]  # the only document of 2019
    assert json.loads(outputs[lines.index(next(x for x in lines if "DELETE" in x))]) == {
        "deleted": 1
    }
    assert "magretrieve_requests_total" in by_route["/metrics"]


# ----------------------------------------------------------------------------- serving behaviour


@pytest.mark.integration
def test_full_queue_answers_503_with_retry_after(tmp_path, export_dir) -> None:
    srv = start_server(export_dir, "--no-batching", "--max-queue", "1", key=None, log_dir=tmp_path)
    body = {"input": [LONG] * 200, "input_type": "document"}

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(
                *(client.post(srv.url + "/v1/embeddings", json=body) for _ in range(12))
            )

    try:
        statuses: list[int] = []
        for _ in range(5):
            responses = asyncio.run(burst())
            statuses = [r.status_code for r in responses]
            if 503 in statuses:
                break
        assert set(statuses) <= {200, 503} and 503 in statuses and 200 in statuses
        busy = next(r for r in responses if r.status_code == 503)
        assert busy.headers["retry-after"] == "1"
        assert_clean_error(busy, 503, "queue is full")
        assert re.search(r"magretrieve_rejected_total [1-9]", httpx.get(srv.url + "/metrics").text)
    finally:
        assert srv.stop() == 0


@pytest.mark.integration
def test_dynamic_batching_merges_concurrent_requests(tmp_path, export_dir, encoder) -> None:
    """Sixteen concurrent queries of one length (the batcher keeps lengths far apart in
    separate batches, so equal lengths isolate the merging) run in fewer than eight batches."""
    srv = start_server(export_dir, "--max-wait-ms", "300", key=None, log_dir=tmp_path)
    texts = [f"{TEXTS[0]} number {i}" for i in range(10, 26)]
    assert len({len(e.ids) for e in encoder.tokenize(texts, "query")}) == 1

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(srv.url + "/embed", json={"inputs": t, "input_type": "query"})
                    for t in texts
                )
            )

    try:
        responses = asyncio.run(burst())
        got = np.array([r.json()[0] for r in responses], dtype=np.float32)
        assert np.abs(got - encoder.encode_queries(texts)).max() <= 1e-6
        metrics = httpx.get(srv.url + "/metrics").text
        count = float(
            re.search(r'magretrieve_batch_requests_count\{side="query"\} (\S+)', metrics).group(1)
        )
        total = float(
            re.search(r'magretrieve_batch_requests_sum\{side="query"\} (\S+)', metrics).group(1)
        )
        assert total == len(texts) and count < len(texts) / 2  # merged: fewer batches than requests
    finally:
        assert srv.stop() == 0


@pytest.mark.integration
def test_graph_workers_answer_what_the_encoder_computes(tmp_path, export_dir, encoder) -> None:
    """Two graph workers of one thread each: concurrent requests of both sides get the
    in-process vectors (a session run from two threads at once computes the same)."""
    srv = start_server(
        export_dir, "--graph-workers", "2", "--threads", "2", key=None, log_dir=tmp_path
    )
    texts = [f"{t} number {i}" for i, t in enumerate(TEXTS * 3)]

    async def burst(side: str) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            return await asyncio.gather(
                *(
                    client.post(srv.url + "/embed", json={"inputs": t, "input_type": side})
                    for t in texts
                )
            )

    try:
        for side, expected in (
            ("query", encoder.encode_queries(texts)),
            ("document", encoder.encode_documents(texts)),
        ):
            responses = asyncio.run(burst(side))
            assert [r.status_code for r in responses] == [200] * len(texts)
            got = np.array([r.json()[0] for r in responses], dtype=np.float32)
            assert np.abs(got - expected).max() <= 1e-6
    finally:
        assert srv.stop() == 0


@pytest.mark.integration
def test_sigterm_drains_in_flight_requests(tmp_path, export_dir, store_template, encoder) -> None:
    store = store_copy(store_template, tmp_path, "ix")
    srv = start_server(
        export_dir, "--store", f"faiss:{store}", "--max-wait-ms", "1500", key=KEY, log_dir=tmp_path
    )
    results: dict[str, httpx.Response] = {}

    def call(name: str, path: str, body: dict) -> None:
        results[name] = srv.post(path, body)

    threads = [
        threading.Thread(
            target=call,
            args=("embed", "/v1/embeddings", {"input": TEXTS, "input_type": "document"}),
        ),
        threading.Thread(
            target=call,
            args=("write", "/documents", {"documents": [{"_id": "late", "text": "aspirin dose"}]}),
        ),
    ]
    for t in threads:
        t.start()
    time.sleep(0.5)  # both wait in the batcher (max wait 1.5 s) when SIGTERM arrives
    code = srv.stop()
    for t in threads:
        t.join(30)
    assert code == 0, srv.stderr()[-3000:]
    assert results["embed"].status_code == 200
    got = np.array([d["embedding"] for d in results["embed"].json()["data"]], dtype=np.float32)
    assert np.abs(got - encoder.encode_documents(TEXTS)).max() <= 1e-6
    assert results["write"].status_code == 200
    from magretrieve.stores import open_store

    reopened = open_store(f"faiss:{store}")
    try:
        assert reopened.existing(["late"]) == {"late"}
    finally:
        reopened.close()


# ----------------------------------------------------------------------------- torch-free


def test_server_package_imports_nothing_of_training() -> None:
    forbidden = (
        "magretrieve.train",
        "magretrieve.export",
        "magretrieve.diagnose",
        "torch",
        "transformers",
    )
    for path in [
        *(ROOT / "magretrieve" / "server").glob("*.py"),
        ROOT / "magretrieve/cli/cmd_serve.py",
    ]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"
    code = (
        "import sys\n"
        "for name in ('torch', 'transformers'): sys.modules[name] = None\n"
        "import magretrieve.server.app, magretrieve.cli.cmd_serve\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_cli_errors_are_one_line(tmp_path, export_dir) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, "serve", str(tmp_path / "missing")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("Error: ") and len(proc.stderr.strip().splitlines()) == 1
    for key, says in ((" ", "API key is empty"), (" padded\n", "begins or ends with whitespace")):
        proc = subprocess.run(
            [sys.executable, "-c", SERVE, "serve", str(export_dir), "--port", str(free_port())],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "MAGRETRIEVE_API_KEY": key},
        )  # fmt: skip
        assert proc.returncode == 1 and says in proc.stderr and "padded" not in proc.stderr


def test_a_port_in_use_or_a_bad_host_is_one_line_before_the_banner(tmp_path, export_dir) -> None:
    """The socket is bound before the export is loaded and the banner printed."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        for args, says in (
            (["--port", str(port)], f"--port {port}: cannot listen there (Address already in use)"),
            (["--host", "no such host"], "--host 'no such host': not an address"),
        ):
            proc = subprocess.run(
                [sys.executable, "-c", SERVE, "serve", str(export_dir), *args],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            lines = proc.stderr.strip().splitlines()
            assert proc.returncode == 1 and len(lines) == 1, proc.stderr
            assert lines[0].startswith("Error: ") and says in lines[0]
            assert "serving" not in proc.stderr and "Traceback" not in proc.stderr
    finally:
        taken.close()


@pytest.mark.integration
def test_the_banner_masks_the_store_password(tmp_path, export_dir, pg_uri) -> None:
    """The store spec is printed at start with its password masked."""
    from urllib.parse import urlsplit, urlunsplit

    password = "S3cr" + uuid.uuid4().hex[:12]
    parts = urlsplit(pg_uri)  # the session's PostgreSQL trusts local users: any password works
    netloc = f"{parts.username or 'postgres'}:{password}@{parts.netloc.rpartition('@')[2]}"
    spec = f"pgvector:{urlunsplit(parts._replace(netloc=netloc))}#t_{uuid.uuid4().hex[:10]}"
    srv = start_server(export_dir, "--store", spec, key=KEY, log_dir=tmp_path)
    try:
        assert srv.post("/documents", {"documents": [{"_id": "a", "text": "statins"}]}).is_success
    finally:
        code = srv.stop()
    assert code == 0 and "serving" in srv.stderr() and "***" in srv.stderr()
    assert password not in srv.stderr()


# ----------------------------------------------------------------------------- schemathesis


@pytest.mark.integration
def test_schemathesis_finds_no_server_error_or_schema_break(
    tmp_path, export_dir, store_template
) -> None:
    store = store_copy(store_template, tmp_path, "ix")
    srv = start_server(export_dir, "--store", f"faiss:{store}", key=KEY, log_dir=tmp_path)
    try:
        proc = subprocess.run(
            [
                str(Path(sys.executable).parent / "schemathesis"), "run", srv.url + "/openapi.json",
                "--checks", "not_a_server_error,response_schema_conformance,"
                "content_type_conformance,status_code_conformance",
                "--header", f"Authorization: Bearer {KEY}",
                "--max-examples", "50", "--seed", "1", "--no-color",
                "--request-timeout", "30",
            ],
            capture_output=True, text=True, timeout=900, cwd=tmp_path,
        )  # fmt: skip
    finally:
        code = srv.stop()
    assert proc.returncode == 0, proc.stdout[-6000:]
    assert code == 0 and "Traceback" not in srv.stderr()


def test_create_app_in_process_and_the_body_limit(export_dir) -> None:
    """The Python factory, run by Starlette's test client (besides the real servers above)."""
    from fastapi.testclient import TestClient

    from magretrieve.server import create_app
    from magretrieve.server.settings import ServerSettings

    app = create_app(export_dir, settings=ServerSettings(max_body_bytes=2000), api_key=KEY)
    state = app.state.magretrieve
    assert state.settings.api_key == KEY and state.settings.max_body_bytes == 2000
    with TestClient(app) as client:
        headers = {"Authorization": f"Bearer {KEY}"}
        ok = client.post(
            "/v1/embeddings", json={"input": "x", "input_type": "query"}, headers=headers
        )
        assert ok.status_code == 200
        big = client.post(
            "/v1/embeddings", json={"input": "x" * 5000, "input_type": "query"}, headers=headers
        )
        assert_clean_error(big, 413, "the limit is 2000")

        def chunked():  # no Content-Length: counted as it arrives
            yield b'{"input": "x", "input_type": "query", "user": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}'

        streamed = client.post(
            "/v1/embeddings",
            content=chunked(),
            headers={**headers, "content-type": "application/json"},
        )
        assert_clean_error(streamed, 413, "the limit is 2000")
        assert client.get("/ready").status_code == 200
        assert client.post("/search", json={"query": "x"}, headers=headers).status_code == 404
    assert not state.engine.running and not state.ready  # the lifespan closed it


def test_merged_batches_equal_one_at_a_time_within_1e6(encoder) -> None:
    """The batcher's merging (fill floor, lengths apart) on the real graph: every request gets
    the vector it gets alone."""
    from magretrieve.server.settings import ServerSettings
    from magretrieve.serving.batcher import DynamicBatcher

    texts = [f"{t} number {i}" for i, t in enumerate(TEXTS * 3)]
    texts += ["short", "a much longer query about " + " ".join(TEXTS)]
    batches: list[int] = []

    def encode(encodings, side):
        batches.append(len(encodings))
        return encoder.encode_tokenized(encodings, side, batch_size=64)

    b = DynamicBatcher(encode, ServerSettings(max_wait_ms=200))
    b.start()

    async def go() -> list[np.ndarray]:
        return await asyncio.gather(
            *(b.submit("query", encoder.tokenize([t], "query")) for t in texts)
        )

    try:
        got = np.concatenate(asyncio.run(go()))
    finally:
        b.close()
    alone = np.concatenate([encoder.encode_queries([t], batch_size=1) for t in texts])
    assert np.abs(got - alone).max() <= 1e-6
    assert sum(batches) == len(texts) and max(batches) > 1  # some requests were merged


@pytest.mark.parametrize("spinning,expected", [(None, "1"), (True, "1"), (False, "0")])
def test_onnx_spinning_reaches_the_sessions(export_dir, spinning, expected) -> None:
    """Spinning is on by default on a server without a store (onnxruntime's own default)
    and off with ``onnx_spinning=False`` (``--no-onnx-spinning``), in both graphs'
    sessions."""
    from magretrieve.server import create_app
    from magretrieve.server.settings import ServerSettings
    from magretrieve.serving.onnx_encoder import SPINNING_KEY

    settings = ServerSettings() if spinning is None else ServerSettings(onnx_spinning=spinning)
    encoder = create_app(export_dir, settings=settings).state.magretrieve.encoder
    for side in ("query", "document"):
        options = encoder.session(side).get_session_options()
        assert options.get_session_config_entry(SPINNING_KEY) == expected
        assert options.intra_op_num_threads == encoder.threads


@pytest.mark.parametrize("spinning,expected", [(None, "0"), (True, "1")])
def test_a_server_with_a_store_does_not_spin_unless_asked(
    export_dir, tmp_path, spinning, expected
) -> None:
    """With ``--store`` the default turns spinning off (the store's searches need the cores
    the spinning threads would hold); ``--onnx-spinning`` still turns it on."""
    from magretrieve.server import create_app
    from magretrieve.server.settings import ServerSettings
    from magretrieve.serving.onnx_encoder import SPINNING_KEY

    settings = ServerSettings(api_key=KEY, onnx_spinning=spinning)
    app = create_app(export_dir, store=f"memory:{tmp_path / 's'}", settings=settings)
    encoder = app.state.magretrieve.encoder
    for side in ("query", "document"):
        options = encoder.session(side).get_session_options()
        assert options.get_session_config_entry(SPINNING_KEY) == expected


@pytest.mark.parametrize(
    "workers,threads,narrow,alone",
    [(None, 2, 1, 2), (1, 2, 2, None), (2, 1, 1, None), (2, 4, 2, 4)],
)
def test_graph_workers_share_the_threads_and_a_lone_batch_gets_them_all(
    export_dir, workers, threads, narrow, alone
) -> None:
    """Two workers by default, each on its share of the threads, plus the graphs on every
    thread for a batch that runs alone; never more workers than threads."""
    from magretrieve.server.app import open_state
    from magretrieve.server.settings import ServerSettings

    settings = ServerSettings() if workers is None else ServerSettings(graph_workers=workers)
    state = open_state(export_dir, settings=settings, threads=threads)
    assert state.encoder.threads == narrow
    assert state.settings.graph_workers == min(settings.graph_workers, threads)
    if alone is None:
        assert state.engine.all_threads_encoder is None
    else:
        assert state.engine.all_threads_encoder.threads == alone
        assert (
            state.engine.all_threads_encoder.manifest is state.encoder.manifest
        )  # the export read once
        for side in ("query", "document"):
            opts = state.engine.all_threads_encoder.session(side).get_session_options()
            assert opts.intra_op_num_threads == alone
