"""Field priors: a number each document carries (citations, year, length) as m(d) or b(d).

Hand-computed transforms, missing rules and β; the JSON round trip and documents added
later; the cross-fit over query folds on a corpus built so its held-out score is known;
the combination with the hub prior; rescale into a store; and the bad fields refused in one
line naming the field and the documents.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from magretrieve.core.errors import ConfigError, DataError
from magretrieve.priors import (
    CombinedPrior,
    DocumentFields,
    FieldPrior,
    HubPrior,
    prior_from_dict,
    stored_vectors,
)
from magretrieve.priors.document_fields import LENGTH_FIELD
from magretrieve.priors.hub import hub_scores
from magretrieve.priors.rescale import META_KEY, apply_recorded_magnitude, rescale_store
from magretrieve.priors.select import auto_methods, choose_prior, cross_fit, grid
from magretrieve.stores import open_store

IDS = ["a", "b", "c", "d"]
#: citations 0, 3, (missing), 7
PAYLOADS = [{"cites": 0}, {"cites": 3}, {"cites": None, "title": "x y"}, {"cites": 7}]


def fields(payloads=PAYLOADS, ids=IDS) -> DocumentFields:
    return DocumentFields(ids, payloads)


def units(n: int, dim: int = 6) -> np.ndarray:
    v = np.random.default_rng(0).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def standardized(t: list[float]) -> np.ndarray:
    x = np.asarray(t, dtype=np.float64)
    return (x - x.mean()) / x.std()


# ----------------------------------------------------------------------------- the numbers


def test_log1p_median_offset_by_hand() -> None:
    prior = FieldPrior("cites", "log1p", "offset", 0.1, "median").with_fields(fields())
    t = prior.terms(units(4))
    # log1p: 0, ln 4, (median of the three = ln 4), ln 8
    expected = 0.1 * standardized([0.0, math.log(4), math.log(4), math.log(8)])
    np.testing.assert_allclose(t.offset, expected, rtol=1e-12)
    np.testing.assert_array_equal(t.multiplier, np.ones(4))
    assert prior.fill == pytest.approx(math.log(4))
    assert prior.has_offset


def test_raw_min_multiplier_by_hand() -> None:
    prior = FieldPrior("cites", "raw", "multiplier", -0.2, "min").with_fields(fields())
    t = prior.terms(units(4))
    np.testing.assert_allclose(t.multiplier, np.exp(-0.2 * standardized([0, 3, 0, 7])))
    np.testing.assert_array_equal(t.offset, np.zeros(4))
    assert not prior.has_offset


def test_rank_zero_rule_by_hand() -> None:
    """rank = mid-rank among the corpus's present values: (#below + #at-or-below) / 2n."""
    prior = FieldPrior("cites", "rank", "offset", 0.05, "zero").with_fields(fields())
    t = prior.terms(units(4))
    # present values 0, 3, 7: ranks 1/6, 3/6, 5/6; the missing one is ranked as 0 → 1/6
    expected = 0.05 * standardized([1 / 6, 3 / 6, 1 / 6, 5 / 6])
    np.testing.assert_allclose(t.offset, expected, rtol=1e-12)
    np.testing.assert_allclose(prior.quantiles, [0.0, 3.0, 7.0])


def test_length_field_counts_title_and_text_words() -> None:
    f = fields([{"title": "a b", "text": "c d e"}, {"text": "x"}, {}, {"title": "t"}])
    np.testing.assert_array_equal(f.column(LENGTH_FIELD), [5, 1, 0, 1])
    prior = FieldPrior(LENGTH_FIELD, "log1p", "offset", 0.1).with_fields(f)
    expected = 0.1 * standardized([math.log(6), math.log(2), 0.0, math.log(2)])
    np.testing.assert_allclose(prior.terms(units(4)).offset, expected)


def test_numeric_fields_found_for_auto() -> None:
    f = fields(
        [
            {"cites": 1, "year": 1970, "flag": True, "name": "x", "same": 2, "title": "a"},
            {"cites": 4, "year": 1971, "flag": False, "name": "y", "same": 2, "title": "a b"},
        ],
        ["a", "b"],
    )
    assert f.numeric_fields() == ["cites", "year", LENGTH_FIELD]
    methods = auto_methods(f)
    assert "field:cites" in methods and "field:_length" in methods and "hub" in methods
    assert all(not m.startswith("field") for m in auto_methods())


def test_grid_tries_every_transform_form_and_sign() -> None:
    candidates = grid("field:cites")
    assert {p.transform for p in candidates} == {"raw", "log1p", "rank"}  # type: ignore[attr-defined]
    assert {p.form for p in candidates} == {"offset", "multiplier"}  # type: ignore[attr-defined]
    betas = {p.beta for p in candidates}  # type: ignore[attr-defined]
    assert 0.05 in betas and -0.05 in betas
    # a field with negative values: no log1p candidate
    neg = fields([{"v": -1}, {"v": 2}], ["a", "b"])
    assert "log1p" not in {p.transform for p in grid("field:v", neg)}  # type: ignore[attr-defined]
    # the transform and missing rule can be fixed in the method name
    fixed = grid("field:cites:rank:zero")
    assert {(p.transform, p.missing) for p in fixed} == {("rank", "zero")}  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="unknown transform 'sqrt'"):
        grid("field:cites:sqrt")
    with pytest.raises(ConfigError, match="field:NAME"):
        grid("field")


# ----------------------------------------------------------------------------- file, new docs


@pytest.mark.parametrize("transform", ["raw", "log1p", "rank"])
def test_json_round_trip_and_new_documents_from_their_own_field(transform: str) -> None:
    corpus = units(4)
    prior = FieldPrior("cites", transform, "offset", 0.1).with_fields(fields())
    offsets = prior.terms(corpus).offset
    data = prior.to_dict()
    assert {k: data[k] for k in ("field", "transform", "missing", "beta", "form")} == {
        "field": "cites",
        "transform": transform,
        "missing": "median",
        "beta": 0.1,
        "form": "offset",
    }
    read = prior_from_dict(data, "prior.json")
    assert read.label() == prior.label()
    # new documents: the values of a, b, d, one without the field, one outside the corpus range
    new = fields([{"cites": 0}, {"cites": 3}, {"cites": 7}, {}, {"cites": 100}], list("vwxyz"))
    t = read.with_fields(new).terms_for_new(units(5), lambda u, k: np.zeros((len(u), 0)))
    np.testing.assert_allclose(t.offset[:4], offsets[[0, 1, 3, 2]], rtol=1e-12)
    assert t.offset[4] >= offsets[3]  # more citations than any corpus document: at least as high
    if transform != "rank":
        assert t.offset[4] > offsets[3]
    # a field prior without payloads says so instead of guessing
    with pytest.raises(ConfigError, match="needs each document's payload"):
        read.terms_for_new(units(1), lambda u, k: np.zeros((1, 0)))


def test_bad_prior_file_fields_are_refused() -> None:
    good = FieldPrior("cites", "rank", "offset", 0.1).with_fields(fields())
    good.terms(units(4))
    data = good.to_dict()
    for key, value, words in [
        ("transform", "sqrt", "'transform' must be one of"),
        ("form", "both", "'form' must be one of"),
        ("missing", "mean", "'missing' must be one of"),
        ("field", "", "'field' must be a non-empty string"),
        ("quantiles", [3, 1], "non-decreasing"),
        ("beta", "0.1", "'beta' is malformed"),
    ]:
        with pytest.raises(ConfigError, match=words):
            prior_from_dict({**data, key: value}, "p.json")


# ----------------------------------------------------------------------------- bad fields


@pytest.mark.parametrize(
    ("payloads", "spec", "words"),
    [
        ([{"x": 1}, {"x": 2}, {"x": 3}], "field:cites", ["'cites'", "missing from all 3", "'a'"]),
        ([{"cites": 1}, {"cites": "many"}, {"cites": True}], "field:cites",
         ["'cites'", "not a number in 2", "'b', 'c'"]),
        ([{"cites": 1}, {"cites": float("nan")}, {"cites": 2}], "field:cites",
         ["'cites'", "NaN or infinite", "'b'"]),
        ([{"cites": -1}, {"cites": 0}, {"cites": -5}], "field:cites:log1p",
         ["'cites'", "negative in 2", "'a', 'c'", "log1p"]),
        ([{"cites": 4}, {}, {"cites": 4}], "field:cites",
         ["'cites'", "constant", "'a', 'c'"]),
    ],
)  # fmt: skip
def test_bad_fields_are_one_line_naming_field_and_documents(payloads, spec, words) -> None:
    f = fields(payloads, ["a", "b", "c"])
    with pytest.raises(DataError) as err:
        grid(spec, f)[0].with_fields(f).fit_corpus(units(3))
    message = str(err.value)
    assert "\n" not in message
    for w in words:
        assert w in message, message


# ----------------------------------------------------------------------------- choosing


def topic_corpus(
    helped: list[bool],
) -> tuple[np.ndarray, np.ndarray, list, list, dict, DocumentFields]:
    """One query per topic, two documents per topic (orthogonal topics).

    A *helped* query's relevant document has cosine 0.85 and the irrelevant one 0.9 (cosine
    puts the relevant one second), but the relevant one has ``pop`` 1 and the other 0. A
    *hurt* query is the mirror: cosine right (0.9 relevant vs 0.85), ``pop`` 1 on the
    irrelevant document. A β large enough to reorder one query reorders all of them.
    """
    n = len(helped)
    q = np.zeros((n, 2 * n), np.float32)
    d = np.zeros((2 * n, 2 * n), np.float32)
    doc_ids, payloads, qrels = [], [], {}
    for i, good in enumerate(helped):
        q[i, 2 * i] = 1.0
        rel_cos, other_cos = (0.85, 0.9) if good else (0.9, 0.85)
        d[2 * i, 2 * i], d[2 * i, 2 * i + 1] = rel_cos, math.sqrt(1 - rel_cos**2)
        d[2 * i + 1, 2 * i], d[2 * i + 1, 2 * i + 1] = other_cos, -math.sqrt(1 - other_cos**2)
        doc_ids += [f"r{i}", f"o{i}"]
        payloads += [{"pop": 1 if good else 0}, {"pop": 0 if good else 1}]
        qrels[f"q{i}"] = {f"r{i}": 1}
    qids = [f"q{i}" for i in range(n)]
    return q, d, qids, doc_ids, qrels, DocumentFields(doc_ids, payloads)


SECOND = 1 / math.log2(3)  # NDCG@10 of one relevant document at rank 2


def test_field_prior_chosen_when_it_helps_the_training_queries() -> None:
    q, d, qids, doc_ids, qrels, f = topic_corpus([True] * 4)
    sel = choose_prior(q, d, qids, doc_ids, qrels, method="field:pop", fields=f)
    assert sel.prior.method == "field"
    assert sel.grid["none (cosine)"] == pytest.approx(SECOND)
    assert sel.training_ndcg == pytest.approx(1.0)
    assert sel.prior.beta > 0  # type: ignore[attr-defined]
    # held out over 4 folds: every fold's choice also reorders its held-out query
    held = cross_fit(q, d, qids, doc_ids, qrels, method="field:pop", folds=4, fields=f)
    assert held.cosine == pytest.approx(SECOND)
    assert held.prior == pytest.approx(1.0)
    assert held.per_query_prior == pytest.approx(dict.fromkeys(qids, 1.0))
    assert all(label.startswith("field(pop") for label in held.chosen)


def test_cross_fit_scores_each_query_with_a_choice_made_without_it() -> None:
    """Two helped and two hurt queries, leave one out.

    Holding out a helped query leaves 1 helped + 2 hurt: cosine (≈0.877) beats any field β
    (≈0.754 or a tie with cosine, which wins ties), so the helped query is scored by cosine:
    rank 2. Holding out a hurt query leaves 2 helped + 1 hurt: a positive β wins (≈0.877 vs
    ≈0.754) and reorders the held-out hurt query too: rank 2. Every held-out NDCG@10 is
    1/log2(3), below both cosine (mean of 0.63, 0.63, 1, 1) and the in-sample choice.
    """
    q, d, qids, doc_ids, qrels, f = topic_corpus([True, True, False, False])
    held = cross_fit(q, d, qids, doc_ids, qrels, method="field:pop", folds=4, fields=f)
    assert held.folds == 4
    assert held.per_query_prior == pytest.approx(dict.fromkeys(qids, SECOND))
    assert held.per_query_cosine == pytest.approx(
        {"q0": SECOND, "q1": SECOND, "q2": 1.0, "q3": 1.0}
    )
    assert held.prior == pytest.approx(SECOND)
    assert held.cosine == pytest.approx((SECOND + 1) / 2)
    assert sorted(c.startswith("field") for c in held.chosen) == [False, False, True, True]
    # on all four queries the field only ties cosine, and cosine wins ties
    sel = choose_prior(q, d, qids, doc_ids, qrels, method="field:pop", fields=f)
    assert sel.prior.method == "none"
    with pytest.raises(DataError, match="at least 2 judged queries"):
        cross_fit(q[:1], d, qids[:1], doc_ids, qrels, method="field:pop", fields=f)


def test_hub_plus_field_terms_multiply_and_add() -> None:
    f = fields()
    u = units(4)
    hub = HubPrior(0.3, k=2)
    field = FieldPrior("cites", "raw", "multiplier", 0.1).with_fields(f)
    offset = FieldPrior("cites", "log1p", "offset", 0.05).with_fields(f)
    both = CombinedPrior([hub, field, offset])
    assert both.uses_fields and both.has_offset
    both.fit_corpus(u)
    t = both.terms(u)
    h = hub_scores(u, 2)
    m_hub = np.exp(-0.3 * (h - h.mean()) / h.std())
    z_raw = standardized([0, 3, 3, 7])
    z_log = standardized([0, math.log(4), math.log(4), math.log(8)])
    np.testing.assert_allclose(t.multiplier, m_hub * np.exp(0.1 * z_raw), rtol=1e-6)
    np.testing.assert_allclose(t.offset, 0.05 * z_log, rtol=1e-6)
    # the file form reads back, fields bound again
    read = prior_from_dict(both.to_dict(), "p.json")
    assert read.to_dict()["method"] == "hub+field+field"
    again = read.with_fields(f)
    again.fit_corpus(u)
    np.testing.assert_allclose(again.terms(u).offset, t.offset)


def test_hub_plus_field_method_is_chosen_as_a_combination() -> None:
    q, d, qids, doc_ids, qrels, f = topic_corpus([True] * 4)
    sel = choose_prior(q, d, qids, doc_ids, qrels, method="hub+field:pop", fields=f)
    assert any(k.startswith("hub(") for k in sel.grid)
    combos = [k for k in sel.grid if k.startswith("hub(") and "+field(pop" in k]
    assert len(combos) == 1
    assert sel.training_ndcg == pytest.approx(1.0)
    assert "field(pop" in sel.prior.label()


def test_auto_tries_numeric_fields_and_their_combinations() -> None:
    q, d, qids, doc_ids, qrels, f = topic_corpus([True] * 4)
    sel = choose_prior(q, d, qids, doc_ids, qrels, method="auto", fields=f)
    assert any(k.startswith("field(pop") for k in sel.grid)
    assert any(k.startswith("hub(") and "+field(pop" in k for k in sel.grid)
    assert sel.training_ndcg == pytest.approx(1.0)


# ----------------------------------------------------------------------------- into a store


COSINE_META = {
    "mode": "cosine",
    "gamma_q": 1.0,
    "gamma_d": 1.0,
    "metric": "inner_product",
    "document_contract": "unit_norm",
}


def test_rescale_writes_the_field_offset_and_new_documents_get_theirs() -> None:
    u = units(4)
    src = open_store("memory:", dimension=6)
    src.add(IDS, u, [dict(p) for p in PAYLOADS])
    src.write_metadata({**COSINE_META, "dimension": 6})
    dst = open_store("memory:", dimension=7)
    prior = FieldPrior("cites", "log1p", "offset", 0.1)
    rescale_store(src, dst, prior=prior, progress=False)
    stored = dst.get_vectors(IDS)
    expected = 0.1 * standardized([0.0, math.log(4), math.log(4), math.log(8)])
    np.testing.assert_allclose(stored[:, 6], expected, rtol=1e-6)
    np.testing.assert_allclose(stored[:, :6], u, rtol=1e-6)
    meta = dst.read_metadata()
    assert meta[META_KEY]["field"] == "cites" and meta[META_KEY]["transform"] == "log1p"
    # a document added later: its own field through the recorded statistics
    new = units(6)[4:]
    out = apply_recorded_magnitude(meta, new, dst, [{"cites": 3}, {}], ["n1", "n2"])
    np.testing.assert_allclose(out[:, 6], [expected[1], expected[2]], rtol=1e-6)
    # a store search ranks by cos + b
    hits = dst.search(np.hstack([u[:1], np.ones((1, 1), np.float32)]), 4)[0]
    scores = u[0] @ u.T + expected
    assert [h.id for h in hits] == [IDS[i] for i in np.argsort(-scores)]


def test_rescale_refuses_a_bad_field_and_writes_nothing() -> None:
    u = units(3)
    src = open_store("memory:", dimension=6)
    src.add(["a", "b", "c"], u, [{"cites": 1}, {"cites": "lots"}, {"cites": 2}])
    src.write_metadata({**COSINE_META, "dimension": 6})
    dst = open_store("memory:", dimension=7)
    with pytest.raises(DataError, match="field 'cites' is not a number in 1 document\\(s\\): 'b'"):
        rescale_store(src, dst, prior=FieldPrior("cites", "raw", "offset", 0.1), progress=False)
    assert dst.count() == 0 and not dst.read_metadata()


def test_stored_vectors_of_a_multiplier_field_prior_need_no_offset() -> None:
    prior = FieldPrior("cites", "raw", "multiplier", 0.1).with_fields(fields())
    u = units(4)
    prior.fit_corpus(u)
    out = stored_vectors(prior.terms(u), prior.has_offset)
    assert out.shape == (4, 6)
    np.testing.assert_allclose(
        np.linalg.norm(out, axis=1), np.exp(0.1 * standardized([0, 3, 3, 7])), rtol=1e-5
    )


def test_fields_method_tries_every_numeric_field() -> None:
    q, d, qids, doc_ids, qrels, f = topic_corpus([True] * 4)
    extra = DocumentFields(doc_ids, [{**p, "noise": i % 3} for i, p in enumerate(f.payloads)])
    sel = choose_prior(q, d, qids, doc_ids, qrels, method="fields", fields=extra)
    assert {k.split(",")[0] for k in sel.grid if k.startswith("field(")} == {
        "field(pop",
        "field(noise",
    }
    assert sel.prior.label().startswith("field(pop")
    both = choose_prior(q, d, qids, doc_ids, qrels, method="hub+fields", fields=extra)
    assert any(k.startswith("hub(") and "+field(" in k for k in both.grid)
    memo: dict[int, dict[str, float]] = {}
    first = cross_fit(q, d, qids, doc_ids, qrels, method="fields", folds=2, fields=extra, memo=memo)
    again = cross_fit(q, d, qids, doc_ids, qrels, method="fields", folds=2, fields=extra, memo=memo)
    assert first.per_query_prior == again.per_query_prior and len(memo) == 2
    assert [len(x) for x in first.fold_qids] == [2, 2] and len(first.priors) == 2
    bare = DocumentFields(doc_ids, [{} for _ in doc_ids])
    with pytest.raises(ConfigError, match="no numeric field"):
        choose_prior(q, d, qids, doc_ids, qrels, method="fields", fields=bare)


def test_annotate_writes_the_field_multiplier_from_each_points_payload(tmp_path) -> None:
    from qdrant_client import QdrantClient, models

    from magretrieve.priors.annotate import annotate_store

    u = units(6)
    cites = [0, 5, None, 2, 9, 1]
    client = QdrantClient(path=str(tmp_path / "q"))
    client.create_collection(
        "theirs", vectors_config=models.VectorParams(size=6, distance=models.Distance.COSINE)
    )
    client.upsert(
        "theirs",
        points=[
            models.PointStruct(id=i, vector=u[i].tolist(), payload={"cites": c})
            for i, c in enumerate(cites)
        ],
    )
    client.close()
    spec = f"qdrant-local:{tmp_path / 'q'}/theirs"
    prior = FieldPrior("cites", "log1p", "multiplier", 0.2, "zero")
    report = annotate_store(spec, prior=prior, progress=False)
    assert report.count == 6 and report.kind == "field"
    client = QdrantClient(path=str(tmp_path / "q"))
    points, _ = client.scroll("theirs", limit=10, with_payload=True)
    client.close()
    got = {int(p.id): p.payload["magretrieve_m"] for p in points}
    want = np.exp(0.2 * standardized([math.log1p(c or 0) for c in cites]))
    np.testing.assert_allclose([got[i] for i in range(6)], want, rtol=1e-5)
    # an offset-form field prior cannot ride in a multiplier field: refused, nothing written
    with pytest.raises(ConfigError, match="offset"):
        annotate_store(spec, prior=FieldPrior("cites", "log1p", "offset", 0.2), progress=False)
