"""magretrieve diagnose: magnitude figures, side predictors, symmetry check, report and CLI."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from magretrieve.core import similarity
from magretrieve.core.errors import ConfigError
from magretrieve.data.readers import RetrievalDataset, SentencePair, load_beir
from magretrieve.diagnose.cache import EmbeddingCache
from magretrieve.diagnose.magnitude import magnitude_signal, norm_length_correlation
from magretrieve.diagnose.report import recommend, verdict_text
from magretrieve.diagnose.side import (
    DELTA_CV_THRESHOLD,
    CountSketch,
    delta_cv,
    fisher_condition,
    fisher_kappa,
    predict_from_delta_cv,
)
from magretrieve.diagnose.symmetry import symmetry_check

COSINE = similarity.resolve("cosine")


def _dataset(doc_texts, qrels, queries) -> RetrievalDataset:
    from magretrieve.data.readers import Document

    corpus = {f"d{i}": Document(f"d{i}", t) for i, t in enumerate(doc_texts)}
    return RetrievalDataset("synthetic", "test", corpus, queries, qrels)


# ----------------------------------------------------------------------------- magnitude


def test_hand_computed_cohens_d_cv_and_length_correlations() -> None:
    # one query, five documents all retrieved; relevant norms 3, 5 and non-relevant 1, 2, 3
    norms = [3.0, 5.0, 1.0, 2.0, 3.0]
    texts = [" ".join(["w"] * n) for n in (10, 20, 30, 40, 50)]  # 10..50 words
    direction = np.array([1.0, 0.0, 0.0])
    # distinct directions near the query, norms exactly as listed
    docs = {
        t: n * np.array([math.cos(0.01 * i), math.sin(0.01 * i), 0.0])
        for i, (t, n) in enumerate(zip(texts, norms, strict=True))
    }
    cache = EmbeddingCache.from_vectors({"q": direction}, docs)
    data = _dataset(texts, {"q0": {"d0": 1, "d1": 1}}, {"q0": "q"})
    sig = magnitude_signal(cache, data, COSINE, progress=False)
    # rel mean 4, var 2; non mean 2, var 1; pooled (2 + 2)/3 = 4/3 -> d = 2/sqrt(4/3) = sqrt(3)
    assert sig.cohens_d == pytest.approx(math.sqrt(3), rel=1e-4)
    # CV: mean 2.8, population std sqrt(8.8/5)
    assert sig.norm_cv == pytest.approx(math.sqrt(1.76) / 2.8, rel=1e-4)
    # lengths 10..50 vs norms: Pearson -30/sqrt(1000 * 8.8); ranks [3.5,5,1,2,3.5] -> -3/sqrt(95)
    assert sig.pearson_norm_length == pytest.approx(-30 / math.sqrt(8800), rel=1e-3)
    assert sig.spearman_norm_length == pytest.approx(-3 / math.sqrt(95), rel=1e-6)
    assert sig.mean_norm_relevant == pytest.approx(4.0, rel=1e-3)
    assert sig.mean_norm_nonrelevant == pytest.approx(2.0, rel=1e-3)


def test_norm_length_correlation_is_nan_for_constant_input() -> None:
    assert all(math.isnan(v) for v in norm_length_correlation([1, 1, 1, 1], [1, 2, 3, 4]))


def _synthetic(shuffle: bool, seed: int = 0):
    """60 queries, 400 documents; each query's 3 relevant documents sit near it with 2x norm."""
    rng = np.random.default_rng(seed)
    dim, n_q, n_docs = 16, 60, 400
    qv = rng.normal(size=(n_q, dim))
    dv = rng.normal(size=(n_docs, dim))
    dv /= np.linalg.norm(dv, axis=1, keepdims=True)
    qrels = {}
    for i in range(n_q):
        rel = [3 * i, 3 * i + 1, 3 * i + 2]
        for j in rel:
            v = qv[i] / np.linalg.norm(qv[i]) + 0.3 * rng.normal(size=dim) / math.sqrt(dim)
            dv[j] = v / np.linalg.norm(v)
        qrels[f"q{i}"] = {f"d{j}": 1 for j in rel}
    norms = rng.uniform(0.9, 1.1, size=n_docs)
    norms[: 3 * n_q] *= 2.0
    if shuffle:
        norms = rng.permutation(norms)
    dv = dv * norms[:, None]
    doc_texts = [f"doc {j}" for j in range(n_docs)]
    cache = EmbeddingCache.from_vectors(
        {f"query {i}": qv[i] for i in range(n_q)}, dict(zip(doc_texts, dv, strict=True))
    )
    return cache, _dataset(doc_texts, qrels, {f"q{i}": f"query {i}" for i in range(n_q)})


def test_magnitude_verdict_sees_larger_relevant_norms_and_not_shuffled_ones() -> None:
    cache, data = _synthetic(shuffle=False)
    sig = magnitude_signal(cache, data, COSINE, progress=False)
    assert sig.cohens_d > 1  # other queries' relevant documents (2x norm) dilute it
    assert "already carries relevance" in sig.verdict
    assert recommend({"cohens_d": sig.cohens_d}).reasons[-1].startswith("magnitude already carries")

    cache, data = _synthetic(shuffle=True)
    sig = magnitude_signal(cache, data, COSINE, progress=False)
    assert abs(sig.cohens_d) < 0.5
    assert "carries little relevance" in sig.verdict


def test_negative_d_verdict_and_cosine_recommendation() -> None:
    cache, data = _synthetic(shuffle=False)
    for text in list(cache.store["document"]):  # invert: relevant documents get the small norms
        v = cache.store["document"][text]
        cache.store["document"][text] = v / np.linalg.norm(v) ** 2
    sig = magnitude_signal(cache, data, COSINE, progress=False)
    assert sig.cohens_d < -0.2
    assert "point away from relevance" in sig.verdict
    rec = recommend({"cohens_d": sig.cohens_d, "delta_cv": 6.1})
    assert rec.mode == "cosine" and rec.side_if_one_sided == "dnorm"
    assert "expected to hurt" in rec.reasons[0]


# ----------------------------------------------------------------------------- recommend


@pytest.mark.parametrize(
    ("figures", "mode"),
    [
        ({"delta_cv": 6.1}, "dnorm"),
        ({"delta_cv": 1.3}, "qnorm"),
        ({"delta_cv": DELTA_CV_THRESHOLD}, "dnorm"),
        ({"kappa": {"qnorm": 50.0, "dnorm": 10.0}}, "dnorm"),
        ({"kappa": {"qnorm": 5.0, "dnorm": 10.0}}, "qnorm"),
        ({"delta_cv": 1.3, "kappa": {"qnorm": 50.0, "dnorm": 10.0}}, "qnorm"),  # ΔCV leads
        ({"delta_cv": 6.1, "removed_normalize": True, "cohens_d": 0.7}, "cosine"),
        ({}, "qnorm"),
    ],
)
def test_recommend_rules(figures, mode) -> None:
    rec = recommend(figures)
    assert rec.mode == mode
    if "kappa" in figures and "delta_cv" in figures:
        assert any("disagree" in w for w in rec.warnings)
    if not figures:
        assert any("no side predictor" in w for w in rec.warnings)


def test_recommend_names_normalize_stage_and_quotes_committed_figures() -> None:
    from magretrieve.diagnose.evidence import load_evidence

    evidence = load_evidence()
    assert evidence, "the package ships the benchmarks' evidence.json"
    rec = recommend({"removed_normalize": True, "cohens_d": 0.1})
    assert rec.mode == "cosine"
    assert "behaves like one pretrained through a Normalize stage" in rec.reasons[0]
    # the qnorm loss quoted is the committed one, not a constant in the code
    ood = evidence["out_of_domain"]
    loss = evidence["cosine"][ood] - evidence["qnorm"][ood]
    assert f"{loss:.2f} on {ood.split(':')[0]}" in rec.reasons[0]
    best = evidence["best_prior"]
    assert rec.magnitude == "document_prior"
    assert f"{best['ndcg'][ood]:.3f}" in rec.reasons[1]
    assert [c.split()[1] for c in rec.next_steps] == ["train", "fit-prior", "rescale"]
    if best["method"] not in ("auto", "none"):
        assert f"--method {best['method']}" in rec.next_steps[1]
    text = verdict_text({"recommendation": rec.to_dict()})
    assert text.startswith("recommended: cosine + document prior\n")
    assert "  $ magretrieve fit-prior" in text
    # an encoder not pretrained through Normalize gets a side and no prior
    plain = recommend({"delta_cv": 1.3})
    assert plain.magnitude == "" and plain.next_steps == []
    assert verdict_text({"recommendation": plain.to_dict()}).splitlines()[0] == "recommended: qnorm"


def test_predict_from_delta_cv() -> None:
    assert math.isclose(DELTA_CV_THRESHOLD, math.sqrt(1.3 * 6.1))
    assert predict_from_delta_cv(6.1) == "dnorm"
    assert predict_from_delta_cv(1.3) == "qnorm"
    assert predict_from_delta_cv(float("nan")) == ""


# ----------------------------------------------------------------------------- Fisher κ


def test_fisher_condition_of_hand_built_gradients() -> None:
    # G = sqrt(3)·diag(3, 2, 1): F = GᵀG/3 = diag(9, 4, 1) -> κ over top-3 = 9, over top-2 = 9/4
    g = math.sqrt(3) * np.diag([3.0, 2.0, 1.0])
    kappa, top = fisher_condition(g, top_k=3)
    assert kappa == pytest.approx(9.0)
    np.testing.assert_allclose(top, [9.0, 4.0, 1.0])
    assert fisher_condition(g, top_k=2)[0] == pytest.approx(2.25)
    # rotating the coordinates (an orthogonal Q) leaves the spectrum unchanged; wide G uses the Gram
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(5, 5)))
    wide = np.hstack([g, np.zeros((3, 2))]) @ q
    assert fisher_condition(wide, top_k=3)[0] == pytest.approx(9.0)
    # a rank-1 G has one eigenvalue: κ = 1; bad shapes are a clear error
    assert fisher_condition(np.ones((4, 6)))[0] == pytest.approx(1.0)
    with pytest.raises(ConfigError):
        fisher_condition(np.ones(3))


def test_count_sketch_preserves_a_single_coordinate_and_is_fixed() -> None:
    import torch

    sketch = CountSketch(100, 16, seed=3)
    e = torch.zeros(100)
    e[7] = 2.5
    out = sketch(e)
    assert float(out.abs().sum()) == pytest.approx(2.5) and float(out.norm()) == pytest.approx(2.5)
    again = CountSketch(100, 16, seed=3)
    assert torch.equal(again(e), out)


# ----------------------------------------------------------------------------- end to end on tiny BERT


@pytest.fixture(scope="module")
def tiny_encoder(tiny_model_dir):
    from magretrieve.train.encoder import Encoder

    return Encoder.load(tiny_model_dir)


def test_delta_cv_runs_on_tiny_bert_and_leaves_the_encoder_alone(
    tiny_encoder, tiny_beir_dir
) -> None:
    pairs = load_beir(f"{tiny_beir_dir}:train").training_pairs()
    before = {k: v.clone() for k, v in tiny_encoder.state_dict().items()}
    res = delta_cv(tiny_encoder, pairs, steps=4, batch_size=3, lr=1e-3, progress=False)
    assert math.isfinite(res.delta_cv) and res.delta_cv > 0
    assert res.delta_cv == pytest.approx(res.cv_query_norm_dnorm / res.cv_query_norm_dot)
    assert res.prediction in ("qnorm", "dnorm") and res.steps == 4
    # a high learning rate moved the probes' query norms away from the start
    assert res.mean_query_norm_dnorm != pytest.approx(res.mean_query_norm_start, rel=1e-6)
    for k, v in tiny_encoder.state_dict().items():
        assert torch_equal(v, before[k]), k
    assert tiny_encoder.config.mode == "cosine"


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_fisher_kappa_runs_on_tiny_bert(tiny_encoder, tiny_beir_dir) -> None:
    pairs = load_beir(f"{tiny_beir_dir}:train").training_pairs()
    res = fisher_kappa(
        tiny_encoder, pairs, n_batches=2, batch_size=3, sketch_dim=64, progress=False
    )
    assert res.n_examples == 6 and res.sketch_dim == 64
    assert all(math.isfinite(v) and v >= 1.0 for v in res.kappa.values())
    assert res.prediction in ("qnorm", "dnorm") and res.experimental
    assert "layer.1." in res.parameters  # the last of the tiny BERT's two layers
    assert all(p.requires_grad for p in tiny_encoder.parameters())  # the original is untouched


# ----------------------------------------------------------------------------- symmetry


def test_sts_asymmetry_zero_for_symmetric_modes_positive_for_one_sided() -> None:
    rng = np.random.default_rng(1)
    sentences = [f"s{i}" for i in range(40)]
    vecs = {s: rng.normal(size=8) * rng.uniform(0.5, 3.0) for s in sentences}
    cache = EmbeddingCache.from_vectors(vecs, vecs)
    pairs = [
        SentencePair(sentences[i], sentences[i + 20], float(rng.uniform(0, 5))) for i in range(20)
    ]
    rows = {r["mode"]: r for r in symmetry_check(cache, pairs, progress=False)}
    assert rows["cosine"]["max_asymmetry"] == 0.0 and rows["dot"]["max_asymmetry"] == 0.0
    assert rows["cosine"]["spearman_ab"] == rows["cosine"]["spearman_ba"]
    assert rows["qnorm"]["mean_asymmetry"] > 0 and rows["dnorm"]["mean_asymmetry"] > 0
    # qnorm's s(a,b) is dnorm's s(b,a)
    assert rows["qnorm"]["spearman_ab"] == pytest.approx(rows["dnorm"]["spearman_ba"])
    assert not rows["qnorm"]["symmetric_mode"] and rows["dot"]["symmetric_mode"]


# ----------------------------------------------------------------------------- CLI


def _sts_file(folder: Path) -> Path:
    path = folder / "sts.jsonl"
    rows = [
        {
            "sentence1": f"statins heart risk {i}",
            "sentence2": f"cancer cell study {i % 3}",
            "score": i % 5,
        }
        for i in range(10)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _png_ok(path: Path) -> bool:
    return (
        path.is_file()
        and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        and path.stat().st_size > 5000
    )


def test_cli_writes_report_and_plots_for_a_trained_run(
    tiny_model_dir, tiny_beir_dir, tmp_path
) -> None:
    from magretrieve.cli import main
    from magretrieve.train.encoder import Encoder
    from magretrieve.train.trainer import TrainConfig, train

    run = tmp_path / "run"
    enc = Encoder.load(tiny_model_dir, "learnable")
    pairs = load_beir(f"{tiny_beir_dir}:train").training_pairs()
    train(enc, pairs, TrainConfig(epochs=1, batch_size=3, max_steps=2), out_dir=run, progress=False)

    out = tmp_path / "report"
    args = ["diagnose", "--model", str(run), "--data", f"{tiny_beir_dir}:train", "--sts"]
    args += [str(_sts_file(tmp_path)), "--out", str(out), "--probe-steps", "2"]
    args += ["--probe-batch-size", "3", "--fisher-batches", "1", "--run", str(run)]
    measured = tmp_path / "results"
    measured.mkdir()
    for mode, value in (("qnorm", 0.5), ("dnorm", 0.4)):
        record = {"eval": {"beir:test": {"ndcg_at_10": value}}}
        (measured / f"{mode}-s42.json").write_text(json.dumps(record))
    args += ["--compare-results", str(measured)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("recommended: ")
    assert "Spearman s(a,b)" in result.stdout and "ΔCV picks" in result.stdout
    report = json.loads((out / "diagnose.json").read_text())
    assert report["encoder"]["mode"] == "learnable"
    assert report["training"]["total_steps"] == 2
    (row,) = report["validation"]
    assert row["better"] == "qnorm"
    assert row["delta_cv_agrees"] == (report["side"]["delta_cv"]["prediction"] == "qnorm")
    assert {r["mode"] for r in report["sts"]} == {"cosine", "dot", "qnorm", "dnorm", "learnable"}
    assert report["magnitude"]["cohens_d"] == pytest.approx(report["runs"][0]["cohens_d"])
    names = {Path(p).name for p in report["plots"]}
    assert {
        "norms_relevant_vs_nonrelevant.png",
        "norm_vs_length.png",
        "score_decomposition.png",
        "training.png",
        "sts_symmetry.png",
        "run-training.png",
    } <= names
    assert all(_png_ok(Path(p)) for p in report["plots"])


def test_cli_json_on_normalize_pretrained_folder_recommends_cosine(
    tiny_st_dir, tiny_beir_dir, tmp_path
) -> None:
    from magretrieve.cli import main

    args = ["diagnose", "--model", str(tiny_st_dir), "--data", f"{tiny_beir_dir}:train"]
    args += ["--out", str(tmp_path / "r"), "--skip-probes", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["encoder"]["removed_normalize"] is True
    assert report["recommendation"]["mode"] == "cosine"
    assert "expected to hurt" in report["verdict"] and "Normalize" in report["verdict"]
    assert report["side"] == {"skipped": True}
    assert (tmp_path / "r" / "diagnose.json").is_file()


def test_cli_bad_data_is_one_line_error(tiny_model_dir, tmp_path) -> None:
    from magretrieve.cli import main

    result = CliRunner().invoke(
        main, ["diagnose", "--model", str(tiny_model_dir), "--data", f"{tmp_path}/nope:train"]
    )
    assert result.exit_code == 1
    assert "nope" in result.output and "Traceback" not in result.output


# ----------------------------------------------------------------------------- validation


def test_validation_rows_average_seeds_and_judge_predictors(tmp_path) -> None:
    from magretrieve.diagnose.validate import validation_rows

    def write(name, figures):
        record = {"eval": {d: {"ndcg_at_10": v} for d, v in figures.items()}}
        (tmp_path / name).write_text(json.dumps(record))

    write("qnorm-s42.json", {"scifact:test": 0.60, "cranfield:test": 0.30, "x:test": 0.5})
    write("qnorm-s43.json", {"scifact:test": 0.62, "cranfield:test": 0.32})
    write("dnorm-s42.json", {"scifact:test": 0.64, "cranfield:test": 0.312})
    write("cosine-s42.json", {"scifact:test": 0.99})  # ignored: not a side mode
    rows = {
        r["data"]: r for r in validation_rows({"delta_cv": "qnorm", "kappa": "dnorm"}, tmp_path)
    }
    assert rows["scifact:test"]["qnorm"] == pytest.approx(0.61)
    assert rows["scifact:test"]["better"] == "dnorm" and rows["scifact:test"]["qnorm_seeds"] == 2
    assert rows["scifact:test"]["delta_cv_agrees"] is False and rows["scifact:test"]["kappa_agrees"]
    assert rows["cranfield:test"]["better"] == "tie"  # 0.31 vs 0.312 < 0.005
    assert rows["cranfield:test"]["kappa_agrees"] is None
    assert rows["x:test"]["better"] == "pending"
    assert validation_rows({"delta_cv": "qnorm"}, tmp_path / "missing") == []
