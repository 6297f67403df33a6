"""The hub prior: hub scores by hand, β = 0 is cosine, β chosen on training queries, its JSON
read back field by field."""

from __future__ import annotations

import json

import numpy as np
import pytest

from magretrieve.core.errors import ConfigError, DataError
from magretrieve.priors import HubPrior, prior_from_dict, read_prior_file
from magretrieve.priors.base import unit
from magretrieve.priors.hub import hub_scores
from magretrieve.priors.select import choose_prior, served_scores


def test_hub_scores_by_hand() -> None:
    d = np.array([[1.0, 0.0], [0.0, 1.0], [np.sqrt(0.5), np.sqrt(0.5)]], dtype=np.float32)
    # cosines: d0-d1 0, d0-d2 .7071, d1-d2 .7071
    np.testing.assert_allclose(hub_scores(d, k=1), [0.70710677, 0.70710677, 0.70710677], rtol=1e-6)
    np.testing.assert_allclose(hub_scores(d, k=2), [0.35355339, 0.35355339, 0.70710677], rtol=1e-6)
    # chunking does not change the answer
    rng = np.random.default_rng(0)
    x = unit(rng.normal(size=(50, 6)))
    np.testing.assert_allclose(hub_scores(x, 5, chunk=7), hub_scores(x, 5, chunk=1000), rtol=1e-6)
    with pytest.raises(DataError):
        hub_scores(d[:1], k=3)


def test_beta_zero_equals_cosine_ranking() -> None:
    rng = np.random.default_rng(1)
    docs = unit(rng.normal(size=(30, 8)))
    q = unit(rng.normal(size=(5, 8)))
    np.testing.assert_allclose(served_scores(HubPrior(0.0), q, docs), q @ docs.T, atol=1e-6)
    # a positive β shrinks hubs and grows outliers: magnitude falls as the hub score rises
    prior = HubPrior(0.3, 10)
    prior.fit_corpus(docs)
    m = prior.terms(docs).multiplier
    h = hub_scores(docs, 10)
    assert np.all(np.diff(m[np.argsort(h)]) <= 1e-9)
    np.testing.assert_allclose(m, np.exp(-0.3 * (h - h.mean()) / h.std()), rtol=1e-5)


def test_choosing_beta_prefers_down_weighting_hubs_when_they_are_not_relevant() -> None:
    """Synthetic corpus: a hub cluster sits near every query; relevant docs are outliers."""
    rng = np.random.default_rng(2)
    dim = 16
    hub_center = unit(rng.normal(size=(1, dim)))[0]
    hubs = unit(hub_center + 0.05 * rng.normal(size=(20, dim)))
    rel = unit(rng.normal(size=(20, dim)))
    docs = np.vstack([hubs, rel])
    queries = unit(rel + 1.2 * hub_center)  # close to its document but also to the hub cluster
    qids = [f"q{i}" for i in range(20)]
    doc_ids = [f"h{i}" for i in range(20)] + [f"r{i}" for i in range(20)]
    qrels = {f"q{i}": {f"r{i}": 1} for i in range(20)}
    grid = [HubPrior(b, 10) for b in (0.1, 0.5, 1.0, 2.0)]
    sel = choose_prior(queries, docs, qids, doc_ids, qrels, method="hub", grids={"hub": grid})
    assert isinstance(sel.prior, HubPrior) and sel.prior.beta > 0
    assert sel.grid[sel.prior.label()] > sel.grid["none (cosine)"]
    assert sel.grid[sel.prior.label()] == max(sel.grid.values())
    # ties go to the earlier, simpler candidate: identical scores everywhere -> cosine
    flat = choose_prior(
        queries[:1], docs, qids[:1], doc_ids, {"q0": {"r0": 1}}, method="hub",
        grids={"hub": [HubPrior(1e-9, 10)]},
    )  # fmt: skip
    assert flat.prior.method == "none"


def test_hub_prior_round_trips_its_json(tmp_path) -> None:
    rng = np.random.default_rng(3)
    docs = unit(rng.normal(size=(12, 4)))
    prior = HubPrior(beta=0.05, k=3)
    prior.fit_corpus(docs)
    written = prior.to_dict()
    assert written["kind"] == "document_prior" and written["method"] == "hub"
    back = prior_from_dict(written)
    assert isinstance(back, HubPrior)
    assert (back.beta, back.k, back.mean, back.std) == (0.05, 3, prior.mean, prior.std)
    path = tmp_path / "hub.json"
    path.write_text(json.dumps(written))
    read = read_prior_file(path)
    assert isinstance(read, HubPrior) and (read.beta, read.k, read.std) == (0.05, 3, prior.std)
    with pytest.raises(ConfigError, match=r"not a document prior \(kind 'corpus_prior'\)"):
        prior_from_dict({"kind": "corpus_prior", "beta": 0.2})
    with pytest.raises(ConfigError, match="not a document prior"):
        prior_from_dict({"kind": "norm_head", "beta": 1})
    hub = {"kind": "document_prior", "method": "hub"}
    with pytest.raises(ConfigError, match="'beta' is malformed"):
        prior_from_dict({**hub, "beta": "x"})
    with pytest.raises(ConfigError, match="'std' must be positive, got 0"):
        prior_from_dict({**hub, "beta": 0.1, "std": 0})


def test_fit_prior_cli_writes_what_rescale_reads(tiny_model_dir, tiny_beir_dir, tmp_path) -> None:
    """β comes from training queries; its β = 0 score is exactly cosine's NDCG@10 there."""
    import json

    from click.testing import CliRunner

    from magretrieve.cli import main
    from magretrieve.data.readers import load_beir
    from magretrieve.evaluation.retrieval import evaluate_retrieval
    from magretrieve.train.encoder import Encoder

    out = tmp_path / "prior.json"
    res = CliRunner().invoke(
        main,
        [
            "fit-prior",
            "--model",
            str(tiny_model_dir),
            "--data",
            f"{tiny_beir_dir}:train",
            "--eval",
            f"{tiny_beir_dir}:test",
            "--method",
            "hub",
            "--betas",
            "0.1,0.5",
            "--k",
            "3",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{") :])
    written = json.loads(out.read_text())
    prior = prior_from_dict(written, source=str(out))
    assert written["chosen_on"].endswith(":train")
    grid = written["grid"]
    assert set(grid) == {"none (cosine)", "hub(beta=0.1,k=3)", "hub(beta=0.5,k=3)"}
    assert grid[prior.label()] == max(grid.values()) == written["training_ndcg"]
    encoder = Encoder.load(tiny_model_dir, "cosine")
    train = evaluate_retrieval(encoder, load_beir(f"{tiny_beir_dir}:train"), progress=False)
    test = evaluate_retrieval(encoder, load_beir(f"{tiny_beir_dir}:test"), progress=False)
    assert grid["none (cosine)"] == pytest.approx(train.ndcg_at_10, abs=1e-6)
    (evaluation,) = report["evaluations"]
    assert evaluation["cosine"] == pytest.approx(test.ndcg_at_10, abs=1e-6)


def test_fit_prior_refuses_a_magnitude_model_and_bad_betas(
    tiny_model_dir, tiny_beir_dir, tmp_path
) -> None:
    from click.testing import CliRunner

    from magretrieve.cli import main
    from magretrieve.train.encoder import Encoder

    run = Encoder.load(tiny_model_dir, "qnorm").save(tmp_path / "qnorm-run")
    out = tmp_path / "prior.json"
    base = ["fit-prior", "--data", f"{tiny_beir_dir}:train", "--out", str(out)]
    res = CliRunner().invoke(main, [*base, "--model", str(run)])
    assert res.exit_code == 1 and "qnorm" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, [*base, "--model", str(tiny_model_dir), "--betas", "0,x"])
    assert res.exit_code == 1 and "--betas" in res.output
    assert not out.exists()  # nothing written on refusal


def test_with_prior_scores_cos_times_magnitude(tiny_model_dir, tiny_beir_dir) -> None:
    """β = 0 evaluates exactly as cosine; β > 0 stores d̂·exp(−β·z) with z fitted on the corpus."""
    from magretrieve.data.readers import load_beir
    from magretrieve.evaluation.retrieval import evaluate_retrieval
    from magretrieve.priors.fit import WithPrior, score_with_prior
    from magretrieve.train.encoder import Encoder

    encoder = Encoder.load(tiny_model_dir, "cosine")
    data = load_beir(f"{tiny_beir_dir}:test")
    texts = [d.full_text for d in data.corpus.values()]
    cosine = evaluate_retrieval(encoder, data, progress=False)
    flat = evaluate_retrieval(WithPrior(encoder, HubPrior(0.0, 3)), data, progress=False)
    assert flat.ndcg_at_10 == pytest.approx(cosine.ndcg_at_10, abs=1e-9)

    wrapped = WithPrior(encoder, HubPrior(0.5, 3))
    assert (wrapped.similarity.gamma_q, wrapped.similarity.gamma_d) == (1.0, 0.0)
    stored = wrapped.encode_documents(texts)
    d = unit(encoder.encode_documents(texts))
    h = hub_scores(d, 3)
    expected = np.exp(-0.5 * (h - h.mean()) / h.std())
    np.testing.assert_allclose(np.linalg.norm(stored, axis=1), expected, rtol=1e-5)
    np.testing.assert_allclose(stored / expected[:, None], d, rtol=1e-5, atol=1e-6)
    # the evaluation through the wrapper is what fit-prior --eval reports
    with_prior = evaluate_retrieval(wrapped, data, progress=False)
    got = score_with_prior(encoder, data, wrapped.prior, progress=False)
    assert (got["cosine"], got["prior"]) == pytest.approx(
        (cosine.ndcg_at_10, with_prior.ndcg_at_10), abs=1e-9
    )
    with pytest.raises(ConfigError, match="qnorm"):
        WithPrior(Encoder.load(tiny_model_dir, "qnorm"), HubPrior(0.1))
