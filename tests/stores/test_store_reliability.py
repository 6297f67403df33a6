"""Hostile and careless input against every store: the same kind of answer everywhere.

NUL characters, integers beyond 64 bits, quotes in ids and payload fields named like the
stores' own columns are stored or refused with one line, identically on every registered
backend, and nothing stored changes on a refusal. Names a database would truncate or
normalize (pgvector tables over 63 bytes, Milvus and Qdrant collection names) are refused
naming the limit; unparsable ``qdrant:`` URLs are one line; a Milvus server's hit layout
(``id`` instead of ``doc_id``) is read; Milvus Lite leaves the terminal clean; small-batch
indexing into pgvector works (its connection is shared by the indexing threads).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest

from magretrieve.core.errors import StoreError
from magretrieve.stores import open_store, parse_spec, registry
from tests.support import store_examples
from tests.support.cli import run
from tests.support.fake_encoder import LOAD_IN_CHILD, write_corpus

DIM = 6


def runnable() -> list[str]:
    return [b.prefix for b in registry.backends() if b.prefix not in store_examples.NEEDS_SERVICE]


@pytest.fixture(params=runnable())
def store(request, tmp_path):
    ex = store_examples.exact_example(request.param, tmp_path)
    assert ex is not None, f"{request.param}: no runnable example (extra or pgserver missing?)"
    s = open_store(ex.spec, dimension=DIM, **ex.options)
    rng = np.random.default_rng(0)
    s.add(["base-1", "base-2"], rng.normal(size=(2, DIM)).astype(np.float32), [{"a": 1}, {}])
    yield s
    s.close()


def vecs(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, DIM)).astype(np.float32)


def _nested(levels: int) -> dict:
    out: dict = {}
    inner = out
    for _ in range(levels):
        inner["d"] = {}
        inner = inner["d"]
    return out


REFUSED = [
    (["ok", "a\x00b"], None, "NUL character"),
    (["ok", "big"], [{}, {"n": 2**70}], "outside the 64-bit range"),
    (["ok", "neg"], [{}, {"n": -(2**63) - 1}], "outside the 64-bit range"),
    (["ok", "nul-value"], [{}, {"text": "a\x00b"}], "NUL character"),
    (["ok", "nul-key"], [{}, {"k\x00": 1}], "NUL character"),
    (["ok", "deep"], [{}, {"d": _nested(40)}], "nested more than 32 levels"),
    (["ok", "surrogate"], [{}, {"note": "a\udc80"}], r"field 'note'.*lone surrogate at position 1"),
    (["ok", "surrogate-key"], [{}, {"x": {"\ud800": 1}}], r"field 'x'.*lone surrogate"),
    (["ok", "nested"], [{}, {"x": [{"y": 2**64}]}], r"field 'x\[0\]\.y'"),
    (["ok", "reserved"], [{}, {"doc_id": "other"}], "reserved"),
    (["ok", "reserved"], [{}, {"doc_norm": 3.0}], "reserved"),
]


@pytest.mark.parametrize(("ids", "payloads", "message"), REFUSED)
def test_unstorable_input_is_refused_alike_and_nothing_changes(store, ids, payloads, message):
    before = {r.id: r.payload for r in store.get(["base-1", "base-2"])}
    with pytest.raises(StoreError, match=message) as info:
        store.add(ids, vecs(len(ids)), payloads)
    assert "\n" not in str(info.value)
    assert store.count() == 2
    assert store.existing(["ok", *ids]) == set()
    assert {r.id: r.payload for r in store.get(["base-1", "base-2"])} == before


def test_odd_search_and_vector_input_answered_alike(store):
    """No queries: no answers (without asking the backend). A k beyond every count: all the
    documents, or the store's own stated limit. Vectors that are not numbers, or an id one
    byte over the store's limit: one StoreError, nothing written."""
    assert store.search(np.zeros((0, DIM), dtype=np.float32), 3) == []
    if store.max_k is None:
        assert len(store.search(vecs(1)[0], 2**40)[0]) == 2
    else:
        with pytest.raises(StoreError, match=f"returns at most {store.max_k} hits"):
            store.search(vecs(1)[0], 2**40)
    for bad in ([["a"] * DIM], [[1.0] * DIM, [1.0]]):
        with pytest.raises(StoreError, match="vectors must be numbers"):
            store.add(["x", "y"][: len(bad)], bad)
    with pytest.raises(StoreError, match="query vectors must be numbers"):
        store.search([["a"] * DIM], 1)
    if store.max_id_bytes is not None:
        with pytest.raises(StoreError, match=f"longer than {store.max_id_bytes} bytes"):
            store.add(["é" * (store.max_id_bytes // 2 + 1)], vecs(1))
    assert store.count() == 2


def test_quotes_and_column_names_are_stored_and_read_back_alike(store):
    ids = ["it's", 'say "hi"', "back\\slash", "[x]", "a,b", "line\u2028sep", "tab\there"]
    payloads = [
        {"payload": {"nested": True}, "vector": [1, 2], "embedding": "e", "id": 7},
        {"text": 'it\'s "quoted" \\ and ] [', "n": 2**63 - 1, "m": -(2**63)},
        {"distance": 0.5, "score": "s"},
        {},
        {"doc_id_x": 1},
        {"u": "\u2028\u0085"},
        {"nul_looking": "\\x00 \\u0000"},
    ]
    v = vecs(len(ids), seed=3)
    assert store.add(ids, v, payloads) == len(ids)
    assert store.count() == 2 + len(ids)
    got = store.get(ids)
    for doc_id, rec, payload, vec in zip(ids, got, payloads, v, strict=True):
        assert rec is not None and rec.id == doc_id
        assert rec.payload == payload
        np.testing.assert_allclose(rec.vector, vec, rtol=1e-5)
    hits = store.search(v[0], 3, with_vectors=False)[0]
    assert hits[0].id == ids[0] and hits[0].payload == payloads[0]
    assert store.delete(ids[:3]) == 3
    assert store.existing(ids) == set(ids[3:])


# ----------------------------------------------------------------------------- identifiers


@pytest.mark.integration
def test_pgvector_table_names_postgres_would_truncate_are_refused(pg_uri):
    ok = "t" * 55 + uuid.uuid4().hex[:8]  # 63 bytes: kept
    assert len(ok.encode()) == 63
    with open_store(f"pgvector:{pg_uri}#{ok}", dimension=DIM) as s:
        s.add(["a"], vecs(1))
    for name in ("t" * 64, "é" * 32, f"public.{'x' * 64}"):  # 64 bytes, 64 bytes in UTF-8
        with pytest.raises(StoreError, match="at most 63 bytes") as info:
            open_store(f"pgvector:{pg_uri}#{name}", dimension=DIM)
        assert "\n" not in str(info.value)
    # two long names sharing their first 63 bytes stay two (refused) tenants, not one table
    with pytest.raises(StoreError, match="truncate"):
        open_store(f"pgvector:{pg_uri}#{ok}X", dimension=DIM)


@pytest.mark.parametrize(
    "name", ["bad-name", "1starts_with_digit", "has space", "a" * 256, "dot.name", "é"]
)
def test_milvus_collection_names_milvus_rejects_are_refused_before_opening(tmp_path, name):
    db = tmp_path / "m.db"
    with pytest.raises(StoreError, match="not a Milvus name") as info:
        parse_spec(f"milvus:{db}/{name}")
    assert "\n" not in str(info.value)
    assert not db.exists()


@pytest.mark.parametrize("name", ["a/b", "a:b", 'q"', "x" * 256, " lead", "..", "a\\b", "a?b"])
def test_qdrant_collection_names_qdrant_changes_or_rejects_are_refused(tmp_path, name):
    for spec in (f"qdrant-memory:{name}", f"qdrant:http://127.0.0.1:6333/{name}"):
        if "/" in name and spec.startswith("qdrant:"):
            continue  # a slash splits URL from collection: the collection is "b"
        with pytest.raises(StoreError, match="not a Qdrant name"):
            parse_spec(spec)


@pytest.mark.parametrize(
    "spec",
    [
        "qdrant:http://[::1/c",
        "qdrant:http://host:port/c",
        "qdrant:http://host:99999999/c",
        "qdrant:ftp://host/c",
        "qdrant:http:///c",
        "qdrant:http://u:p@/c",
    ],
)
def test_unparsable_qdrant_urls_are_one_line(spec):
    with pytest.raises(StoreError) as info:
        open_store(spec, dimension=DIM)
    message = str(info.value)
    assert "\n" not in message and ("Qdrant" in message or "qdrant" in message)


# ----------------------------------------------------------------------------- Milvus


def test_milvus_server_hits_name_the_primary_key_id(tmp_path):
    """A Milvus server returns the key as ``hit["id"]``; Milvus Lite as ``hit["doc_id"]``."""
    from magretrieve.stores.milvus_store import hit_id

    with open_store(f"milvus:{tmp_path / 'm.db'}/docs", dimension=DIM) as s:
        v = vecs(3)
        s.add(["x", "y", "z"], v, [{"n": 0}, {"n": 1}, {"n": 2}])
        real = s.client.search

        def server_shaped(*args, **kwargs):
            out = real(*args, **kwargs)
            return [
                [
                    {
                        "id": h["doc_id"],
                        "distance": h["distance"],
                        "entity": {k: w for k, w in h["entity"].items() if k != "doc_id"},
                    }
                    for h in row
                ]
                for row in out
            ]

        s.client.search = server_shaped
        hits = s.search(v[1], 2, with_vectors=False)[0]
        assert hits[0].id == "y" and hits[0].payload == {"n": 1}
    assert hit_id({"id": 5, "distance": 1.0}) == "5"
    assert hit_id({"distance": 1.0, "entity": {"doc_id": "e"}}) == "e"
    with pytest.raises(StoreError, match="without a primary key"):
        hit_id({"distance": 1.0, "entity": {}})


def test_new_milvus_lite_db_leaves_the_terminal_clean(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 40)
    code = (
        "import sys\n"
        + LOAD_IN_CHILD
        + "import magretrieve.serving.retriever as r\n"
        + "r.load_encoder = lambda *a, **k: FakeEncoder('qnorm', 'a' * 64, 24)\n"
        + "from magretrieve.cli import main\n"
        + "main(sys.argv[1:])\n"
    )
    spec = f"milvus:{tmp_path / 'new.db'}/docs"
    args = ["index", "EXPORT", str(corpus), "--store", spec, "--batch-size", "16"]
    out = subprocess.run(
        [sys.executable, "-c", code, *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.returncode == 0, out.stderr
    assert "40 added" in out.stdout
    assert out.stderr == ""


# ----------------------------------------------------------------------------- pgvector


@pytest.mark.integration
def test_small_batches_index_into_pgvector(use_fake, tmp_path, pg_uri):
    """The indexing reader thread asks ``existing`` while the writer adds, on one connection."""
    corpus = write_corpus(tmp_path / "c.jsonl", 300)
    spec = f"pgvector:{pg_uri}#small_{uuid.uuid4().hex[:8]}"
    res = run(
        "index", "EXPORT", str(corpus), "--store", spec, "--batch-size", "16", "--no-progress"
    )
    assert res.exit_code == 0, res.output
    assert "300 added, 0 already stored, 300 in store" in res.output
    res = run(
        "index", "EXPORT", str(corpus), "--store", spec, "--batch-size", "16", "--no-progress"
    )
    assert res.exit_code == 0, res.output
    assert "0 added, 300 already stored, 300 in store" in res.output


@pytest.mark.integration
def test_pgvector_store_serializes_threads_on_its_connection(pg_uri):
    import threading

    with open_store(f"pgvector:{pg_uri}#thr_{uuid.uuid4().hex[:8]}", dimension=DIM) as s:
        errors: list[BaseException] = []
        ids = [f"d{i}" for i in range(400)]
        v = vecs(400)

        def reader() -> None:
            try:
                for n in range(0, 400, 8):
                    s.existing(ids[n : n + 8])
                    s.count()
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=reader)
        t.start()
        for n in range(0, 400, 16):
            s.add(ids[n : n + 16], v[n : n + 16])
        t.join()
        assert errors == []
        assert s.count() == 400


def test_refusals_on_the_cli_are_one_line(use_fake, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"_id": "a\u0000b", "text": "hello"}) + "\n")
    res = run("index", "EXPORT", str(corpus), "--store", f"faiss:{tmp_path / 'f'}", "--no-progress")
    assert res.exit_code == 1
    assert "Traceback" not in res.output


@pytest.mark.parametrize("kind", ["memory", "faiss"])
def test_a_state_file_with_an_infinite_number_is_one_store_error(tmp_path, kind):
    """JSON lets ``Infinity`` through; ``int(inf)`` overflows. The reader names the state file
    instead of raising OverflowError."""
    folder = tmp_path / kind
    store = open_store(f"{kind}:{folder}", dimension=2)
    store.add(["a"], [[1.0, 0.0]])
    store.persist()
    store.close()
    state_file = folder / f"{kind}_store.json"
    state = json.loads(state_file.read_text())
    state["dimension"] = float("inf")
    state_file.write_text(json.dumps(state))  # json.dumps writes Infinity
    with pytest.raises(StoreError, match=f"{kind}_store.json"):
        open_store(f"{kind}:{folder}")
