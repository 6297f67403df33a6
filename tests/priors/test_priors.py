"""Document priors: each one's terms by hand, served by one inner product, chosen on training
queries only, written by fit-prior and applied by rescale to a store the Retriever searches."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from magretrieve.cli import main
from magretrieve.core.errors import ConfigError
from magretrieve.priors import (
    CenterPrior,
    CombinedPrior,
    CslsPrior,
    HubPrior,
    InvertedSoftmaxPrior,
    NoPrior,
    prior_from_dict,
    query_vectors,
    stored_vectors,
    unit,
)
from magretrieve.priors.rescale import META_KEY, read_all, rescale_store
from magretrieve.priors.select import choose_prior, served_scores, training_score
from magretrieve.serving.retriever import Retriever
from magretrieve.stores import open_store

S = np.sqrt(0.5)
DOCS = np.array([[1.0, 0.0], [0.0, 1.0], [S, S]], dtype=np.float32)
BANK = np.array([[1.0, 0.0], [S, S]], dtype=np.float32)


def test_csls_offsets_by_hand() -> None:
    # corpus bank, k=1: nearest other document of d0, d1, d2 is at cosine .7071 for all
    p = CslsPrior(alpha=0.5, k=1, bank="corpus")
    p.fit_corpus(DOCS)
    np.testing.assert_allclose(p.terms(DOCS).offset, [-0.5 * S] * 3, rtol=1e-6)
    # query bank, k=2: d0 -> (1 + .7071)/2, d1 -> (0 + .7071)/2, d2 -> (.7071 + 1)/2
    q = CslsPrior(alpha=1.0, k=2, bank="queries", queries=BANK)
    q.fit_corpus(DOCS)
    t = q.terms(DOCS)
    np.testing.assert_allclose(t.offset, [-(1 + S) / 2, -S / 2, -(S + 1) / 2], rtol=1e-6)
    np.testing.assert_array_equal(t.multiplier, 1.0)


def test_inverted_softmax_offset_by_hand() -> None:
    p = InvertedSoftmaxPrior(beta=2.0, alpha=1.0, queries=BANK)
    off = p.terms(DOCS).offset
    cos = DOCS @ BANK.T
    expected = -np.log(np.exp(2.0 * cos).mean(axis=1)) / 2.0
    np.testing.assert_allclose(off, expected, rtol=1e-6)
    # d1 = [0, 1]: cosines 0 and .7071 -> −½·log((1 + e^{1.414})/2)
    assert off[1] == pytest.approx(-0.5 * np.log((1 + np.exp(2 * S)) / 2), rel=1e-6)


def test_center_serves_centered_cosine_ranking_exactly() -> None:
    rng = np.random.default_rng(0)
    docs = unit(rng.normal(size=(40, 6)) + 2.0)  # a strong common direction
    queries = unit(rng.normal(size=(9, 6)) + 2.0)
    mu = docs.astype(np.float64).mean(axis=0)
    scores = served_scores(CenterPrior(1.0), queries, docs)
    centered = unit(queries - mu) @ unit(docs - mu).T
    # same ranking; score = ‖q̂ − μ‖ · centered cosine exactly
    np.testing.assert_allclose(
        scores, centered * np.linalg.norm(queries - mu, axis=1)[:, None], atol=1e-5
    )
    np.testing.assert_allclose(
        served_scores(CenterPrior(0.0), queries, docs), queries @ docs.T, atol=1e-6
    )


def test_every_prior_is_one_inner_product_of_its_terms() -> None:
    rng = np.random.default_rng(1)
    docs = unit(rng.normal(size=(30, 8)))
    queries = unit(rng.normal(size=(7, 8)))
    bank = unit(rng.normal(size=(12, 8)))
    hub = HubPrior(0.3, k=3)
    isp = InvertedSoftmaxPrior(10.0, 0.5, bank)
    center = CenterPrior(0.5)
    for prior in (
        NoPrior(),
        hub,
        CslsPrior(0.5, 3, "corpus"),
        isp,
        center,
        CombinedPrior([hub, isp]),
        CombinedPrior([center, hub, isp]),
    ):
        prior.fit_corpus(docs)
        t = prior.terms(docs)
        stored = stored_vectors(t, prior.has_offset)
        assert stored.shape[1] == 8 + int(prior.has_offset)
        np.testing.assert_allclose(
            query_vectors(queries, prior.has_offset) @ stored.T, t.scores(queries), atol=1e-5
        )
    # the combination: Πm·(q̂·v + b_center) + b_other, by its parts
    combo = CombinedPrior([center, hub, isp])
    combo.fit_corpus(docs)
    tc, th, ti = center.terms(docs), hub.terms(docs), isp.terms(docs)
    expected = th.multiplier * (queries @ tc.direction.T + tc.offset) + ti.offset
    np.testing.assert_allclose(combo.terms(docs).scores(queries), expected, atol=1e-5)


def test_json_round_trip_and_one_line_errors() -> None:
    rng = np.random.default_rng(2)
    docs = unit(rng.normal(size=(20, 5)))
    bank = unit(rng.normal(size=(6, 5)))
    for prior in (
        HubPrior(0.1, 4),
        CslsPrior(0.25, 3, "queries", bank),
        CslsPrior(0.5, 3, "corpus"),
        InvertedSoftmaxPrior(20.0, 1.0, bank),
        CenterPrior(0.75),
        CombinedPrior([HubPrior(0.1, 4), InvertedSoftmaxPrior(20.0, 1.0, bank)]),
    ):
        prior.fit_corpus(docs)
        back = prior_from_dict(json.loads(json.dumps(prior.to_dict())), "p.json")
        assert back.label() == prior.label()
        np.testing.assert_allclose(
            back.terms(docs).scores(bank), prior.terms(docs).scores(bank), atol=1e-6
        )
    bad = [
        ({"kind": "document_prior", "method": "magic"}, "unknown prior method 'magic'"),
        ({"kind": "norm_head"}, "not a document prior"),
        ({"kind": "corpus_prior", "beta": 0.2}, "not a document prior \\(kind 'corpus_prior'\\)"),
        (
            {"kind": "document_prior", "method": "inverted-softmax", "beta": 1, "alpha": 1},
            "lacks its query bank",
        ),
        ({"kind": "document_prior", "method": "csls", "alpha": 1, "bank": "x"}, "bank must be"),
        ({"kind": "document_prior", "method": "hub", "beta": "x"}, "'beta' is malformed"),
        (
            {
                "kind": "document_prior",
                "method": "center",
                "strength": 1,
                "mean": [0.0, float("nan")],
            },
            "finite",
        ),
    ]
    for data, message in bad:
        with pytest.raises(ConfigError, match=message) as err:
            prior_from_dict(data, "p.json")
        assert str(err.value).startswith("p.json") and "\n" not in str(err.value)


def _hub_world(n: int = 30, dim: int = 16):
    """A hub cluster near every query; each relevant document is an outlier."""
    rng = np.random.default_rng(3)
    center = unit(rng.normal(size=(1, dim)))[0]
    hubs = unit(center + 0.05 * rng.normal(size=(20, dim)))
    rel = unit(rng.normal(size=(n, dim)))
    docs = np.vstack([hubs, rel])
    queries = unit(rel + 1.2 * center)
    qids = [f"q{i}" for i in range(n)]
    doc_ids = [f"h{i}" for i in range(20)] + [f"r{i}" for i in range(n)]
    qrels = {f"q{i}": {f"r{i}": 1} for i in range(n)}
    return queries, docs, qids, doc_ids, qrels


def test_choose_prior_on_training_queries_with_cosine_always_a_candidate() -> None:
    queries, docs, qids, doc_ids, qrels = _hub_world()
    sel = choose_prior(queries, docs, qids, doc_ids, qrels)
    cosine = sel.grid["none (cosine)"]
    assert sel.training_ndcg == max(sel.grid.values()) > cosine
    assert sel.prior.method != "none"
    assert any("+" in label for label in sel.grid)  # combinations were tried
    # a query-bank prior is scored cross-fitted; the chosen one carries every training query
    if sel.prior.uses_query_bank:
        banks = [p for p in getattr(sel.prior, "parts", [sel.prior]) if p.uses_query_bank]
        assert all(len(p.queries) == len(qids) for p in banks)
    # identical candidates everywhere -> cosine (ties go to the simpler candidate)
    flat = choose_prior(
        queries[:1],
        docs[:1].repeat(3, 0),
        qids[:1],
        ["a", "b", "c"],
        {"q0": {"a": 1}},
        method="hub",
    )
    assert flat.prior.method == "none"


def test_cross_fitting_never_normalizes_a_query_against_itself() -> None:
    """With as many folds as queries, cross-fitting is leave-one-out: each training query is
    scored against a bank of the *other* queries only."""
    queries, docs, qids, doc_ids, qrels = _hub_world(n=10)
    prior = InvertedSoftmaxPrior(50.0, 1.0)
    fitted = training_score(prior, queries, docs, qids, doc_ids, qrels, folds=10)
    # leave-one-out by hand
    from magretrieve.priors.select import ndcg_at_10

    rows = [
        served_scores(prior.with_bank(np.delete(queries, i, 0)), queries[i : i + 1], docs)
        for i in range(10)
    ]
    assert fitted == pytest.approx(ndcg_at_10(np.vstack(rows), qids, doc_ids, qrels))
    # the bank of each held-out query is exactly the other queries


META = {
    "model_fingerprint": "f" * 64,
    "mode": "cosine",
    "gamma_q": 1.0,
    "gamma_d": 1.0,
    "dimension": 8,
    "metric": "inner_product",
    "document_contract": "unit_norm",
}


class FakeCosine:
    """Stands in for a cosine export: fixed unit vectors per text."""

    manifest = SimpleNamespace(**META, index_metric="inner_product", folder="")

    def __init__(self, table: dict[str, np.ndarray]) -> None:
        self.table = table

    def encode_documents(self, texts, batch_size=32):
        return np.stack([self.table[t] for t in texts])

    def encode_queries(self, texts, batch_size=32):
        return np.stack([self.table[t] for t in texts])


@pytest.mark.parametrize("spec", ["memory:", "faiss"])
def test_rescale_with_an_offset_prior_and_search_decomposes(spec: str, tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    units = unit(rng.normal(size=(12, 8)))
    bank = unit(rng.normal(size=(5, 8)))
    ids = [f"d{i:02d}" for i in range(12)]
    src = open_store("memory:", dimension=8)
    src.add(ids, units, [{"text": i} for i in ids])
    src.write_metadata(META)
    prior = CombinedPrior([HubPrior(0.3, 3), InvertedSoftmaxPrior(10.0, 1.0, bank)])
    target = "memory:" if spec == "memory:" else f"faiss:{tmp_path / 'p'}"
    report = (
        rescale_store(
            src,
            target if spec == "faiss" else open_store(target, dimension=9),
            prior=prior,
            progress=False,
        )
        if spec == "faiss"
        else None
    )
    if spec == "memory:":
        dst = open_store("memory:", dimension=9)
        report = rescale_store(src, dst, prior=prior, progress=False)
    else:
        dst = open_store(target)
    assert report.kind == "hub+inverted-softmax" and report.count == 12
    got_ids, stored, _ = read_all(dst)
    assert got_ids == ids and stored.shape == (12, 9)
    prior.fit_corpus(units)
    terms = prior.terms(units)
    np.testing.assert_allclose(stored[:, :8], units * terms.multiplier[:, None], atol=1e-5)
    np.testing.assert_allclose(stored[:, 8], terms.offset, atol=1e-5)
    assert dst.read_metadata()[META_KEY]["method"] == "hub+inverted-softmax"

    table = {f"t{i}": u for i, u in enumerate(units)} | {"query": bank[0], "new": units[0]}
    retriever = Retriever(FakeCosine(table), dst)
    hits = retriever.search("query", k=12)
    expected = terms.scores(bank[:1])[0]
    assert [h.id for h in hits] == [ids[j] for j in np.argsort(-expected)]
    for h in hits:
        j = ids.index(h.id)
        assert h.score == pytest.approx(expected[j], abs=1e-5)
        assert h.multiplier == pytest.approx(terms.multiplier[j], rel=1e-5)
        assert h.offset == pytest.approx(terms.offset[j], abs=1e-5)
        assert h.cosine == pytest.approx(float(units[j] @ bank[0]), abs=1e-5)
        assert h.score == pytest.approx(h.multiplier * h.cosine + h.offset, abs=1e-5)
        assert set(h.to_dict()) >= {"cosine", "multiplier", "offset"}
    # a document added later gets the recorded prior: its neighbours are the store's
    retriever.add_documents([{"_id": "later", "text": "new"}])
    (vec,) = dst.get_vectors(["later"])
    hub = np.sort(units @ units[0])[::-1][:3].mean()
    h = prior.parts[0]
    m = np.exp(-0.3 * (hub - h.mean) / h.std)
    np.testing.assert_allclose(vec[:8], units[0] * m, rtol=1e-4)
    assert vec[8] == pytest.approx(prior.parts[1].terms(units[:1]).offset[0], abs=1e-5)
    retriever.close()


def test_fit_prior_cli_contract_and_rescale_applies_it(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    from magretrieve.data.readers import load_beir
    from magretrieve.evaluation.retrieval import evaluate_retrieval
    from magretrieve.train.encoder import Encoder

    out = tmp_path / "prior.json"
    args = [
        "fit-prior",
        "--model",
        str(tiny_model_dir),
        "--data",
        f"{tiny_beir_dir}:train",
        "--eval",
        f"{tiny_beir_dir}:test",
        "--out",
        str(out),
        "--json",
    ]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{") :])
    assert set(report) >= {"prior", "evaluations"}
    assert "method" in report["prior"] and "queries" not in report["prior"]
    (ev,) = report["evaluations"]
    assert set(ev) >= {"data", "cosine", "prior", "truncated_queries"}
    encoder = Encoder.load(tiny_model_dir, "cosine")
    test = evaluate_retrieval(encoder, load_beir(f"{tiny_beir_dir}:test"), progress=False)
    assert ev["cosine"] == pytest.approx(test.ndcg_at_10, abs=1e-6)
    train = evaluate_retrieval(encoder, load_beir(f"{tiny_beir_dir}:train"), progress=False)
    written = json.loads(out.read_text())
    assert written["grid"]["none (cosine)"] == pytest.approx(train.ndcg_at_10, abs=1e-6)
    assert written["training_ndcg"] == max(written["grid"].values())
    prior_from_dict(written, str(out))
    # one method, its grid only (plus cosine)
    res = CliRunner().invoke(main, [*args[:-1], "--method", "center", "--json"])
    assert res.exit_code == 0, res.output
    grid = json.loads(out.read_text())["grid"]
    assert all(k == "none (cosine)" or k.startswith("center(") for k in grid)
    res = CliRunner().invoke(main, [*args[:-1], "--method", "magic"])
    assert res.exit_code == 1 and "unknown prior method 'magic'" in res.output
    assert "Traceback" not in res.output

    # rescale --prior-file applies any prior to a cosine store
    docs = load_beir(f"{tiny_beir_dir}:test").corpus
    src = open_store(f"faiss:{tmp_path / 'src'}", dimension=encoder.dim)
    ids = list(docs)
    src.add(
        ids,
        encoder.encode_documents([docs[i].full_text for i in ids]),
        [{"text": docs[i].text} for i in ids],
    )
    src.write_metadata({**META, "dimension": encoder.dim})
    src.persist()
    src.close()
    prior_file = tmp_path / "is.json"
    bank = unit(np.random.default_rng(5).normal(size=(4, encoder.dim)))
    prior_file.write_text(json.dumps(InvertedSoftmaxPrior(5.0, 1.0, bank).to_dict()))
    res = CliRunner().invoke(
        main,
        [
            "rescale",
            "--source",
            f"faiss:{tmp_path / 'src'}",
            "--target",
            f"faiss:{tmp_path / 'dst'}",
            "--prior-file",
            str(prior_file),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    dst = open_store(f"faiss:{tmp_path / 'dst'}")
    assert dst.dimension == encoder.dim + 1 and dst.count() == len(ids)
    dst.close()
    bad = tmp_path / "bad.json"
    bad.write_text('{"kind": "document_prior", "method": "csls", "alpha": 1, "bank": "queries"}')
    res = CliRunner().invoke(
        main,
        [
            "rescale",
            "--source",
            f"faiss:{tmp_path / 'src'}",
            "--target",
            f"faiss:{tmp_path / 'x'}",
            "--prior-file",
            str(bad),
        ],
    )
    assert res.exit_code == 1 and str(bad) in res.output and "lacks its 'queries'" in res.output
    assert not (tmp_path / "x").exists()


def test_every_prior_field_is_checked_by_type_and_dimension() -> None:
    """Tampered files fail in one line naming the file and the field, before any use."""
    from magretrieve.priors.base import encode_matrix

    bank = encode_matrix(np.ones((3, 4), np.float32))
    base = {"kind": "document_prior"}
    cases = [
        ({"method": "hub", "beta": 0.1, "k": "ten"}, "'k' is malformed: 'ten'"),
        ({"method": "hub", "beta": 0.1, "k": 2.5}, "'k' is malformed"),
        ({"method": "hub", "beta": 0.1, "k": True}, "'k' is malformed"),
        ({"method": "hub", "beta": 0.1, "mean": "0"}, "'mean' is malformed"),
        ({"method": "hub", "beta": float("inf")}, "'beta' must be finite"),
        ({"method": "csls", "alpha": 0.5, "k": "ten", "queries": bank}, "'k' is malformed"),
        ({"method": "csls", "alpha": 0.5, "k": 0, "queries": bank}, "'k' must be at least 1"),
        ({"method": "csls", "alpha": 0.5, "bank": ["queries"]}, "bank must be"),
        ({"method": "csls", "alpha": 0.5, "queries": {"shape": "ab"}}, "'queries' is malformed"),
        (
            {"method": "csls", "alpha": 0.5, "queries": {**bank, "shape": [2, 4]}},
            "'queries' is malformed",
        ),
        (
            {"method": "csls", "alpha": 0.5, "queries": {**bank, "float32_base64": "!!"}},
            "'queries' is malformed",
        ),
        (
            {"method": "csls", "alpha": 0.5, "queries": {"shape": [0, 4], "float32_base64": ""}},
            "non-empty 2-D",
        ),
        ({"method": "inverted-softmax", "beta": 0, "alpha": 1, "queries": bank}, "positive"),
        ({"method": "center", "strength": 1, "mean": ["a"]}, "'mean' is not a list of numbers"),
        ({"method": "center", "strength": "1"}, "'strength' is malformed"),
        ({"method": "hub+center", "parts": [{"method": "hub", "beta": "x"}]}, "part 1: prior"),
        ({"method": "center+center", "parts": [
            {**base, "method": "center", "strength": 1},
            {**base, "method": "center", "strength": 1}]}, "p.json: a combined prior can hold at most one center"),
    ]  # fmt: skip
    for data, message in cases:
        with pytest.raises(ConfigError, match=message) as err:
            prior_from_dict({**base, **data}, "p.json")
        assert str(err.value).startswith("p.json") and "\n" not in str(err.value)
    # state of another dimension than the store's is named by its field
    for data, field in [
        ({"method": "csls", "alpha": 0.5, "queries": bank}, "'queries'"),
        ({"method": "inverted-softmax", "beta": 5, "alpha": 1, "queries": bank}, "'queries'"),
        ({"method": "center", "strength": 1, "mean": [0.5] * 4}, "'mean'"),
    ]:
        prior = prior_from_dict({**base, **data}, "p.json")
        prior.check_dimension(4, prior.source)  # its own dimension: fine
        with pytest.raises(
            ConfigError, match=f"p.json: prior key {field} .*dimension 4, the store 8"
        ):
            prior.check_dimension(8, prior.source)
    combined = prior_from_dict(
        {**base, "method": "hub+csls", "parts": [
            {**base, "method": "hub", "beta": 0.1}, {**base, "method": "csls", "alpha": 0.5,
                                                     "queries": bank}]}, "p.json",
    )  # fmt: skip
    with pytest.raises(ConfigError, match="p.json part 2: prior key 'queries'"):
        combined.check_dimension(8, combined.source)
