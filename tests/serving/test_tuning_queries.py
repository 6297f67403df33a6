"""Tuning ANN recall on queries like the user's: the samples, ``--tuning-queries``, ``recall``.

The encoder is test_retriever's FakeEncoder (hashed word vectors; longer texts get larger
norms), substituted at ``magretrieve.serving.retriever.load_encoder`` as in test_index_cli.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from magretrieve.core import similarity
from magretrieve.stores import _ann_recall, open_store
from magretrieve.stores._ann_recall import PSEUDO, SYNTHETIC, USER, TuningQueries
from tests.support.ann_data import search_indexes_at_every_size
from tests.support.cli import run
from tests.support.fake_encoder import FakeEncoder

VOCAB = [f"w{i}" for i in range(400)]


def write_corpus(path: Path, n: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    with path.open("w") as fh:
        for i in range(n):
            words = " ".join(rng.choice(VOCAB, size=int(rng.integers(4, 24))))
            title = " ".join(rng.choice(VOCAB, size=3))
            fh.write(json.dumps({"_id": f"p{i}", "title": title, "text": words}) + "\n")
    return path


def query_texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(VOCAB, size=int(rng.integers(2, 6)))) for _ in range(n)]


def max_cosine(queries: np.ndarray, docs: np.ndarray, held: list[frozenset]) -> float:
    """Mean over queries of the largest cosine to a stored vector not held out."""
    u = docs / np.linalg.norm(docs, axis=1, keepdims=True)
    q = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    cos = q @ u.T
    for i, h in enumerate(held):
        cos[i, list(h)] = -1.0
    return float(cos.max(axis=1).mean())


def exact_ids(
    queries: np.ndarray, ids: list[str], docs: np.ndarray, k: int = 10
) -> list[list[str]]:
    """Exact inner-product top-k by a full sort (independent of magretrieve's top-k code)."""
    scores = queries.astype(np.float64) @ docs.astype(np.float64).T
    return [[ids[j] for j in np.argsort(-row, kind="stable")[:k]] for row in scores]


def test_synthetic_sample_sits_further_from_stored_points_than_the_old_one():
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((20, 32))
    docs = (centers[rng.integers(20, size=3000)] + 0.6 * rng.standard_normal((3000, 32))).astype(
        np.float32
    ) * rng.lognormal(0, 0.3, size=(3000, 1)).astype(np.float32)
    old, old_src = _ann_recall.perturbed_sample(docs, 300, 0, _ann_recall.SOURCE_COSINE)
    new, new_rows = _ann_recall.synthetic_sample(docs, 300, 0)
    before = max_cosine(old, docs, [frozenset(r) for r in old_src])
    after = max_cosine(new, docs, [frozenset(r) for r in new_rows])
    assert after < before - 0.05, (before, after)
    # every mixture query holds out each of its sources
    assert {len(r) for r in new_rows} == {1, _ann_recall.MIX_PARTS}
    # the sample measure() uses by default is that one, and says so
    q, held, kind = _ann_recall.sample_queries(docs, 300, 0)
    assert kind == SYNTHETIC and len(q) == 300


def test_pseudo_queries_are_mixed_with_a_quarter_of_synthetic_ones():
    rng = np.random.default_rng(1)
    docs = rng.standard_normal((500, 16)).astype(np.float32)
    ids = [f"d{i}" for i in range(500)]
    given = TuningQueries(rng.standard_normal((120, 16)), PSEUDO, [f"d{i}" for i in range(120)])
    q, held, kind = _ann_recall.sample_queries(docs, 400, 0, given, ids)
    assert kind == f"{PSEUDO} + {SYNTHETIC}" and len(q) == 160  # 120 + 40
    assert sum(1 for h in held if len(h) == 1 and next(iter(h)) in set(given.sources)) >= 120
    # the user's queries (enough of them) are used alone, held out of nothing
    user = TuningQueries(rng.standard_normal((30, 16)), USER)
    q, held, kind = _ann_recall.sample_queries(docs, 400, 0, user, ids)
    assert kind == USER and len(q) == 30 and all(not h for h in held)


def test_tuning_query_files_both_forms_and_bad_files(tmp_path):
    from magretrieve.core.errors import DataError
    from magretrieve.serving.tuning_queries import read_query_texts

    text = tmp_path / "q.txt"
    text.write_text("statins and heart\n\n  brain protein  \n")
    assert read_query_texts(text) == ["statins and heart", "brain protein"]
    beir = tmp_path / "queries.jsonl"
    beir.write_text('{"_id": "1", "text": "a b"}\n{"_id": "2", "text": "c"}\n')
    assert read_query_texts(beir) == ["a b", "c"]
    bad_utf8 = tmp_path / "bad.txt"
    bad_utf8.write_bytes(b"fine\n\xff\xfe broken\n")
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"_id": "1", "text": "a"}\n{"_id": "2", "text": \n')
    no_text = tmp_path / "nt.jsonl"
    no_text.write_text('{"_id": "1", "text": "a"}\n{"_id": "2"}\n')
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    for path, needle in [
        (bad_utf8, f"{bad_utf8}:2: not valid UTF-8"),
        (bad_json, f"{bad_json}:2: malformed JSON"),
        (no_text, f"{no_text}:2:"),
        (empty, f"{empty}: no queries"),
        (tmp_path / "missing.txt", f"{tmp_path / 'missing.txt'}: file not found"),
    ]:
        with pytest.raises(DataError) as err:
            read_query_texts(path)
        assert needle in str(err.value) and "\n" not in str(err.value), err.value


def test_a_pseudo_query_is_never_a_text_a_search_would_refuse():
    """A title or span of zero-width characters is nothing to encode (``core.text.blank``):
    it is never chosen as a pseudo-query, and a document of such text makes none."""
    import random

    from magretrieve.core.text import blank
    from magretrieve.data.readers import Document
    from magretrieve.serving.tuning_queries import pseudo_query

    rng = random.Random(0)
    invisible = Document("d1", "\u200b \u2060\u200b", title="\ufeff\u200b")
    assert [pseudo_query(invisible, rng) for _ in range(20)] == [None] * 20
    titled = Document("d2", "\u200b \u2060", title="statins and the heart")
    assert {pseudo_query(titled, rng) for _ in range(20)} == {"statins and the heart"}
    mixed = Document("d3", "statins lower cholesterol", title="\u2060")
    made = {pseudo_query(mixed, rng) for _ in range(20)}
    assert made and not any(t is None or blank(t) for t in made)


def test_index_tunes_on_pseudo_queries_by_default_and_on_the_users_when_given(
    use_fake, tmp_path, monkeypatch
):
    search_indexes_at_every_size(monkeypatch)  # 600 documents: the index answers
    use_fake["dim"] = 32
    corpus = write_corpus(tmp_path / "c.jsonl", 600)
    spec = f"faiss:{tmp_path / 'a'}"
    args = ["--faiss-index", "hnsw", "--hnsw-m", "8", "--target-recall", "0.99", "--no-progress"]
    res = run("index", "EXPORT", str(corpus), "--store", spec, *args)
    assert res.exit_code == 0, res.output
    rec = open_store(spec).describe()["parameters"]["recall"]
    assert rec["query_kind"] == f"{PSEUDO} + {SYNTHETIC}", rec
    queries = tmp_path / "queries.jsonl"
    queries.write_text(
        "".join(
            json.dumps({"_id": str(i), "text": t}) + "\n" for i, t in enumerate(query_texts(60, 5))
        )
    )
    spec_b = f"faiss:{tmp_path / 'b'}"
    res = run(
        "index", "EXPORT", str(corpus), "--store", spec_b, *args, "--tuning-queries", str(queries)
    )
    assert res.exit_code == 0, res.output
    rec = open_store(spec_b).describe()["parameters"]["recall"]
    assert rec["query_kind"] == USER and rec["queries"] == 30, rec


def test_bad_tuning_queries_file_is_refused_before_a_store_is_made(use_fake, tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", 20)
    bad = tmp_path / "q.txt"
    bad.write_bytes(b"ok\n\xff\n")
    spec = f"faiss:{tmp_path / 'x'}"
    use_fake["fail_after"] = 0  # any encoding would fail: the refusal must come first
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--tuning-queries", str(bad))
    assert res.exit_code == 1 and f"{bad}:2: not valid UTF-8" in res.output, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_recall_command_shows_its_query_encoding_progress(use_fake, tmp_path):
    """A query file may hold 100,000 lines: ``recall`` encodes them with a progress bar, and
    keeps ``--json`` output free of one."""
    use_fake["dim"] = 32
    spec = f"faiss:{tmp_path / 'p'}"
    corpus = write_corpus(tmp_path / "c.jsonl", 50)
    assert run("index", "EXPORT", str(corpus), "--store", spec, "--no-progress").exit_code == 0
    qfile = tmp_path / "q.txt"
    qfile.write_text("\n".join(query_texts(5, 3)) + "\n")
    for extra, label in (([], "queries"), (["--json"], False)):
        use_fake["encoders"] = []
        res = run("recall", "EXPORT", "--store", spec, "--queries", str(qfile), *extra)
        assert res.exit_code == 0, res.output
        asked = [p for enc in use_fake["encoders"] for p in enc.query_progress]
        assert asked == [label], asked


def test_recall_command_matches_an_independent_exact_computation(use_fake, tmp_path, monkeypatch):
    search_indexes_at_every_size(monkeypatch)  # 1,500 documents: the index answers
    use_fake["dim"] = 32
    corpus = write_corpus(tmp_path / "c.jsonl", 1500)
    spec = f"faiss:{tmp_path / 'h'}"
    res = run(
        "index", "EXPORT", str(corpus), "--store", spec, "--no-progress",
        "--faiss-index", "hnsw", "--hnsw-m", "4", "--ef-construction", "8",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    texts = query_texts(80, 9)
    qfile = tmp_path / "q.txt"
    qfile.write_text("\n".join(texts) + "\n")
    res = run(
        "recall", "EXPORT", "--store", spec, "--queries", str(qfile), "--ef-search", "10", "--json"
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    # independent: encode, read every stored vector, sort all scores
    enc = FakeEncoder("qnorm", "a" * 64, 32)
    q = similarity.query_vectors(enc.raw(texts), enc.manifest.similarity)
    store = open_store(spec, ef_search=10)
    ids = sorted(store.iter_ids())
    docs = store.get_vectors(ids)
    truth = exact_ids(q, ids, docs)
    found = [[h.id for h in row] for row in store.search(q, 10)]
    expected = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)])
    store.close()
    assert out["recall_at_10"] == pytest.approx(expected, abs=1e-4) and out["queries"] == 80
    assert out["recall_at_10"] < 0.99 and out["ef_search"] == 10  # a poor graph at ef 10
    # with a target: the setting found on half the queries is reported, the store unchanged
    res = run(
        "recall", "EXPORT", "--store", spec, "--queries", str(qfile), "--target", "0.99", "--json"
    )
    assert res.exit_code == 0, res.output
    tuned = json.loads(res.output)
    assert tuned["setting"]["ef_search"] > 10 and tuned["held_out_queries"] == 40
    assert tuned["held_out_recall"] > out["recall_at_10"]
    assert open_store(spec).parameters()["ef_search"] == tuned["ef_search"]  # unchanged
    # plain output: one line per finding
    res = run("recall", "EXPORT", "--store", spec, "--queries", str(qfile))
    assert res.exit_code == 0 and "against exact inner product on 80 queries" in res.output
    res = run("recall", "EXPORT", "--store", spec, "--queries", str(tmp_path / "nope.txt"))
    assert res.exit_code == 1 and "nope.txt: file not found" in res.output


def test_open_store_tuning_queries_retunes_a_built_index(tmp_path, monkeypatch):
    search_indexes_at_every_size(monkeypatch)  # 2,000 vectors: the index answers
    rng = np.random.default_rng(2)
    docs = rng.standard_normal((2000, 16)).astype(np.float32)
    ids = [f"d{i}" for i in range(2000)]
    spec = f"faiss:{tmp_path / 'h'}"
    s = open_store(spec, dimension=16, index_type="hnsw", hnsw_m=8, target_recall=0.95)
    s.add(ids, docs)
    s.optimize()
    s.persist()
    assert s.describe()["parameters"]["recall"]["query_kind"] == SYNTHETIC
    s.close()
    q = rng.standard_normal((50, 16)).astype(np.float32)
    s = open_store(spec, target_recall=0.95, tuning_queries=q)
    assert s.describe()["parameters"]["recall"]["query_kind"] == USER
    s.close()
    from magretrieve.core.errors import StoreError

    with pytest.raises(StoreError, match="8 dimensions, the store 16"):
        open_store(spec, tuning_queries=q[:, :8])
    with pytest.raises(StoreError, match="open_store takes tuning query vectors"):
        open_store(spec, tuning_queries=str(tmp_path / "q.txt"))


def test_pseudo_query_tuning_meets_the_target_on_held_out_real_like_queries(
    use_fake, tmp_path, monkeypatch
):
    """Tuned on pseudo-queries from the corpus (no user query seen), a sparse graph asked for
    0.99 delivers at least 0.985 on queries it never saw."""
    search_indexes_at_every_size(monkeypatch)  # the index answers at this size
    use_fake["dim"] = 32
    corpus = write_corpus(tmp_path / "c.jsonl", 4000, seed=3)
    spec = f"faiss:{tmp_path / 'h'}"
    res = run(
        "index", "EXPORT", str(corpus), "--store", spec, "--no-progress",
        "--faiss-index", "hnsw", "--hnsw-m", "6", "--ef-construction", "40",
        "--target-recall", "0.99",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    enc = FakeEncoder("qnorm", "a" * 64, 32)
    texts = query_texts(300, 11)
    q = similarity.query_vectors(enc.raw(texts), enc.manifest.similarity)
    store = open_store(spec)
    ids = sorted(store.iter_ids())
    truth = exact_ids(q, ids, store.get_vectors(ids))
    found = [[h.id for h in row] for row in store.search(q, 10)]
    delivered = np.mean([len(set(f) & set(t)) / 10 for f, t in zip(found, truth, strict=True)])
    rec = store.describe()["parameters"]["recall"]
    assert rec["query_kind"].startswith(PSEUDO) and rec["target_met_on_tuning_queries"]
    assert delivered >= 0.985, (rec, delivered)


@pytest.mark.parametrize(
    ("prefix", "flags", "knob"),
    [
        ("faiss", ["--faiss-index", "ivf"], "nprobe"),
        ("scann", ["--scann-exact-below", "100"], "leaves_to_search"),
        ("qdrant-edge", [], "ef_search"),
    ],
)
def test_recall_command_finds_each_stores_knob(use_fake, tmp_path, prefix, flags, knob):
    use_fake["dim"] = 32
    corpus = write_corpus(tmp_path / "c.jsonl", 1200)
    spec = f"{prefix}:{tmp_path / 's'}"
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--no-progress", *flags)
    assert res.exit_code == 0, res.output
    qfile = tmp_path / "q.txt"
    qfile.write_text("\n".join(query_texts(60, 4)) + "\n")
    res = run(
        "recall", "EXPORT", "--store", spec, "--queries", str(qfile), "--target", "0.95", "--json"
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert knob in out["setting"] and out["held_out_queries"] == 30, out
    assert 0 < out["recall_at_10"] <= 1 and out["reached"] is True
