"""One add / search / delete / reload sequence on every backend, compared with exact search.

Backends: every entry of the store registry, each through the first exact example spec of
``tests/store_examples.py`` (memory, FAISS, embedded qdrant-client, Qdrant Edge, pgvector on
the PostgreSQL the session starts, Milvus Lite, and any backend registered later). A
registered backend without an example, or whose example cannot run here (a missing extra),
fails instead of quietly shrinking the comparison. Every backend must return the same ids, in
the same order, with the same scores as the exact inner product of the vectors still stored.
"""

from __future__ import annotations

import subprocess
import sys
import uuid

import numpy as np
import pytest
import store_examples

from magretrieve.stores import open_store, registry

DIM = 24
K = 10


def runnable_prefixes() -> list[str]:
    """Every registered backend the session can run (NEEDS_SERVICE ones say where they are
    covered instead)."""
    return [b.prefix for b in registry.backends() if b.prefix not in store_examples.NEEDS_SERVICE]


def hides_after_delete(prefix: str, tmp) -> bool:
    ex = store_examples.exact_example(prefix, tmp / prefix)
    return bool(ex and ex.deletes_hide_others)


def spec_of(prefix: str, tmp) -> tuple[str, dict]:
    ex = store_examples.exact_example(prefix, tmp / prefix)
    assert ex is not None, (
        f"{prefix}: no runnable exact example in tests/store_examples.py (is its extra, or "
        "pgserver, installed?)"
    )
    spec = ex.spec
    if prefix == "pgvector":  # one table per test
        spec = f"{spec.rpartition('#')[0]}#c_{uuid.uuid4().hex[:10]}"
    return spec, dict(ex.options)


def test_every_registered_backend_has_an_example():
    assert store_examples.missing_backends() == []
    assert {"memory", "faiss", "qdrant-local", "qdrant-edge", "pgvector", "milvus"} <= set(
        runnable_prefixes()
    )


def corpus(seed: int = 3):
    rng = np.random.default_rng(seed)
    n = 360
    docs = rng.normal(size=(n, DIM)).astype(np.float32)
    docs *= rng.lognormal(0.0, 0.8, size=(n, 1)).astype(np.float32)  # magnitudes that matter
    queries = rng.normal(size=(30, DIM)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return [f"d{i:03d}" for i in range(n)], docs, queries


def exact(live: dict[str, np.ndarray], queries: np.ndarray, k: int):
    ids = sorted(live)
    mat = np.stack([live[i] for i in ids])
    scores = queries @ mat.T
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return [[ids[j] for j in row] for row in order], np.take_along_axis(scores, order, axis=1)


def check(store, live, queries, where: str, hides: bool = False) -> list[list[str]]:
    """The store's top-K equals exact search; with ``hides`` (a backend whose search loses a
    few live documents after deletes, see tests/store_examples.py) recall@K >= 0.97 and
    every returned score exact instead, and the exact answer is what gets compared."""
    want_ids, want_scores = exact(live, queries, K)
    got = store.search(queries, K, with_vectors=False)
    got_ids = [[h.id for h in row] for row in got]
    if hides:
        found = np.mean([len(set(g) & set(w)) / K for g, w in zip(got_ids, want_ids, strict=True)])
        assert found >= 0.97, (where, found)
        for qi, row in enumerate(got):
            for h in row:
                assert abs(h.score - float(queries[qi] @ live[h.id])) < 2e-4, where
        return want_ids
    assert got_ids == want_ids, where
    np.testing.assert_allclose(
        [[h.score for h in row] for row in got], want_scores, atol=2e-4, err_msg=where
    )
    for row in got:  # doc_norm reported without fetching vectors
        np.testing.assert_allclose(
            [h.doc_norm for h in row], [np.linalg.norm(live[h.id]) for h in row], rtol=1e-5
        )
    return got_ids


def test_same_sequence_same_results_on_every_backend(tmp_path, pg_uri):
    ids, docs, queries = corpus()
    results: dict[str, list] = {}
    for name in runnable_prefixes():
        spec, options = spec_of(name, tmp_path)
        live: dict[str, np.ndarray] = {}
        store = open_store(spec, dimension=DIM, **options)
        # three batches, the third re-adding ten ids of the first with new vectors (upsert)
        for start in (0, 120, 240):
            batch = list(range(start, start + 120))
            store.add([ids[i] for i in batch], docs[batch], [{"i": i} for i in batch])
            live.update({ids[i]: docs[i] for i in batch})
        again = list(range(10))
        store.add([ids[i] for i in again], docs[again] * 3.0, [{"i": -i} for i in again])
        live.update({ids[i]: docs[i] * 3.0 for i in again})
        store.optimize()
        assert store.count() == len(ids), name
        first = check(store, live, queries, f"{name} after add")
        # delete the current top hit of every query and a few unknown ids
        gone = sorted({row[0] for row in first})
        assert store.delete([*gone, "not-stored"]) == len(gone), name
        for doc_id in gone:
            del live[doc_id]
        assert store.count() == len(live), name
        hides = hides_after_delete(name, tmp_path)
        after_delete = check(store, live, queries, f"{name} after delete", hides)
        probe = next(i for i in again[1:] if ids[i] in live)
        rec = store.get([ids[probe], gone[0]])
        assert rec[0].payload == {"i": -probe} and rec[1] is None, name
        np.testing.assert_allclose(rec[0].vector, docs[probe] * 3.0, rtol=1e-6, err_msg=name)
        store.write_metadata({"model_fingerprint": "congruence", "mode": "qnorm"})
        store.persist()
        if not registry.backend_for(spec)[0].persists(registry.backend_for(spec)[1]):
            results[name] = [first, after_delete, after_delete]
            store.close()
            continue
        store.close()
        # reload: a fresh handle on the same data
        store = open_store(spec, **options)
        assert store.count() == len(live), name
        assert store.read_metadata() == {"model_fingerprint": "congruence", "mode": "qnorm"}
        reloaded = check(store, live, queries, f"{name} after reload", hides)
        store.close()
        results[name] = [first, after_delete, reloaded]
    reference = results["memory"]
    for name, got in results.items():
        assert got == reference, f"{name} differs from memory"


@pytest.mark.parametrize("backend", ["pgvector", "milvus"])
def test_reload_in_a_new_process(tmp_path, pg_uri, backend):
    ids, docs, queries = corpus(seed=4)
    spec, options = spec_of(backend, tmp_path)
    with open_store(spec, dimension=DIM, **options) as store:
        store.add(ids, docs)
        store.persist()
    want, _ = exact(dict(zip(ids, docs, strict=True)), queries[:3], 5)
    code = (
        "import sys, json, numpy as np\n"
        "from magretrieve.stores import open_store\n"
        "q = np.array(json.loads(sys.argv[2]), dtype=np.float32)\n"
        "s = open_store(sys.argv[1])\n"
        "print(json.dumps([[h.id for h in row] for row in s.search(q, 5)]))\n"
        "s.close()\n"
    )
    import json

    out = subprocess.run(
        [sys.executable, "-c", code, spec, json.dumps(queries[:3].tolist())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == want


def test_optional_packages_are_not_imported_by_the_core_or_serving_path(tmp_path):
    code = (
        "import sys, numpy as np\n"
        "import magretrieve\n"
        "from magretrieve import Retriever, open_store\n"
        "from magretrieve.stores import registry\n"
        "from magretrieve.cli import main\n"
        "registry.backends()  # every backend module registered, pgvector and milvus too\n"
        f"s = open_store('faiss:{tmp_path / 'f'}', dimension=4)\n"
        "s.add(['a'], np.ones((1, 4), dtype=np.float32)); s.search(np.ones((1, 4)), 1)\n"
        "bad = ('psycopg', 'pgvector', 'pymilvus', 'milvus_lite', 'langchain_core',\n"
        "       'llama_index', 'haystack', 'chromadb', 'lancedb', 'scann', 'pgserver', 'ray',\n"
        "       'torch')\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] in bad)) or 'clean')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"
    # the extras are real: their backends are registered and their packages installed here
    from magretrieve.stores import registry

    prefixes = {b.prefix: b.extra for b in registry.backends()}
    assert prefixes["pgvector"] == "pgvector" and prefixes["milvus"] == "milvus"
    assert prefixes["scann"] == "scann"
