"""Secrets never printed: every credential form libpq, Milvus and Qdrant accept, through every
error path (bad spec, unreachable server, authentication failure, the CLI) and through
``describe()``, recorded metadata and log records.
"""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pytest

from magretrieve.core import redact as redact_module
from magretrieve.core.errors import StoreError
from magretrieve.core.redact import redact, redact_value
from magretrieve.stores import open_store, parse_spec
from tests.support.cli import run
from tests.support.fake_encoder import write_corpus

DIM = 4


def secret() -> str:
    return "S3CR" + uuid.uuid4().hex[:10]


#: (how the secret is carried, spec with {s} for the secret and {host} for an unreachable
#: server, options)
UNREACHABLE = [
    ("uri userinfo", "pgvector:postgresql://u:{s}@127.0.0.1:1/db#t", {}),
    ("uri userinfo with @", "pgvector:postgresql://u:a@{s}@127.0.0.1:1/db#t", {}),
    ("query password", "pgvector:postgresql://u@127.0.0.1:1/db?password={s}&sslmode=disable#t", {}),
    ("libpq dsn", "pgvector:host=127.0.0.1 port=1 dbname=x password={s}#t", {}),
    ("libpq dsn quoted", "pgvector:host=127.0.0.1 port=1 password='a b\\'{s}' dbname=x#t", {}),
    ("libpq dsn spaced", "pgvector:host=127.0.0.1 port=1 password = {s} dbname=x#t", {}),
    ("milvus userinfo", "milvus:http://root:{s}@127.0.0.1:1/coll", {}),
    ("milvus token option", "milvus:http://127.0.0.1:1/coll", {"token": "root:{s}"}),
    ("qdrant api_key option", "qdrant:http://127.0.0.1:1/coll", {"api_key": "{s}"}),
    ("qdrant userinfo", "qdrant:http://u:{s}@127.0.0.1:1/coll", {}),
    ("chroma userinfo", "chroma:http://u:{s}@127.0.0.1:1/coll", {}),
]


def assert_clean(text: str, value: str) -> None:
    assert value not in text, text
    # no fragment of it either (a partial mask would leak the tail)
    assert value[4:] not in text, text


@pytest.mark.parametrize(("form", "spec", "options"), UNREACHABLE, ids=[u[0] for u in UNREACHABLE])
def test_unreachable_server_errors_never_show_the_secret(form, spec, options, caplog, capfd):
    s = secret()
    caplog.set_level(logging.DEBUG)
    opts = {k: v.format(s=s) for k, v in options.items()}
    with pytest.raises(StoreError) as info:
        open_store(spec.format(s=s), dimension=DIM, **opts)
    message = str(info.value)
    assert "\n" not in message
    assert_clean(message, s)
    assert_clean(repr(info.value), s)
    assert_clean(caplog.text, s)
    out, err = capfd.readouterr()
    assert_clean(out + err, s)


@pytest.mark.parametrize(
    "spec",
    [
        "pgvector:postgresql://u:{s}@host/db",  # no #table
        "pgvector:host=h password={s}",
        "qdrant:http://u:{s}@",
        "qdrant:http://h:6333/bad?api_key={s}",
        "milvus:http://root:{s}@host/bad-name",
        "milvus:http://root:{s}@host",
        "nope:postgresql://u:{s}@h/db",
    ],
)
def test_bad_spec_errors_never_show_the_secret(spec):
    s = secret()
    with pytest.raises(StoreError) as info:
        parse_spec(spec.format(s=s))
    assert_clean(str(info.value), s)


@pytest.mark.integration
def test_authentication_failure_never_shows_the_secret(pg_uri):
    s = secret()
    # the session's server knows no role "intruder": the server refuses the login
    host = pg_uri.split("?", 1)[1]
    for spec in (
        f"pgvector:postgresql://intruder:{s}@/postgres?{host}#t",
        f"pgvector:postgresql://intruder@/postgres?{host}&password={s}#t",
    ):
        with pytest.raises(StoreError, match="intruder") as info:
            open_store(spec, dimension=DIM)
        assert_clean(str(info.value), s)


@pytest.mark.integration
def test_describe_and_metadata_never_show_the_secret(pg_uri):
    s = secret()
    # trust authentication ignores the password, so the store opens with it in its URI
    spec = f"pgvector:{pg_uri}&password={s}#sec_{uuid.uuid4().hex[:8]}"
    with open_store(spec, dimension=DIM) as store:
        store.add(["a"], np.ones((1, DIM), dtype=np.float32))
        store.write_metadata(
            {
                "model_fingerprint": "f",
                "source": f"postgresql://u:{s}@h/db",
                "api_key": s,
                "nested": {"token": s, "dsn": f"host=h password={s}"},
            }
        )
        described = repr(store.describe())
        assert_clean(described, s)
        assert_clean(repr(store.read_metadata()), s)
        assert store.read_metadata()["model_fingerprint"] == "f"
        assert_clean(repr(store), s)


def test_cli_errors_never_show_the_secret(use_fake, tmp_path):
    s = secret()
    corpus = write_corpus(tmp_path / "c.jsonl", 5)
    for spec in (
        f"pgvector:postgresql://u:{s}@127.0.0.1:1/db#t",
        f"pgvector:host=127.0.0.1 port=1 password={s}#t",
        f"milvus:http://root:{s}@127.0.0.1:1/coll",
    ):
        res = run("index", "EXPORT", str(corpus), "--store", spec, "--no-progress")
        assert res.exit_code == 1
        assert "Traceback" not in res.output
        assert_clean(res.output, s)


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("postgresql://bob:pw@h:5432/db", "postgresql://bob:***@h:5432/db"),
        ("postgresql://h/db?user=x&password=pw&sslmode=require", "password=***&sslmode"),
        ("host=h password='a b\\'c' user=u", "host=h password=*** user=u"),
        # libpq reads a backslash-escaped space in an unquoted value as part of the value
        ("host=h password=S3c\\ ret user=u", "host=h password=*** user=u"),
        ("http://h:6333?api_key=K&x=1", "api_key=***&x=1"),
        ("{'api_key': 'K', 'timeout': 3}", "{'api_key': '***', 'timeout': 3}"),
        ('{"token": "root:Milvus"}', '{"token": "***"}'),
        ("sslkey=/etc/k.pem key=abc", "sslkey=/etc/k.pem key=***"),
        ("faiss:indexes/key index", "faiss:indexes/key index"),
    ],
)
def test_redact_forms(text, kept, monkeypatch):
    # the patterns alone: secrets remembered from other tests' specs must not decide it
    monkeypatch.setattr(redact_module, "_KNOWN", set())
    assert kept in redact(text)


def test_redact_value_masks_secret_keys_and_strings():
    value = {"api_key": "K", "url": "http://a:b@c", "list": ["token=zz", 3], "ok": None}
    assert redact_value(value) == {
        "api_key": "***",
        "url": "http://a:***@c",
        "list": ["token=***", 3],
        "ok": None,
    }


_HOLD_LOCK = """
import sys, time
from magretrieve.stores import open_store
s = open_store("faiss:" + sys.argv[1], dimension=4)
s.write_metadata({"model_fingerprint": "x"})  # the first write takes the writer lock
s.persist()
print("held", flush=True)
time.sleep(60)
"""


def test_writer_lock_holder_named_without_its_arguments(tmp_path):
    """A second writer is told which process holds the store, by pid and program only: the
    holder's command line may carry an API key or a database password."""
    import subprocess
    import sys

    key, password = secret(), secret()
    script = tmp_path / "hold.py"
    script.write_text(_HOLD_LOCK)
    folder = tmp_path / "store"
    holder = subprocess.Popen(
        [sys.executable, str(script), str(folder), f"postgresql://u:{password}@h/db"]
        + ["--api-key", key],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        s = open_store(f"faiss:{folder}")
        with pytest.raises(StoreError) as err:
            s.add(["a"], np.ones((1, DIM), dtype=np.float32))
        message = str(err.value)
        assert f"pid {holder.pid} (python" in message and "hold.py" in message
        assert key not in message and password not in message and "--api-key" not in message
        s.close()
    finally:
        holder.kill()
        holder.wait()
