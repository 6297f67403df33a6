"""benchmarks/priors.py: hubness by hand, QB-Norm's dynamic rule, and a tiny end-to-end run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from magretrieve.priors import InvertedSoftmaxPrior, unit
from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration

bench = load_benchmark("priors")


def test_k_occurrence_skewness_by_hand() -> None:
    # 3 queries, 4 documents, k=1: document 0 is every query's top hit -> N1 = [3, 0, 0, 0]
    scores = np.array([[0.9, 0.1, 0.2, 0.0], [0.8, 0.3, 0.1, 0.0], [0.7, 0.1, 0.6, 0.0]])
    n = np.array([3.0, 0, 0, 0])
    expected = ((n - n.mean()) ** 3).mean() / n.std() ** 3
    assert bench.skewness(scores, k=1) == pytest.approx(expected)
    assert bench.skewness(np.eye(4), k=1) == 0.0  # every document once: flat


def test_dynamic_inverted_softmax_only_where_the_top_hit_is_a_bank_hub() -> None:
    rng = np.random.default_rng(0)
    docs = unit(rng.normal(size=(8, 4)))
    bank = docs[:2] + 0.01  # the bank's top-1 documents are 0 and 1
    queries = np.vstack([docs[0], docs[5]])  # top-1: document 0 (active), 5 (not)
    prior = InvertedSoftmaxPrior(10.0, 1.0)
    got = bench.dynamic_inverted_softmax(prior, queries, docs, unit(bank))
    normalized = prior.with_bank(unit(bank)).terms(docs).scores(queries)
    np.testing.assert_allclose(got[0], normalized[0], atol=1e-5)
    np.testing.assert_allclose(got[1], queries[1] @ docs.T, atol=1e-6)


def test_tiny_end_to_end_run_writes_table_json_and_evidence(
    tiny_st_dir, tiny_beir_dir, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("MAGRETRIEVE_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "results"
    args = ["--model", str(tiny_st_dir), "--train", f"{tiny_beir_dir}:train"]
    args += ["--eval", f"{tiny_beir_dir}:test", "--seeds", "1", "--pace", "qnorm-s1"]
    args += ["--lock", "", "--out", str(out), "--evidence", str(tmp_path / "evidence.json")]
    res = CliRunner().invoke(bench.main, args)
    assert res.exit_code == 0, res.output
    data = json.loads((out / "priors.json").read_text())
    rows = {(e["model"], e["prior"]) for e in data["summary"]}
    assert ("cosine", "cosine (no prior)") in rows and (
        "zero-shot",
        "auto (fit-prior default)",
    ) in rows
    assert ("pace-qnorm", "PACE: qnorm from cosine, lr/10") in rows
    base = next(
        e for e in data["summary"] if (e["model"], e["prior"]) == ("cosine", "cosine (no prior)")
    )
    assert base["tiny_beir0:test"]["delta_vs_finetuned_cosine"] == pytest.approx(0.0)
    # "no prior" is always a candidate: a prior row never trains worse than cosine
    for rows_of in data["runs"].values():
        for rec in rows_of.values():
            if rec.get("training_ndcg") is not None and "training_cosine" in rec:
                assert rec["training_ndcg"] >= rec["training_cosine"] - 1e-12
    assert "| cosine | cosine (no prior) |" in (out / "priors.md").read_text()
    assert (out / "priors.png").stat().st_size > 0
    evidence = json.loads((tmp_path / "evidence.json").read_text())
    assert evidence["cosine"]["tiny_beir0:test"] == pytest.approx(base["tiny_beir0:test"]["ndcg"])
