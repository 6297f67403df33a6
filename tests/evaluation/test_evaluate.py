"""Evaluation on hand-built vectors: exact search, NDCG/MRR/recall and Cohen's d of raw document
norms against hand-worked numbers, raw norms recovered from stored vectors (γd < 1), and the
two argument orders of the STS evaluation (asymmetry 0 for cosine/dot, > 0 for qnorm)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from magretrieve.core import metrics, similarity
from magretrieve.core.topk import exact_search
from magretrieve.data.readers import Document, RetrievalDataset, SentencePair
from magretrieve.evaluation.retrieval import (
    evaluate_retrieval,
    evaluate_sts,
    evaluate_vectors,
    exact_run,
    magnitude_statistics,
    raw_document_norms,
)
from magretrieve.train.encoder import Encoder

# Raw vectors. Norms: d1 2, d2 1, d3 3, d4 2; q1 and q2 are unit vectors.
VECTORS = {
    "q1": (1.0, 0.0),
    "q2": (0.0, 1.0),
    "d1": (2.0, 0.0),
    "d2": (0.0, 1.0),
    "d3": (2.4, 1.8),
    "d4": (1.2, 1.6),
}
NORMS = [2.0, 1.0, 3.0, 2.0]
QRELS = {"q1": {"d1": 1}, "q2": {"d2": 2, "d4": 1}}


class VectorModel:
    """A hand-built "encoder": fixed raw vectors per text, each side normalized by the mode.

    It only has ``encode_queries``/``encode_documents`` (like the ONNX runtime), so evaluation
    must recover raw norms from the stored vectors.
    """

    def __init__(
        self,
        vectors: dict[str, Sequence[float]],
        mode: str,
        gamma_q: float | None = None,
        gamma_d: float | None = None,
    ):
        self.vectors = vectors
        self.similarity = similarity.resolve(mode, gamma_q, gamma_d)
        self.calls: Counter[str] = Counter()

    def raw(self, texts: Sequence[str]) -> np.ndarray:
        return np.array([self.vectors[t] for t in texts], dtype=np.float32)

    def encode_queries(self, texts, batch_size=64, progress=False) -> np.ndarray:
        self.calls["encode_queries"] += 1
        return similarity.query_vectors(self.raw(texts), self.similarity)

    def encode_documents(self, texts, batch_size=64, progress=False) -> np.ndarray:
        self.calls["encode_documents"] += 1
        return similarity.document_vectors(self.raw(texts), self.similarity)


class EmbeddingModel(VectorModel):
    """The same, plus ``embed`` (raw vectors), like the torch Encoder."""

    def embed(self, texts, side, batch_size=64, progress=False) -> np.ndarray:
        self.calls[f"embed:{side}"] += 1
        return self.raw(texts)


def toy_dataset() -> RetrievalDataset:
    corpus = {d: Document(d, d) for d in ("d1", "d2", "d3", "d4")}
    return RetrievalDataset("toy", "test", corpus, {"q1": "q1", "q2": "q2"}, QRELS)


# ----------------------------------------------------------------------------- exact search


def test_exact_search_matches_a_full_sort() -> None:
    rng = np.random.default_rng(0)
    q = rng.normal(size=(7, 5)).astype(np.float32)
    d = rng.normal(size=(11, 5)).astype(np.float32)
    full = q @ d.T
    idx, scores = exact_search(q, d, 4, chunk=3)  # chunks of 3 queries, the last one short
    np.testing.assert_array_equal(idx, np.argsort(-full, axis=1)[:, :4])
    np.testing.assert_allclose(scores, np.take_along_axis(full, idx, axis=1), rtol=1e-6)
    assert (np.diff(scores, axis=1) <= 0).all()
    idx_all, _ = exact_search(q, d, 100)  # k beyond the corpus: every document, ranked
    assert idx_all.shape == (7, 11)
    np.testing.assert_array_equal(np.sort(idx_all, axis=1), np.tile(np.arange(11), (7, 1)))


def test_exact_run_ranks_by_inner_product_and_names_ids() -> None:
    q = np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    d = np.array([[2.0, 0.0], [0.0, 1.0], [3.0, 0.8], [1.2, 1.6]], dtype=np.float32)
    # q1 scores 2, 0, 3, 1.2; q2 scores 0, 1, 0.8, 1.6
    run = exact_run(q, d, ["q1", "q2"], ["d1", "d2", "d3", "d4"], k=2)
    assert list(run["q1"]) == ["d3", "d1"] and run["q1"]["d3"] == pytest.approx(3.0)
    assert list(run["q2"]) == ["d4", "d2"] and run["q2"]["d4"] == pytest.approx(1.6)


def test_evaluate_vectors_scores_stored_vectors_by_exact_search() -> None:
    # qnorm stores q̂ and raw d: q1 ranks d3 (2.4) d1 (2) d4 (1.2) d2 (0)
    ndcg_q1 = 1 / math.log2(3)
    ndcg_q2 = (1 / math.log2(3) + 2 / math.log2(4)) / (2 + 1 / math.log2(3))
    got = evaluate_vectors(VectorModel(VECTORS, "qnorm"), toy_dataset(), label="fp32")
    assert got["ndcg@10"] == pytest.approx((ndcg_q1 + ndcg_q2) / 2)


# ----------------------------------------------------------------------------- retrieval metrics


def test_qnorm_metrics_and_cohens_d_by_hand() -> None:
    res = evaluate_retrieval(VectorModel(VECTORS, "qnorm"), toy_dataset(), progress=False)
    # qnorm scores q̂·d. q1: d3 2.4, d1 2, d4 1.2, d2 0. q2: d3 1.8, d4 1.6, d2 1, d1 0.
    assert list(res.run["q1"]) == ["d3", "d1", "d4", "d2"]
    assert res.run["q1"]["d3"] == pytest.approx(2.4) and res.run["q2"]["d4"] == pytest.approx(1.6)
    assert list(res.run["q2"]) == ["d3", "d4", "d2", "d1"]
    # NDCG@10 (trec_eval, linear gains): q1 relevant at rank 2 → 1/log2(3);
    # q2: DCG = 1/log2(3) + 2/log2(4), IDCG = 2 + 1/log2(3)
    ndcg_q1 = 1 / math.log2(3)
    ndcg_q2 = (1 / math.log2(3) + 1) / (2 + 1 / math.log2(3))
    assert res.ndcg_at_10 == pytest.approx((ndcg_q1 + ndcg_q2) / 2, abs=1e-4)
    assert res.mrr_at_10 == pytest.approx(0.5)  # both first relevant at rank 2
    assert res.recall_at_100 == pytest.approx(1.0)
    # Cohen's d of raw norms among each query's top-100 (= all 4 documents):
    # relevant [2 (q1:d1), 1 (q2:d2), 2 (q2:d4)], non-relevant [1, 3, 2 (q1), 2, 3 (q2)]
    # means 5/3 and 11/5, sample variances 1/3 and 7/10, pooled (2/3 + 14/5)/6
    pooled = (2 / 3 + 14 / 5) / 6
    assert res.cohens_d == pytest.approx((5 / 3 - 11 / 5) / math.sqrt(pooled), rel=1e-6)
    assert res.norm_cv == pytest.approx(math.sqrt(0.5) / 2, rel=1e-6)  # norms 2,1,3,2
    assert res.mean_doc_norm == pytest.approx(2.0)
    assert (res.mode, res.gamma_q, res.gamma_d) == ("qnorm", 1.0, 0.0)
    assert (res.n_queries, res.n_documents, res.dataset) == (2, 4, "toy:test")
    assert "run" not in res.to_dict() and res.to_dict(with_run=True)["run"] == res.run


def test_cohens_d_counts_only_the_top_k() -> None:
    res = evaluate_retrieval(VectorModel(VECTORS, "qnorm"), toy_dataset(), k=3, progress=False)
    # top-3: q1 d3, d1, d4 → rel [2], non [3, 2]; q2 d3, d4, d2 → rel [2, 1], non [3]
    # relevant [2, 2, 1] vs non-relevant [3, 2, 3]: means 5/3 vs 8/3, both variances 1/3
    assert res.cohens_d == pytest.approx(-math.sqrt(3), rel=1e-6)
    assert all(len(r) == 3 for r in res.run.values())


def test_cosine_ranks_by_direction_and_still_reports_raw_norm_statistics() -> None:
    data = toy_dataset()
    with_embed = evaluate_retrieval(EmbeddingModel(VECTORS, "cosine"), data, progress=False)
    # cosine: q1 d1 1, d3 .8, d4 .6, d2 0 → relevant first; q2 d2 1, d4 .8 → ideal order
    assert with_embed.ndcg_at_10 == pytest.approx(1.0)
    assert with_embed.mrr_at_10 == pytest.approx(1.0)
    pooled = (2 / 3 + 14 / 5) / 6  # the same documents retrieved, so the same raw-norm groups
    assert with_embed.cohens_d == pytest.approx((5 / 3 - 11 / 5) / math.sqrt(pooled), rel=1e-6)
    # without embed, stored cosine vectors are unit: the magnitude is gone, the statistics
    # say "unknown" (NaN) rather than describing float rounding
    stored_only = evaluate_retrieval(VectorModel(VECTORS, "cosine"), data, progress=False)
    assert stored_only.ndcg_at_10 == pytest.approx(1.0)
    assert math.isnan(stored_only.cohens_d) and math.isnan(stored_only.norm_cv)
    assert math.isnan(stored_only.mean_doc_norm)


def test_unit_stored_vectors_give_no_spurious_cohens_d() -> None:
    """float32 unit vectors have norms 1 ± 1e-7; a Cohen's d on those would be noise (≈ ±0.3)."""
    rng = np.random.default_rng(0)
    raw = rng.normal(size=(40, 16)) * rng.uniform(0.5, 5.0, size=(40, 1))
    vectors = {f"d{i}": tuple(v) for i, v in enumerate(raw)}
    vectors.update({f"q{i}": tuple(rng.normal(size=16)) for i in range(5)})
    corpus = {f"d{i}": Document(f"d{i}", f"d{i}") for i in range(40)}
    queries = {f"q{i}": f"q{i}" for i in range(5)}
    qrels = {f"q{i}": {f"d{i}": 1, f"d{i + 5}": 1} for i in range(5)}
    data = RetrievalDataset("rand", "test", corpus, queries, qrels)
    res = evaluate_retrieval(VectorModel(vectors, "cosine"), data, progress=False)
    assert math.isnan(res.cohens_d)
    raw_view = evaluate_retrieval(EmbeddingModel(vectors, "cosine"), data, progress=False)
    assert math.isfinite(raw_view.cohens_d) and raw_view.ndcg_at_10 == res.ndcg_at_10


@pytest.mark.parametrize(
    ("mode", "gamma_q", "gamma_d"),
    [("qnorm", None, None), ("dot", None, None), ("learnable", 0.7, 0.5), ("learnable", 1.0, 0.2)],
)
def test_raw_norms_recovered_from_stored_vectors(mode, gamma_q, gamma_d) -> None:
    """‖stored‖ = ‖d‖^(1−γd), so for γd < 1 the raw norm comes back from the stored vector."""
    model = VectorModel(VECTORS, mode, gamma_q, gamma_d)
    texts = ["d1", "d2", "d3", "d4"]
    stored, norms = raw_document_norms(model, None, texts, model.similarity, 64, False)
    np.testing.assert_allclose(norms, NORMS, rtol=1e-5)
    np.testing.assert_allclose(stored, model.encode_documents(texts), rtol=1e-6)
    # handing in the stored vectors skips encoding
    model.calls.clear()
    again, norms2 = raw_document_norms(model, stored, texts, model.similarity, 64, False)
    assert model.calls["encode_documents"] == 0 and again is stored
    np.testing.assert_allclose(norms2, NORMS, rtol=1e-5)
    # and the whole evaluation agrees with one that reads raw norms through embed
    a = evaluate_retrieval(model, toy_dataset(), progress=False)
    b = evaluate_retrieval(
        EmbeddingModel(VECTORS, mode, gamma_q, gamma_d), toy_dataset(), progress=False
    )
    assert a.cohens_d == pytest.approx(b.cohens_d, rel=1e-5)
    assert a.norm_cv == pytest.approx(b.norm_cv, rel=1e-5)
    assert a.ndcg_at_10 == pytest.approx(b.ndcg_at_10)


def test_corpus_is_encoded_once() -> None:
    for model, key in (
        (EmbeddingModel(VECTORS, "qnorm"), "embed:document"),
        (VectorModel(VECTORS, "qnorm"), "encode_documents"),
    ):
        evaluate_retrieval(model, toy_dataset(), progress=False)
        assert model.calls[key] == 1
        assert model.calls["encode_queries"] == 1
        assert sum(v for k, v in model.calls.items() if "document" in k) == 1


def test_magnitude_statistics_use_judged_relevance_only() -> None:
    # a judged-0 document counts as non-relevant; an unjudged query contributes non-relevant only
    top = np.array([[0, 1], [1, 2], [2, 0]])
    stats = magnitude_statistics(
        np.array([4.0, 1.0, 2.0]),
        top,
        ["a", "b", "c"],
        ["x", "y", "z"],
        {"a": {"x": 1, "y": 0}, "b": {"z": 2}},
    )
    # relevant: a→x (4), b→z (2); non-relevant: a→y 1, b→y 1, c→z 2, c→x 4
    assert stats["cohens_d"] == pytest.approx(metrics.cohens_d([4, 2], [1, 1, 2, 4]))
    assert stats["mean_doc_norm"] == pytest.approx(7 / 3)


def test_real_encoder_without_embed_matches_with_embed(
    tiny_model_dir: Path, tiny_beir_dir: Path
) -> None:
    """The ONNX-runtime path (stored vectors only) reports the torch path's norm statistics."""
    from magretrieve.data.readers import load_beir

    enc = Encoder.load(tiny_model_dir, "learnable", gamma_q=0.9, gamma_d=0.3, device="cpu")

    class StoredOnly:
        similarity = enc.similarity

        def encode_queries(self, texts, batch_size=64, progress=False):
            return enc.encode_queries(texts, batch_size, progress)

        def encode_documents(self, texts, batch_size=64, progress=False):
            return enc.encode_documents(texts, batch_size, progress)

    data = load_beir(f"{tiny_beir_dir}:test")
    a = evaluate_retrieval(enc, data, progress=False)
    b = evaluate_retrieval(StoredOnly(), data, progress=False)
    assert a.ndcg_at_10 == pytest.approx(b.ndcg_at_10)
    assert a.mean_doc_norm == pytest.approx(b.mean_doc_norm, rel=1e-4)
    assert a.norm_cv == pytest.approx(b.norm_cv, rel=1e-3)
    assert a.cohens_d == pytest.approx(b.cohens_d, rel=1e-3, abs=1e-4)
    assert a.run.keys() == b.run.keys()


# ----------------------------------------------------------------------------- STS, both orders

STS_VECTORS = {
    "a1": (1.0, 0.0),
    "b1": (3.0, 1.0),
    "a2": (0.5, 0.5),
    "b2": (0.0, 2.0),
    "a3": (2.0, 2.0),
    "b3": (1.0, -0.2),
    "a4": (0.2, 1.0),
    "b4": (4.0, 4.0),
}
STS_PAIRS = [
    SentencePair("a1", "b1", 5.0),
    SentencePair("a2", "b2", 2.0),
    SentencePair("a3", "b3", 3.0),
    SentencePair("a4", "b4", 1.0),
]


def _hand_scores(mode: str) -> tuple[np.ndarray, np.ndarray]:
    sim = similarity.resolve(mode)
    ab, ba = [], []
    for p in STS_PAIRS:
        a, b = np.array(STS_VECTORS[p.a]), np.array(STS_VECTORS[p.b])
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        ab.append(a @ b / (na**sim.gamma_q * nb**sim.gamma_d))
        ba.append(b @ a / (nb**sim.gamma_q * na**sim.gamma_d))
    return np.array(ab), np.array(ba)


@pytest.mark.parametrize("mode", ["cosine", "dot"])
def test_sts_symmetric_modes_have_no_asymmetry(mode: str) -> None:
    res = evaluate_sts(VectorModel(STS_VECTORS, mode), STS_PAIRS, name="toy", progress=False)
    ab, _ = _hand_scores(mode)
    assert res.max_asymmetry == pytest.approx(0.0, abs=1e-5)
    assert (
        res.spearman_ab
        == res.spearman_ba
        == pytest.approx(metrics.spearman(ab, [p.score for p in STS_PAIRS]))
    )
    assert (res.dataset, res.mode, res.n_pairs) == ("toy", mode, 4)


def test_sts_qnorm_scores_differ_by_order() -> None:
    res = evaluate_sts(VectorModel(STS_VECTORS, "qnorm"), STS_PAIRS, progress=False)
    ab, ba = _hand_scores("qnorm")
    # s(a,b) − s(b,a) = cos(a,b)·(‖b‖ − ‖a‖)
    gold = [p.score for p in STS_PAIRS]
    assert res.mean_asymmetry == pytest.approx(float(np.abs(ab - ba).mean()), rel=1e-5)
    assert res.max_asymmetry == pytest.approx(float(np.abs(ab - ba).max()), rel=1e-5)
    assert res.mean_asymmetry > 0.5
    assert res.spearman_ab == pytest.approx(metrics.spearman(ab, gold))
    assert res.spearman_ba == pytest.approx(metrics.spearman(ba, gold))
    assert res.spearman_ab != pytest.approx(res.spearman_ba)  # the order changes the result
    assert res.to_dict()["gamma_d"] == 0.0


def test_sts_on_the_tiny_encoder(tiny_model_dir: Path) -> None:
    pairs = [
        SentencePair("statins reduce heart risk", "the effect of aspirin on the heart", 3.0),
        SentencePair("wing flow", "boundary layer pressure on a plane wing", 4.0),
        SentencePair("vitamin", "what does smoking cause in the lung", 0.5),
    ]
    asym = {}
    for mode in ("cosine", "dot", "qnorm", "dnorm"):
        enc = Encoder.load(tiny_model_dir, mode, device="cpu")
        asym[mode] = evaluate_sts(enc, pairs, progress=False).max_asymmetry
    assert asym["cosine"] < 1e-5 and asym["dot"] < 1e-4
    assert asym["qnorm"] > 1e-2 and asym["dnorm"] > 1e-2


def test_eval_reports_truncated_queries(tiny_model_dir, tiny_beir_dir) -> None:
    """Queries cut at max_query_length are counted, not silently truncated."""
    from magretrieve.data.readers import load_beir
    from magretrieve.evaluation.retrieval import evaluate_retrieval
    from magretrieve.train.encoder import Encoder

    data = load_beir(f"{tiny_beir_dir}:test")
    full = Encoder.load(tiny_model_dir, "cosine", device="cpu")
    assert full.config.max_query_length >= 16  # the default: the model's own limit
    assert evaluate_retrieval(full, data, progress=False).truncated_queries == 0
    short = Encoder.load(tiny_model_dir, "cosine", max_query_length=3, device="cpu")
    lengths = short.tokenizer([f"{q}" for q in data.queries.values()])["input_ids"]
    expected = sum(len(ids) > 3 for ids in lengths)
    assert expected > 0
    assert evaluate_retrieval(short, data, progress=False).truncated_queries == expected
