"""``RemoteEncoder`` against small hostile servers on 127.0.0.1 (tests/support/hostile.py).

The client's promises, each against the server that breaks it:

- the API key goes to the configured server only: a redirect (any 3xx, to another port, host
  or scheme) is refused with one error naming the ``Location``, and nothing reaches the
  redirect's target;
- ``timeout`` is one deadline per request across connect, send and every read: a body trickled
  one byte at a time, a head that comes late and a body that never follows, a server that never
  answers, all end at ``timeout`` (measured);
- every transport failure or malformed answer (a body cut short, bytes that are not HTTP, a
  broken chunked body, HTML, JSON of the wrong shape, bad vectors) is one
  :class:`RemoteEncoderError` naming the URL, never the key, never a traceback of the library
  underneath;
- the key is in no message, ``repr`` or log record (httpx and httpcore logging at DEBUG).
"""

from __future__ import annotations

import base64
import json
import logging
import uuid

import numpy as np
import pytest

from magretrieve.serving.remote import RemoteEncoder, RemoteEncoderError
from tests.support.hostile import (
    RawServer,
    Seen,
    elapsed,
    late_head_then_stall,
    on_embeddings,
    raw,
    redirect_to,
    reply,
    silent,
    trickle,
    well_behaved,
)

pytestmark = pytest.mark.integration

KEY = "S3CRhostile-" + uuid.uuid4().hex[:10]


@pytest.fixture
def target():
    """A well-behaved server that records what reaches it (the redirects' target)."""
    with RawServer(well_behaved) as server:
        yield server


def test_the_key_is_sent_to_the_configured_server(target):
    remote = RemoteEncoder(target.url, KEY, timeout=2)
    vectors = remote.encode_documents(["a", "b"])
    assert vectors.tolist() == [[0, 1, 2, 3], [1, 2, 3, 4]]
    assert [s.headers.get("authorization") for s in target.seen] == [f"Bearer {KEY}"] * 2


# ----------------------------------------------------------------------------- redirects


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_port_is_refused_and_the_key_stays_home(target, status):
    with RawServer(redirect_to(target.url + "/info", status)) as redirector:
        with pytest.raises(RemoteEncoderError) as e:
            RemoteEncoder(redirector.url, KEY, timeout=2).info()
        assert target.seen == []  # the target never heard of the request, key or not
        assert [s.headers["authorization"] for s in redirector.seen] == [f"Bearer {KEY}"]
    message = str(e.value)
    assert f"GET {redirector.url}/info answered {status}" in message, message
    assert f"redirect to {target.url}/info" in message and "not followed" in message
    assert KEY not in message


@pytest.mark.parametrize(
    "location",
    [
        "http://localhost:{port}/info",  # another host name, same port
        "https://127.0.0.1:{port}/info",  # another scheme
        "//127.0.0.1:{port}/v1/embeddings",  # scheme-relative: another port
    ],
)
def test_a_redirect_of_the_embeddings_post_is_refused(target, location):
    where = location.format(port=target.port)
    with RawServer(on_embeddings(redirect_to(where, 307))) as redirector:
        remote = RemoteEncoder(redirector.url, KEY, timeout=2)
        with pytest.raises(RemoteEncoderError, match="answered 307, a redirect to") as e:
            remote.encode_queries(["q"])
    assert target.seen == []
    assert f"POST {redirector.url}/v1/embeddings" in str(e.value) and KEY not in str(e.value)


def test_a_same_server_redirect_is_refused_too():
    """The client follows no redirect at all: ``url`` is the server's own address."""
    with RawServer(redirect_to("/v2/info", 308)) as redirector:
        with pytest.raises(
            RemoteEncoderError, match=r"redirect to http://127\.0\.0\.1:\d+/v2/info"
        ):
            RemoteEncoder(redirector.url, KEY, timeout=2).info()
        assert len(redirector.seen) == 1


# ----------------------------------------------------------------------------- one deadline

INFO_BODY = json.dumps({"dimension": 4, "limits": {"max_inputs": 8}}).encode()


@pytest.mark.parametrize(
    ("answer", "timeout"),
    [
        # a valid answer, one byte every 0.1 s: complete after ~5 s if waited for
        pytest.param(trickle(INFO_BODY, 0.1), 2.0, id="trickled-body"),
        # each phase alone is within the timeout; together they are not
        pytest.param(late_head_then_stall(0.7), 1.0, id="late-head-then-stalled-body"),
        pytest.param(silent, 1.0, id="never-answers"),
    ],
)
def test_timeout_is_one_deadline_for_the_whole_request(answer, timeout):
    with RawServer(answer) as server:
        took, error = elapsed(RemoteEncoder(server.url, KEY, timeout=timeout).info)
    assert isinstance(error, RemoteEncoderError), repr(error)
    message = str(error)
    assert f"GET {server.url}/info" in message and f"within {timeout:g} s" in message, message
    assert KEY not in message
    assert timeout - 0.05 <= took <= timeout + 0.5, f"{took:.2f} s for timeout={timeout:g}"


def test_a_trickled_embeddings_answer_ends_at_the_deadline():
    """The same deadline on the POST, and the next request after it works."""
    vector = base64.b64encode(np.ones(4, dtype="<f4").tobytes()).decode()
    body = json.dumps({"data": [{"index": 0, "embedding": vector}]}).encode()
    with RawServer(on_embeddings(trickle(body, 0.05))) as server:
        remote = RemoteEncoder(server.url, KEY, timeout=1.0)
        remote.info()
        took, error = elapsed(lambda: remote.encode_queries(["q"]))
        assert isinstance(error, RemoteEncoderError) and "within 1 s" in str(error), repr(error)
        assert 0.95 <= took <= 1.5, took
        assert remote.info()["dimension"] == 4  # the client is still usable


# ----------------------------------------------------------------------------- broken answers


def _chunked_garbage(conn, seen: Seen, stopped) -> None:
    conn.sendall(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"zz\r\n{}\r\n0\r\n\r\n"
    )


def _json(body: object):
    return lambda conn, seen, stopped: reply(conn, 200, body)


def _b64(values) -> str:
    return base64.b64encode(np.asarray(values, dtype="<f4").tobytes()).decode()


#: What a transport failure says (h11 refused the bytes or the connection closed early).
BROKE = "broke off or is not HTTP"

#: (id, the answer to GET /info, what the message says)
BROKEN_INFO = [
    ("cut-mid-body", raw(b'HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{"dimen'), BROKE),
    ("not-http", raw(b"\x00\xffSSH-2.0-OpenSSH\r\n\r\n"), BROKE),
    ("closes-at-once", raw(b""), BROKE),
    ("bad-chunked-body", _chunked_garbage, BROKE),
    ("html-200", _json(b"<html>hello</html>"), "did not answer JSON"),
    ("json-list", _json([1, 2]), "did not answer like a magretrieve server"),
    ("no-dimension", _json({"limits": {}}), "did not answer like a magretrieve server"),
    ("text-dimension", _json({"dimension": "four"}), "did not answer like a magretrieve server"),
    ("bad-limits", _json({"dimension": 4, "limits": {"max_inputs": "x"}}), "did not answer like"),
]


@pytest.mark.parametrize(
    ("answer", "says"), [b[1:] for b in BROKEN_INFO], ids=[b[0] for b in BROKEN_INFO]
)
def test_a_broken_info_answer_is_one_error_naming_the_url(answer, says):
    with RawServer(answer) as server, pytest.raises(RemoteEncoderError) as e:
        RemoteEncoder(server.url, KEY, timeout=2).info()
    message = str(e.value)
    assert f"{server.url}/info" in message and says in message and KEY not in message, message
    assert "\n" not in message


#: (id, the /v1/embeddings answer to one text, what the message says)
BROKEN_EMBEDDINGS = [
    ("cut-mid-body", raw(b'HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n{"data": ['), BROKE),
    ("not-http", raw(b"garbage\r\n\r\n"), BROKE),
    ("html-200", _json(b"<html/>"), "did not answer JSON"),
    ("no-data", _json({"object": "list"}), "answered 0 vectors for 1 texts"),
    ("item-not-object", _json({"data": [7]}), "item #0"),
    ("no-embedding", _json({"data": [{"index": 0}]}), "item #0"),
    ("bad-base64", _json({"data": [{"index": 0, "embedding": "@@not base64@@"}]}), "item #0"),
    ("odd-bytes", _json({"data": [{"index": 0, "embedding": "AAAAAAA="}]}), "item #0"),
    ("index-out-of-range", _json({"data": [{"index": 3, "embedding": _b64([1] * 4)}]}), "index 3"),
    ("negative-index", _json({"data": [{"index": -1, "embedding": _b64([1] * 4)}]}), "index -1"),
    ("text-numbers", _json({"data": [{"index": 0, "embedding": ["a"] * 4}]}), "item #0"),
    ("wrong-dimension", _json({"data": [{"index": 0, "embedding": _b64([1] * 3)}]}), "dimension 3"),
]


@pytest.mark.parametrize(
    ("answer", "says"), [b[1:] for b in BROKEN_EMBEDDINGS], ids=[b[0] for b in BROKEN_EMBEDDINGS]
)
def test_a_broken_embeddings_answer_is_one_error_naming_the_url(answer, says):
    with RawServer(on_embeddings(answer)) as server, pytest.raises(RemoteEncoderError) as e:
        RemoteEncoder(server.url, KEY, timeout=2).encode_documents(["a"])
    message = str(e.value)
    assert f"{server.url}/v1/embeddings" in message and says in message, message
    assert KEY not in message and "\n" not in message


def test_duplicate_indexes_are_refused():
    vec = _b64([1] * 4)
    body = {"data": [{"index": 0, "embedding": vec}, {"index": 0, "embedding": vec}]}
    with (
        RawServer(on_embeddings(_json(body))) as server,
        pytest.raises(RemoteEncoderError, match="index 0 twice"),
    ):
        RemoteEncoder(server.url, KEY, timeout=2).encode_documents(["a", "b"])


# ----------------------------------------------------------------------------- the key


def test_the_key_is_in_no_log_record_message_or_repr(target, caplog):
    caplog.set_level(logging.DEBUG)
    remote = RemoteEncoder(target.url, KEY, timeout=2)
    remote.encode_queries(["q"])
    with RawServer(on_embeddings(raw(b"garbage"))) as bad, pytest.raises(RemoteEncoderError) as e:
        RemoteEncoder(bad.url, KEY, timeout=2).encode_queries(["q"])
    assert target.seen[-1].headers["authorization"] == f"Bearer {KEY}"
    assert any(r.name.startswith(("httpx", "httpcore")) for r in caplog.records)  # logged at all
    assert KEY not in caplog.text and KEY not in str(e.value)
    assert KEY not in repr(remote) and KEY not in str(remote)
