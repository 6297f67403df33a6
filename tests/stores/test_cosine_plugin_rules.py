"""The cosine plug-in stores (an annotated Qdrant Cosine collection, an annotated pgvector
table ranked by cosine) are stores like any other: the base's id, payload, query and error
rules apply to them word for word, and ``magretrieve annotate`` drives them through the one
declared protocol, :class:`~magretrieve.stores.annotation.AnnotatableStore`.

Each collection is made the way another pipeline would: integer point ids, no ``doc_id``,
vectors of norm 1, 2 or 3 under a cosine metric.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from magretrieve.core.errors import StoreError
from magretrieve.priors import HubPrior
from magretrieve.priors.annotate import annotate_store
from magretrieve.stores import open_store
from magretrieve.stores.annotation import AnnotatableStore
from magretrieve.stores.memory_store import MemoryStore

DIM = 8
N = 40


def directions(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    units = rng.normal(size=(N, DIM))
    return (units / np.linalg.norm(units, axis=1, keepdims=True)).astype(np.float32)


def qdrant_cosine(folder, units: np.ndarray) -> str:
    from qdrant_client import QdrantClient, models

    client = QdrantClient(path=str(folder))
    client.create_collection(
        "theirs", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE)
    )
    client.upsert(
        "theirs",
        points=[
            models.PointStruct(
                id=i, vector=(units[i] * (1 + i % 3)).tolist(), payload={"title": f"t{i}"}
            )
            for i in range(N)
        ],
    )
    client.close()
    return f"qdrant-local:{folder}/theirs"


def pgvector_cosine(pg_uri: str, units: np.ndarray) -> str:
    import psycopg
    from pgvector.psycopg import register_vector

    name = "items_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_uri, autocommit=True) as conn:
        register_vector(conn)
        conn.execute(
            f"CREATE TABLE {name} (id bigserial PRIMARY KEY, title text, embedding vector({DIM}))"
        )
        conn.execute(f"CREATE INDEX ON {name} USING hnsw (embedding vector_cosine_ops)")
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {name} (id, title, embedding) VALUES (%s, %s, %s)",
                [(i, f"t{i}", units[i] * (1 + i % 3)) for i in range(N)],
            )
    return f"pgvector:{pg_uri}#{name}"


@pytest.fixture(
    params=["qdrant", pytest.param("pgvector", marks=pytest.mark.integration)],
)
def annotated(request, tmp_path):
    """(an annotated cosine store searched with a prefetch of every point, its directions)."""
    units = directions()
    if request.param == "qdrant":
        spec = qdrant_cosine(tmp_path / "q", units)
    else:
        spec = pgvector_cosine(request.getfixturevalue("pg_uri"), units)
    annotate_store(spec, prior=HubPrior(0.5, 5), progress=False)
    with open_store(spec, prefetch=N) as store:
        assert isinstance(store, AnnotatableStore)
        yield store, units


def magnitudes(store) -> np.ndarray:
    records = store.get([str(i) for i in range(N)])
    return np.array([float(np.linalg.norm(r.vector)) for r in records])


def refusal(store, call) -> str:
    """The one-line StoreError ``call(store)`` raises, without the store's own location."""
    with pytest.raises(StoreError) as info:
        call(store)
    text = str(info.value)
    assert "\n" not in text
    return text.removeprefix(f"{store.location}: ")


def reference_store() -> MemoryStore:
    store = MemoryStore(DIM)
    store.add([str(i) for i in range(N)], directions())
    return store


# ----------------------------------------------------------------------------- ids


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.delete([3]),
        lambda s: s.delete(["4", 4]),
        lambda s: s.delete("12"),
        lambda s: s.delete([None]),
        lambda s: s.get([b"5"]),
        lambda s: s.get("5"),
        lambda s: s.existing([5.0]),
    ],
    ids=["int", "str-and-int", "one-string", "none", "bytes", "get-one-string", "float"],
)
def test_bad_ids_are_refused_in_one_line_like_every_store(annotated, call):
    store, _ = annotated
    before = store.count()
    assert refusal(store, call) == refusal(reference_store(), call)
    # nothing was deleted, not even the valid ids beside a bad one ("4") or the digits of
    # one string ("1", "2": a hand-made str() of each id would have removed both)
    assert store.count() == before
    assert store.existing(["1", "2", "3", "4"]) == {"1", "2", "3", "4"}


def test_delete_get_existing_take_string_ids_and_skip_ids_no_store_holds(annotated):
    store, _ = annotated
    assert store.delete(["3", "3", "", "a\x00b", "\ud800", "nope"]) == 1
    assert store.count() == N - 1
    assert store.get(["3", "7", "\x00", "7"])[0] is None
    rec = store.get(["3", "7", "\x00", "7"])
    assert rec[1].id == rec[3].id == "7" and rec[2] is None
    assert rec[1].payload == {"title": "t7"}
    assert store.existing(["3", "7", "", "7", "nope"]) == {"7"}
    assert store.delete([]) == 0 and store.count() == N - 1
    assert sorted(store.iter_ids(), key=int) == [str(i) for i in range(N) if i != 3]


# ----------------------------------------------------------------------------- payloads, vectors


@pytest.mark.parametrize(
    ("ids", "payloads"),
    [
        ([1], None),
        (["a", "a"], None),
        (["a"], [{"doc_id": "b"}]),
        (["a"], [{"doc_norm": 2.0}]),
        (["a"], [{"score": float("nan")}]),
        (["a"], [{"when": object()}]),
        (["a"], ["not a dict"]),
        (["a\x00"], None),
    ],
    ids=["int-id", "duplicate", "doc_id", "doc_norm", "nan", "object", "not-a-dict", "nul"],
)
def test_bad_batches_are_refused_like_every_store_and_nothing_is_written(annotated, ids, payloads):
    store, _ = annotated
    vectors = np.ones((len(ids), DIM), dtype=np.float32)

    def add(s):
        return s.add(ids, vectors, payloads)

    assert refusal(store, add) == refusal(reference_store(), add)
    assert store.count() == N and store.existing(["a"]) == set()


def test_adding_documents_follows_each_backends_rule(annotated):
    """Qdrant: ``d̂`` with m = ‖v‖ in the payload (zero vectors and the m field refused);
    pgvector: the table's own pipeline writes rows, so every add is refused, one line."""
    store, units = annotated
    vector = (units[0] * 25.0)[None, :]  # m far above any prior's
    if store.kind == "pgvector-cosine":
        assert "your own pipeline" in refusal(store, lambda s: s.add(["x"], vector))
        assert store.count() == N
        return
    zero = np.zeros((1, DIM), dtype=np.float32)
    assert "zero vector" in refusal(store, lambda s: s.add(["x"], zero))
    held = refusal(store, lambda s: s.add(["x"], vector, [{store.field: 1.0}]))
    assert repr(store.field) in held and "reserved" in held
    assert store.count() == N
    assert store.add(["x"], vector, [{"title": "new"}]) == 1
    (rec,) = store.get(["x"])
    np.testing.assert_allclose(rec.vector, vector[0], rtol=1e-5)  # m(d)·d̂ = the vector given
    assert rec.payload == {"title": "new"}
    hit = store.search(units[0][None, :], 1, with_vectors=False)[0][0]
    assert hit.id == "x" and hit.doc_norm == pytest.approx(25.0, rel=1e-5)
    assert hit.score == pytest.approx(25.0, rel=1e-5)  # cos 1 · m 25


# ----------------------------------------------------------------------------- queries


@pytest.mark.parametrize(
    ("queries", "k"),
    [
        (np.ones((1, DIM)), 0),
        (np.ones((1, DIM)), True),
        (np.full((1, DIM), np.nan), 3),
        (np.ones((1, DIM + 1)), 3),
        ([["a"] * DIM], 3),
    ],
    ids=["k-zero", "k-bool", "nan", "dimension", "text"],
)
def test_bad_queries_are_refused_like_every_store(annotated, queries, k):
    store, _ = annotated

    def search(s):
        return s.search(queries, k)

    assert refusal(store, search) == refusal(reference_store(), search)


def test_no_queries_ask_nothing(annotated):
    store, _ = annotated
    assert store.search(np.zeros((0, DIM), dtype=np.float32), 3) == []


# ----------------------------------------------------------------------------- short rows


def test_rows_the_index_answers_short_are_filled_by_the_exact_cos_m(annotated, monkeypatch):
    """The base fills a short row from the store's exact scan: for a cosine plug-in store that
    is cos·m(d) (the query's norm does not count, as in the database), and while the store is
    marked incomplete plain cosine with m = 1, as its index search ranks then."""
    store, units = annotated
    m = magnitudes(store)
    cls = type(store)
    original = cls._query

    def short(self, q, k, with_vectors):
        return [row[:-1] for row in original(self, q, k, with_vectors)]

    monkeypatch.setattr(cls, "_query", short)
    queries = directions(seed=1)[:4] * 3.0  # norm 3: scores stay cos·m
    cos = directions(seed=1)[:4] @ units.T
    for weights in (m, np.ones(N)):
        if weights is not m:  # mark it incomplete, as an interrupted re-annotate leaves it
            meta = store.read_metadata()
            store.write_metadata({**meta, "incomplete": {"operation": "annotate"}})
        hits = store.search(queries, 5)
        want = np.argsort(-(cos * weights[None, :]), axis=1, kind="stable")[:, :5]
        assert [[h.id for h in row] for row in hits] == [[str(j) for j in r] for r in want]
        np.testing.assert_allclose(
            [[h.score for h in row] for row in hits],
            np.take_along_axis(cos * weights[None, :], want, axis=1),
            atol=1e-5,
        )
        got_norms = [[h.doc_norm for h in row] for row in hits]
        np.testing.assert_allclose(got_norms, weights[want], rtol=1e-5)


# ----------------------------------------------------------------------------- the protocol


def test_annotate_refuses_a_store_outside_the_protocol_in_one_line():
    store = reference_store()
    with pytest.raises(StoreError, match=r"^memory:: annotate works on an existing Cosine"):
        annotate_store(store, prior=HubPrior(0.5), progress=False)
    assert store.count() == N and store.read_metadata() is None


def test_the_annotation_protocol_checks_what_it_is_given(annotated):
    store, _ = annotated
    before = magnitudes(store)
    page = next(iter(store.iter_points(4)))
    assert len(page) == 4
    short = refusal(store, lambda s: s.set_magnitudes(page, [1.0, 2.0]))
    assert "4 points but 2 magnitudes" in short
    for bad in ([1.0, 0.0, 1.0, 1.0], [1.0, float("inf"), 1.0, 1.0]):
        assert "finite and positive" in refusal(store, lambda s, b=bad: s.set_magnitudes(page, b))
    np.testing.assert_array_equal(magnitudes(store), before)  # nothing was written
    meta = store.read_metadata()
    assert "incomplete" in refusal(store, lambda s: s.begin_annotation(store.field, meta))
    assert "page size" in refusal(store, lambda s: next(s.iter_points(0)))
    assert "not a plain name" in refusal(store, lambda s: s.field_holds_user_data("m-d", meta))
    assert store.read_metadata() == meta
