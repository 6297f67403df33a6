"""The server under careless and hostile clients: one test per case, each refused or bounded.

Catalogue of what a client can do to ``magretrieve serve`` and what it gets:

- numbers over HTTP are as strict as on the command line (``"k": true`` or ``"5"`` is a 422);
- a JSON body sent without ``Content-Type: application/json`` (curl's ``-d``) is a 415 that
  names the content type it was sent as and the header to send;
- ``POST /documents`` keeps the payload fields ``magretrieve index`` keeps (``id``, ``payload``);
- ``serve`` refuses impossible numbers (``--threads 0``) in one line before it listens;
- a write still running when shutdown closes the store finishes first, one arriving after is
  refused before it starts;
- idle connections and connections that send their headers a byte at a time are closed after
  ``--timeout-keep-alive``, the ``--limit-concurrency`` limit sheds the rest, and ``/health``
  answers through all of it (real server processes: integration lane);
- a body sent a byte at a time (Content-Length or chunked) is a 408 after ``--timeout-body``
  and its connection is closed, so such clients stop holding the limit; an answer the server
  has not begun within ``--timeout-response`` is a 503 that closes its connection, and one the
  client does not read is dropped with its connection after ``--timeout-response`` (real
  server processes, raw sockets: integration lane; the 408 also at the ASGI level);
- ``HEAD`` is answered wherever ``GET`` is (the open paths and the keyed ones, which still
  need the key), with the GET's status and headers and no body;
- a gauge not measured yet reads NaN, never 0: ``magretrieve_recall_at_10`` on a fresh server
  and on one without a store (an alert on ``recall < target`` would fire on every new replica);
- a replica serving a folder store answers from the generation another process committed
  (two server processes and one writer; integration lane), embedded Chroma and LanceDB
  included (``magretrieve index`` writing from another process).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.support.exports import tiny_export_dir
from tests.support.server import (
    KEY,
    SERVE,
    assert_clean_error,
    free_port,
    start_server,
    store_copy,
)

HEADERS = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tiny_model_dir) -> Path:
    return tiny_export_dir(tmp_path_factory, tiny_model_dir)


@pytest.fixture(scope="module")
def store_template(tmp_path_factory, export_dir, tiny_beir_dir) -> Path:
    """A FAISS store of the 12-document tiny BEIR corpus (copied by each test that writes)."""
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    folder = tmp_path_factory.mktemp("reliability-store") / "ix"
    with Retriever.load(export_dir, store=f"faiss:{folder}") as r:
        index_corpus(r, tiny_beir_dir / "corpus.jsonl", progress=False)
    return folder


def app_client(export: Path, store: str | None = None):
    from fastapi.testclient import TestClient

    from magretrieve.server import create_app

    return TestClient(create_app(export, store=store, api_key=KEY))


# ----------------------------------------------------------------------------- request bodies


@pytest.mark.parametrize("k", [True, False, "5", 5.0])
def test_k_is_a_json_integer_as_on_the_command_line(tmp_path, export_dir, store_template, k):
    store = store_copy(store_template, tmp_path, "ix")
    with app_client(export_dir, f"faiss:{store}") as client:
        resp = client.post("/search", json={"query": "heart risk", "k": k}, headers=HEADERS)
        assert_clean_error(resp, 422, "k:", "integer")
        ok = client.post("/search", json={"query": "heart risk", "k": 3}, headers=HEADERS)
        assert ok.status_code == 200 and len(ok.json()["hits"]) == 3


BODY = b'{"query": "heart risk", "k": 2}'


@pytest.mark.parametrize(
    "content_type",
    ["application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"],
)
def test_a_json_body_without_the_json_content_type_is_a_415(
    tmp_path, export_dir, store_template, content_type
):
    store = store_copy(store_template, tmp_path, "ix")
    with app_client(export_dir, f"faiss:{store}") as client:
        for path in ("/search", "/v1/embeddings", "/documents"):
            resp = client.post(
                path, content=BODY, headers={**HEADERS, "content-type": content_type}
            )
            media = content_type.split(";")[0]
            assert_clean_error(
                resp, 415, f"Content-Type: {media}", "Content-Type: application/json"
            )
        # a body without any content type is not read either, and told the same
        resp = client.post("/search", content=BODY, headers=HEADERS)
        assert_clean_error(resp, 415, "without a Content-Type", "Content-Type: application/json")
        # the right type and its parameters are read as JSON
        for given in ("application/json", "application/json; charset=utf-8"):
            ok = client.post("/search", content=BODY, headers={**HEADERS, "content-type": given})
            assert ok.status_code == 200 and len(ok.json()["hits"]) == 2, (given, ok.text)
        # a JSON body that is itself wrong stays a 422 naming the field
        bad = client.post("/search", json={"query": "x", "k": 0}, headers=HEADERS)
        assert_clean_error(bad, 422, "k:")


def stored_payloads(spec: str) -> dict[str, dict]:
    from magretrieve.stores import open_store

    store = open_store(spec)
    try:
        ids = sorted(store.iter_ids())
        return {i: r.payload for i, r in zip(ids, store.get(ids), strict=True)}
    finally:
        store.close()


LINES = [
    {"_id": "p-id", "title": "statins", "text": "statin heart risk", "id": "ext-9", "year": 2020},
    {"_id": 7, "text": "integer id kept as a string", "payload": {"source": "crawl"}},
    {"_id": "p-nested", "text": "nested values", "tags": ["a", "b"], "meta": {"x": None}},
]


def test_documents_keep_the_payload_fields_index_keeps(tmp_path, export_dir):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(line) + "\n" for line in LINES))
    by_index = f"faiss:{tmp_path / 'by-index'}"
    proc = subprocess.run(
        [sys.executable, "-m", "magretrieve", "index", str(export_dir), str(corpus),
         "--store", by_index],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    by_server = f"faiss:{tmp_path / 'by-server'}"
    with app_client(export_dir, by_server) as client:
        resp = client.post("/documents", json={"documents": LINES}, headers=HEADERS)
        assert resp.status_code == 200, resp.text
        assert resp.json()["ids"] == ["p-id", "7", "p-nested"]
    indexed, posted = stored_payloads(by_index), stored_payloads(by_server)
    assert posted == indexed
    assert posted["p-id"]["id"] == "ext-9" and posted["p-id"]["year"] == 2020
    assert posted["7"]["payload"] == {"source": "crawl"}


def test_documents_errors_name_the_document(tmp_path, export_dir, store_template):
    store = store_copy(store_template, tmp_path, "ix")
    with app_client(export_dir, f"faiss:{store}") as client:
        before = client.get("/info").json()["store"]["count"]
        for docs, says in (
            ([{"id": "x", "text": "an id but no _id"}], ("document #0", "'_id'")),
            ([{"_id": "ok", "text": "t"}, {"_id": 1.5, "text": "t"}], ("document #1", "1.5")),
            ([{"_id": "t", "text": 5}], ("document #0", "'text'", "string")),
            ([{"_id": "e", "title": " ", "text": "\u200b"}], ("'e'", "empty title and text")),
        ):
            resp = client.post("/documents", json={"documents": docs}, headers=HEADERS)
            assert_clean_error(resp, 422, *says)
        assert client.get("/info").json()["store"]["count"] == before


@pytest.mark.parametrize(
    "args,says",
    [
        (["--threads", "0"], "--threads 0: must be at least 1"),
        (["--threads", "-2"], "--threads -2: must be at least 1"),
        (["--limit-concurrency", "0"], "--limit-concurrency must be >= 1"),
        (["--timeout-keep-alive", "0"], "--timeout-keep-alive must be > 0"),
        (["--timeout-keep-alive", "nan"], "--timeout-keep-alive must be a finite number"),
        (["--graph-workers", "0"], "--graph-workers must be >= 1"),
        (["--timeout-body", "0"], "--timeout-body must be > 0"),
        (["--timeout-response", "-1"], "--timeout-response must be > 0"),
    ],
)
def test_serve_refuses_impossible_numbers_in_one_line(export_dir, args, says):
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-c", SERVE, "serve", str(export_dir), "--port", str(port), *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("Error: ") and says in lines[0], lines
    assert "serving" not in proc.stderr and "Traceback" not in proc.stderr


def test_open_state_refuses_zero_threads(export_dir):
    from magretrieve.core.errors import ConfigError
    from magretrieve.server.app import open_state

    for bad in (0, -1, True):
        with pytest.raises(ConfigError, match="threads must be at least 1"):
            open_state(export_dir, threads=bad)


# ----------------------------------------------------------------------------- shutdown


def test_a_write_running_at_shutdown_finishes_before_the_store_closes(
    tmp_path, export_dir, store_template
):
    """uvicorn cancels a request still running when its grace period ends, but not the worker
    thread writing for it: the store is closed only after that write (and its persist)."""
    import uvicorn

    from magretrieve.server import create_app
    from magretrieve.stores import open_store

    store = store_copy(store_template, tmp_path, "ix")
    app = create_app(export_dir, store=f"faiss:{store}", api_key=KEY)
    state = app.state.magretrieve
    retriever = state.retriever
    events: list[str] = []
    writing = threading.Event()
    real_write, real_close = retriever.write_batch, retriever.store.close

    def slow_write(docs, vectors):  # a store slow to take a write (a busy database)
        writing.set()
        time.sleep(1.5)
        events.append("write")
        return real_write(docs, vectors)

    def close():
        events.append("close")
        real_close()

    retriever.write_batch = slow_write
    retriever.store.close = close
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="critical", timeout_graceful_shutdown=0.2
        )
    )
    runner = threading.Thread(target=server.run)
    runner.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    answers: list[object] = []

    def post() -> None:
        doc = {"_id": "late", "text": "aspirin dose"}
        try:
            answers.append(
                httpx.post(
                    url + "/documents", json={"documents": [doc]}, headers=HEADERS, timeout=30
                )
            )
        except httpx.HTTPError as exc:  # the request was cancelled at the grace period's end
            answers.append(exc)

    client = threading.Thread(target=post)
    client.start()
    assert writing.wait(30)
    server.should_exit = True  # what SIGTERM does
    runner.join(60)
    client.join(60)
    assert not runner.is_alive()
    assert events == ["write", "close"], events
    reopened = open_store(f"faiss:{store}")
    try:
        assert reopened.existing(["late"]) == {"late"}  # written, persisted, then closed
    finally:
        reopened.close()


def test_a_store_call_after_close_is_refused_before_it_starts(tmp_path, export_dir, store_template):
    from magretrieve.server.errors import error_headers, status_of
    from magretrieve.serving.errors import Draining

    store = store_copy(store_template, tmp_path, "ix")
    with app_client(export_dir, f"faiss:{store}") as client:
        holder = client.app.state.magretrieve.holder
        count = holder.retriever.store.count()
    calls: list[str] = []
    holder.retriever.write_batch = lambda *a: calls.append("write")
    with pytest.raises(Draining, match="shutting down") as refused, holder.use() as retriever:
        retriever.write_batch([], None)
    assert status_of(refused.value) == 503 and calls == []
    assert error_headers(refused.value, retry_after_s=1) == {"Retry-After": "1"}
    from magretrieve.stores import open_store

    with open_store(f"faiss:{store}") as reopened:
        assert reopened.count() == count


# ----------------------------------------------------------------------------- HEAD, gauges

#: Paths read with GET, open without the key (but /metrics) and keyed. The API docs are open
#: like the page: they describe the routes, not the data.
OPEN_GETS = ["/health", "/ready", "/info", "/", "/static/page.css", "/docs", "/openapi.json"]
KEYED_GETS = ["/v1/models"]


def test_head_is_answered_wherever_get_is(export_dir):
    """RFC 9110: a server that answers GET answers HEAD, with the same status and headers and
    no body (HAProxy and uptime checks probe with HEAD); the keyed paths still need the key."""
    with app_client(export_dir) as client:
        model = client.get("/v1/models", headers=HEADERS).json()["data"][0]["id"]
        keyed = [*KEYED_GETS, f"/v1/models/{model}"]
        for path in [*OPEN_GETS, *keyed]:
            headers = HEADERS if path in keyed else {}
            get = client.get(path, headers=headers)
            head = client.head(path, headers=headers)
            assert get.status_code == 200, path
            assert (head.status_code, head.content) == (200, b""), path
            assert dict(head.headers) == dict(get.headers), path  # Content-Length included
        metrics = client.head("/metrics")  # its counts move between two calls: not its length
        assert (metrics.status_code, metrics.content) == (200, b"")
        assert metrics.headers["content-type"].startswith("text/plain")
        for path in keyed:
            refused = client.head(path)
            assert (refused.status_code, refused.content) == (401, b""), path
            assert refused.headers["www-authenticate"] == "Bearer"
        # a path with no GET is not answered by HEAD either, and says so
        post_only = client.head("/v1/embeddings", headers=HEADERS)
        assert post_only.status_code == 405 and post_only.headers["allow"] == "POST"
        missing = client.head("/no-such-page", headers=HEADERS)
        assert (missing.status_code, missing.content) == (404, b"")
        text = client.get("/metrics").text
        assert 'magretrieve_requests_total{method="HEAD",route="/health",status="200"} 1.0' in text


def _gauges(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        if family.type == "gauge"
        for s in family.samples
        if not s.name.endswith("_created")  # a counter's creation time, not a gauge
    }


def test_gauges_not_measured_read_nan_never_zero(tmp_path, export_dir, store_template):
    """An alert on ``recall < target`` must not fire on a replica that has checked nothing:
    the recall gauge is NaN on a fresh server and on one without a store, and a number once a
    sampled query has been checked; the queue depth is measured from the start (0: nothing
    waits)."""
    from fastapi.testclient import TestClient

    from magretrieve.server import create_app
    from magretrieve.serving.settings import ServerSettings

    with app_client(export_dir) as client:  # no store: nothing to measure, ever
        gauges = _gauges(client.get("/metrics").text)
        assert set(gauges) == {"magretrieve_queue_depth", "magretrieve_recall_at_10"}
        assert math.isnan(gauges["magretrieve_recall_at_10"])
        assert gauges["magretrieve_queue_depth"] == 0.0
    store = store_copy(store_template, tmp_path, "s")
    settings = ServerSettings(api_key=KEY, recall_sample=1.0)
    with TestClient(create_app(export_dir, store=f"faiss:{store}", settings=settings)) as client:
        assert math.isnan(_gauges(client.get("/metrics").text)["magretrieve_recall_at_10"])
        hits = client.post("/search", json={"query": "heart risk", "k": 3}, headers=HEADERS)
        assert hits.status_code == 200, hits.text
        deadline = time.monotonic() + 30
        while client.get("/info").json()["recall_watch"]["checked"] < 1:
            assert time.monotonic() < deadline, "the sampled query was never checked"
            time.sleep(0.05)
        # an exact search over 12 documents: the served top 3 is the exact top 3
        assert _gauges(client.get("/metrics").text)["magretrieve_recall_at_10"] == 1.0


def test_a_body_that_stops_arriving_is_a_408_that_closes_the_connection(export_dir):
    """At the ASGI level: a body that stops half-way is answered 408 with ``Connection: close``
    once ``timeout_body`` has passed, without waiting for the rest."""
    import asyncio

    from magretrieve.server import create_app
    from magretrieve.serving.settings import ServerSettings

    app = create_app(export_dir, settings=ServerSettings(timeout_body=0.3))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": "/v1/embeddings", "raw_path": b"/v1/embeddings",
        "root_path": "", "query_string": b"", "server": ("127.0.0.1", 80),
        "client": ("127.0.0.1", 5), "headers": [
            (b"host", b"x"), (b"content-type", b"application/json"), (b"content-length", b"40"),
        ],
    }  # fmt: skip
    sent: list[dict] = []

    async def run() -> float:
        parts = [b'{"input": "a', b"b"]

        async def receive() -> dict:
            if parts:
                return {"type": "http.request", "body": parts.pop(0), "more_body": True}
            await asyncio.sleep(3600)  # the rest never comes
            raise AssertionError("unreachable")

        async def send(message: dict) -> None:
            sent.append(message)

        started = time.monotonic()
        await asyncio.wait_for(app(scope, receive, send), 10)
        return time.monotonic() - started

    took = asyncio.run(run())
    assert 0.25 <= took < 3, took
    start, body = sent[0], sent[1]
    assert start["status"] == 408
    assert (b"connection", b"close") in start["headers"]
    message = json.loads(body["body"])["error"]["message"]
    assert "0.3 s" in message and "--timeout-body" in message


def test_an_answer_not_begun_within_timeout_response_is_a_503(export_dir):
    """A route still working after ``timeout_response`` (here: an engine that never answers)
    is cancelled and answered 503 with Retry-After and ``Connection: close``; a write's
    store call runs in a worker thread, which the cancel does not cut."""
    import asyncio

    from fastapi.testclient import TestClient

    from magretrieve.server import create_app
    from magretrieve.serving.settings import ServerSettings

    app = create_app(export_dir, settings=ServerSettings(timeout_response=0.3))
    cancelled: list[bool] = []

    async def never(*args, **kwargs):
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    with TestClient(app) as client:
        app.state.magretrieve.engine.embed = never
        started = time.monotonic()
        resp = client.post("/v1/embeddings", json={"input": "x", "input_type": "query"})
        took = time.monotonic() - started
        assert_clean_error(resp, 503, "no answer within 0.3 s", "--timeout-response")
        assert resp.headers["retry-after"] == "1" and resp.headers["connection"] == "close"
        assert 0.25 <= took < 3 and cancelled == [True]
        assert client.get("/health").status_code == 200


# ----------------------------------------------------------------------------- connections


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (reads to EOF or reset, without blocking long)."""
    sock.settimeout(0.05)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


def _http_get(port: int, path: str) -> int:
    """Status of ``GET path`` on a fresh connection (0 when the connection failed)."""
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code
    except httpx.HTTPError:
        return 0


@pytest.mark.integration
def test_idle_and_slow_connections_are_closed_and_health_answers(tmp_path, export_dir):
    timeout = 1.5
    srv = start_server(
        export_dir, "--limit-concurrency", "8", "--timeout-keep-alive", str(timeout),
        key=None, log_dir=tmp_path,
    )  # fmt: skip
    idle: list[socket.socket] = []
    slow: list[socket.socket] = []
    stop = threading.Event()
    try:
        for _ in range(40):  # connect and send nothing
            idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
        for _ in range(6):  # a request head, one byte at a time
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
            s.sendall(b"GET /info HTTP/1.1\r\nHost: x\r\n")
            slow.append(s)

        def dribble() -> None:
            while not stop.is_set():
                for s in slow:
                    with contextlib.suppress(OSError):
                        s.send(b"X")
                stop.wait(0.2)

        feeder = threading.Thread(target=dribble, daemon=True)
        feeder.start()
        time.sleep(0.3)
        started = time.monotonic()
        assert not _closed_by_peer(idle[0]) and not _closed_by_peer(slow[0])  # not before time
        # over the limit: every route but /health is shed, /health answers
        assert _http_get(srv.port, "/health") == 200
        assert _http_get(srv.port, "/info") == 503
        # the idle and the slow connections are closed after the timeout, not kept
        deadline = started + timeout + 5
        pending = idle + slow
        while pending and time.monotonic() < deadline:
            pending = [s for s in pending if not _closed_by_peer(s)]
            assert _http_get(srv.port, "/health") == 200
        assert not pending, f"{len(pending)} of {len(idle) + len(slow)} connections still open"
        assert _http_get(srv.port, "/info") == 200  # their places are free again
        # a connection idle after an answer is closed after the timeout too
        keep = socket.create_connection(("127.0.0.1", srv.port), timeout=5)
        keep.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert keep.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(timeout + 1)
        assert _closed_by_peer(keep)
        keep.close()
    finally:
        stop.set()
        for s in idle + slow:
            s.close()
        code = srv.stop()
    assert code == 0 and "Traceback" not in srv.stderr(), srv.stderr()[-3000:]


@pytest.mark.integration
def test_a_running_request_is_not_cut_by_the_head_timeout(tmp_path, export_dir):
    """The timeout bounds waiting for a request, not answering one: a request whose answer takes
    longer than the timeout (here: held in the batcher) still gets it."""
    srv = start_server(
        export_dir, "--timeout-keep-alive", "0.5", "--max-wait-ms", "1500",
        key=None, log_dir=tmp_path,
    )  # fmt: skip
    try:
        results: list[httpx.Response] = []
        body = {"input": ["one text", "another text"], "input_type": "query"}

        def call() -> None:
            results.append(httpx.post(srv.url + "/v1/embeddings", json=body, timeout=30))

        threads = [threading.Thread(target=call) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert [r.status_code for r in results] == [200, 200]
    finally:
        code = srv.stop()
    assert code == 0, srv.stderr()[-3000:]


def _raw(port: int, data: bytes, rcvbuf: int | None = None) -> socket.socket:
    """A connection that has sent ``data`` (with a small receive buffer: a client that does
    not read holds the answer in the server's buffers, not in its own)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.sendall(data)
    return s


def _raw_status(port: int, request: bytes) -> bytes:
    """The whole answer to one raw request on a fresh connection (b"" when refused)."""
    try:
        with _raw(port, request) as s:
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            return out
    except OSError:
        return b""


SLOW_BODY_HEADS = [
    b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Content-Length: 400\r\n\r\n{",
    b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",
]


@pytest.mark.integration
def test_bodies_sent_a_byte_at_a_time_are_cut_at_the_body_deadline(tmp_path, export_dir):
    """Seven clients that send a complete head and then dribble the body hold the limit of 8
    only until ``--timeout-body``: each gets a 408 and its connection is closed (the head
    deadline is set long, so it is not the one that closes them)."""
    timeout = 1.0
    srv = start_server(
        export_dir, "--limit-concurrency", "8", "--timeout-body", str(timeout),
        "--timeout-keep-alive", "60", key=None, log_dir=tmp_path,
    )  # fmt: skip
    slow = [_raw(srv.port, SLOW_BODY_HEADS[i % 2]) for i in range(7)]
    answers = {id(s): b"" for s in slow}
    closed: set[int] = set()
    chunked = {id(s) for i, s in enumerate(slow) if i % 2}
    stop = threading.Event()

    def dribble() -> None:  # a byte each 0.2 s, until the server answers; read what it sends
        while not stop.is_set():
            for s in slow:
                if id(s) in closed:
                    continue
                s.settimeout(0.01)
                try:
                    data = s.recv(65536)
                    if not data:
                        closed.add(id(s))
                    answers[id(s)] += data
                except TimeoutError:
                    if not answers[id(s)]:
                        with contextlib.suppress(OSError):
                            s.send(b"1\r\n \r\n" if id(s) in chunked else b" ")
                except OSError:
                    closed.add(id(s))
            stop.wait(0.2)

    started = time.monotonic()
    feeder = threading.Thread(target=dribble, daemon=True)
    feeder.start()
    try:
        time.sleep(0.2)
        # the limit is held: every route but /health is shed; a liveness probe by HEAD answers
        assert _http_get(srv.port, "/info") == 503
        probe = _raw_status(
            srv.port, b"HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        head, _, body = probe.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"content-length: 15" in head and not body
        while len(closed) < len(slow) and time.monotonic() < started + timeout + 5:
            time.sleep(0.05)
        waited = time.monotonic() - started
        stop.set()
        feeder.join(5)
        assert len(closed) == len(slow), (
            f"{len(slow) - len(closed)} still open after {waited:.1f} s"
        )
        assert waited >= timeout * 0.9  # not before the deadline
        for s in slow:
            head, _, body = answers[id(s)].partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 408"), answers[id(s)][:200]
            assert b"connection: close" in head.lower()
            assert "--timeout-body" in json.loads(body)["error"]["message"]
        assert _http_get(srv.port, "/info") == 200  # their places are free again
    finally:
        stop.set()
        for s in slow:
            s.close()
        code = srv.stop()
    assert code == 0 and "Traceback" not in srv.stderr(), srv.stderr()[-3000:]


@pytest.mark.integration
def test_answers_a_client_does_not_read_are_dropped_at_the_response_deadline(tmp_path, export_dir):
    """Clients that ask for more than the kernel's buffers hold (five 1.7 MB assets, pipelined)
    and never read: their answers wait in the server's buffers, and their connections would
    hold places under the limit for good (and the server's shutdown for its grace period)."""
    timeout = 1.5
    srv = start_server(
        export_dir, "--limit-concurrency", "8", "--timeout-response", str(timeout),
        "--timeout-keep-alive", "0.5", key=None, log_dir=tmp_path,
    )  # fmt: skip
    request = b"GET /static/swagger/swagger-ui-bundle.js HTTP/1.1\r\nHost: x\r\n\r\n" * 5
    readers: list[socket.socket] = []
    try:
        while len(readers) < 8 and _http_get(srv.port, "/info") != 503:
            readers.append(_raw(srv.port, request, rcvbuf=4096))
            time.sleep(0.1)
        started = time.monotonic()
        assert _http_get(srv.port, "/info") == 503  # the limit is held by clients not reading
        freed = None
        while time.monotonic() < started + timeout + 5:
            if _http_get(srv.port, "/info") == 200:
                freed = time.monotonic() - started
                break
            time.sleep(0.1)
        assert freed is not None, f"{len(readers)} clients that never read still hold the limit"
    finally:
        for s in readers:
            s.close()
        code = srv.stop()
    assert code == 0 and "Traceback" not in srv.stderr(), srv.stderr()[-3000:]


@pytest.mark.integration
def test_an_answer_not_begun_within_the_response_deadline_is_a_503(tmp_path, export_dir):
    """A request the server cannot answer within ``--timeout-response`` (here: 1,024 texts of
    2,000 characters, about 2 s of work where the deadline is 0.2 s) is answered 503 with
    Retry-After when the deadline passes, and its connection is closed; the server goes on
    answering."""
    timeout = 0.2
    srv = start_server(export_dir, "--timeout-response", str(timeout), key=None, log_dir=tmp_path)
    try:
        texts = [f"text {i} " + "statin heart risk " * 111 for i in range(1024)]
        started = time.monotonic()
        resp = httpx.post(
            srv.url + "/v1/embeddings", json={"input": texts, "input_type": "query"}, timeout=60
        )
        took = time.monotonic() - started
        message = assert_clean_error(resp, 503, "--timeout-response", f"{timeout:g} s")
        assert resp.headers["retry-after"] == "1" and resp.headers["connection"] == "close"
        assert took < timeout + 2, (took, message)
        assert httpx.get(srv.url + "/info", timeout=30).status_code == 200
    finally:
        code = srv.stop()
    assert code == 0 and "Traceback" not in srv.stderr(), srv.stderr()[-3000:]


@pytest.mark.integration
def test_curl_d_without_a_content_type_is_told_which_header_to_send(tmp_path, export_dir):
    srv = start_server(export_dir, key=None, log_dir=tmp_path)
    try:
        proc = subprocess.run(
            ["curl", "-sS", srv.url + "/embed", "-d", '{"inputs": "x", "input_type": "query"}'],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        body = json.loads(proc.stdout)
        assert body["error"]["code"] == 415
        message = body["error"]["message"]
        assert "application/x-www-form-urlencoded" in message
        assert "Content-Type: application/json" in message
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- replicas


def _search_ids(srv, query: str, k: int = 100) -> set[str]:
    resp = httpx.post(srv.url + "/search", json={"query": query, "k": k}, headers=srv.headers)
    assert resp.status_code == 200, resp.text
    return {h["id"] for h in resp.json()["hits"]}


def _disk_generation(store: Path) -> int:
    return int(json.loads((store / "faiss_store.json").read_text())["generation"])


@pytest.mark.integration
def test_a_replica_answers_from_the_generation_another_process_committed(
    tmp_path, export_dir, store_template
):
    store = store_copy(store_template, tmp_path, "ix")
    spec = f"faiss:{store}"
    writer = start_server(export_dir, "--store", spec, key=KEY, log_dir=tmp_path)
    reader = start_server(export_dir, "--store", spec, key=None, log_dir=tmp_path)
    index_env = {k: v for k, v in os.environ.items() if k != "MAGRETRIEVE_API_KEY"}
    try:
        start = httpx.get(reader.url + "/info").json()["store"]
        assert start["generation"] == _disk_generation(store)
        doc = {"_id": "fresh-1", "title": "zebra", "text": "zebra quantum lattice"}
        assert writer.post("/documents", {"documents": [doc]}).status_code == 200
        assert "fresh-1" in _search_ids(reader, "zebra quantum lattice")
        info = httpx.get(reader.url + "/info").json()["store"]
        assert info["count"] == start["count"] + 1
        assert info["generation"] == _disk_generation(store) > start["generation"]
        gone = httpx.request(
            "DELETE", writer.url + "/documents", json={"ids": ["fresh-1"]}, headers=writer.headers
        )
        assert gone.json() == {"deleted": 1}
        assert "fresh-1" not in _search_ids(reader, "zebra quantum lattice")
        # the writing replica stops (its writer lock goes); `magretrieve index` writes next
        assert writer.stop() == 0
        corpus = tmp_path / "more.jsonl"
        corpus.write_text(json.dumps({"_id": "fresh-2", "text": "okapi violin harbour"}) + "\n")
        proc = subprocess.run(
            [sys.executable, "-m", "magretrieve", "index", str(export_dir), str(corpus),
             "--store", spec],
            capture_output=True, text=True, timeout=300, env=index_env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "fresh-2" in _search_ids(reader, "okapi violin harbour")
        hits = httpx.post(
            reader.url + "/search", json={"query": "okapi violin harbour", "k": 100}
        ).json()["hits"]
        assert len(hits) == start["count"] + 1  # every document once
        assert httpx.get(reader.url + "/info").json()["store"]["generation"] == (
            _disk_generation(store)
        )
    finally:
        writer.stop()
        code = reader.stop()
    assert code == 0 and "Traceback" not in reader.stderr(), reader.stderr()[-3000:]


def test_a_search_costs_one_small_file_read_when_nothing_changed(
    tmp_path, export_dir, store_template
):
    """The generation check before a search reads the state file only; no reload happens
    while the generation on disk is the one held."""
    store = store_copy(store_template, tmp_path, "ix")
    with app_client(export_dir, f"faiss:{store}") as client:
        holder = client.app.state.magretrieve.holder
        first = holder.retriever
        for _ in range(5):
            resp = client.post("/search", json={"query": "heart", "k": 2}, headers=HEADERS)
            assert resp.status_code == 200
        assert holder.retriever is first and holder.reloads == 0
        started = time.perf_counter()
        for _ in range(200):
            assert holder.stale() is None
        per_check = (time.perf_counter() - started) / 200
        assert per_check < 2e-3, per_check  # microseconds in practice; far below a search


#: embedded database engines run in the test process: the integration lane (conftest.py)
EMBEDDED = [pytest.param(k, marks=pytest.mark.integration) for k in ("chroma", "lancedb")]


@pytest.mark.parametrize("kind", ["faiss", "memory", "scann", *EMBEDDED])
def test_every_folder_store_reloads_a_generation_another_writer_committed(
    tmp_path, export_dir, kind
):
    """Two apps on one folder (each its own store object, as two processes have): what one
    writes, deletes and persists, the other answers at its next search."""
    if kind == "scann":
        pytest.importorskip("scann")
    spec = f"{kind}:{tmp_path / 'store'}"
    if kind in ("chroma", "lancedb"):  # embedded databases: a collection in the folder
        spec += "/docs"
    doc = {"_id": "fresh-1", "text": "zebra quantum lattice", "year": 2021}
    with app_client(export_dir, spec) as writer:
        seed = {"_id": "seed", "text": "a first document"}
        assert writer.post("/documents", json={"documents": [seed]}, headers=HEADERS).is_success
    # the writing app has closed: a reader opens the store, then a new writer commits twice
    with app_client(export_dir, spec) as reader, app_client(export_dir, spec) as writer:
        holder = reader.app.state.magretrieve.holder
        held = holder.generation
        assert reader.get("/info").json()["store"]["generation"] == held is not None

        def ids() -> list[str]:
            body = {"query": "zebra quantum lattice", "k": 10}
            resp = reader.post("/search", json=body, headers=HEADERS)
            assert resp.status_code == 200, resp.text
            return sorted(h["id"] for h in resp.json()["hits"])

        assert ids() == ["seed"]
        assert writer.post("/documents", json={"documents": [doc]}, headers=HEADERS).is_success
        assert ids() == ["fresh-1", "seed"] and holder.reloads == 1
        hit = next(
            h
            for h in reader.post(
                "/search", json={"query": "zebra", "k": 2}, headers=HEADERS
            ).json()["hits"]
            if h["id"] == "fresh-1"
        )
        assert hit["payload"]["year"] == 2021
        info = reader.get("/info").json()["store"]
        assert info["count"] == 2 and info["generation"] > held
        gone = writer.request("DELETE", "/documents", json={"ids": ["fresh-1"]}, headers=HEADERS)
        assert gone.json() == {"deleted": 1}
        assert ids() == ["seed"] and holder.reloads == 2
        assert ids() == ["seed"] and holder.reloads == 2  # nothing new: no reload


@pytest.mark.parametrize("kind", EMBEDDED)
def test_an_embedded_database_replica_answers_what_another_process_indexed(
    tmp_path, export_dir, kind
):
    """The reader holds Chroma's loaded HNSW segment / LanceDB's opened table version;
    ``magretrieve index`` in another process writes, and the reader's next search finds it
    (in one process Chroma shares its engine between opens, so this needs two processes)."""
    spec = f"{kind}:{tmp_path / 'store'}/docs"
    with app_client(export_dir, spec) as writer:
        seed = {"_id": "seed", "text": "a first document"}
        assert writer.post("/documents", json={"documents": [seed]}, headers=HEADERS).is_success
    corpus = tmp_path / "more.jsonl"
    corpus.write_text(json.dumps({"_id": "fresh-1", "text": "zebra quantum lattice"}) + "\n")
    env = {k: v for k, v in os.environ.items() if k != "MAGRETRIEVE_API_KEY"}
    with app_client(export_dir, spec) as reader:
        holder = reader.app.state.magretrieve.holder

        def ids() -> list[str]:
            body = {"query": "zebra quantum lattice", "k": 10}
            resp = reader.post("/search", json=body, headers=HEADERS)
            assert resp.status_code == 200, resp.text
            return sorted(h["id"] for h in resp.json()["hits"])

        assert ids() == ["seed"]
        held = holder.generation
        proc = subprocess.run(
            [sys.executable, "-m", "magretrieve", "index", str(export_dir), str(corpus),
             "--store", spec],
            capture_output=True, text=True, timeout=300, env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert ids() == ["fresh-1", "seed"] and holder.reloads == 1
        info = reader.get("/info").json()["store"]
        assert info["count"] == 2 and info["generation"] > held
