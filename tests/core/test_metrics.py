"""Ranking metrics and magnitude statistics against hand-worked examples."""

from __future__ import annotations

import math

import pytest

from magretrieve.core import metrics

LOG2_3 = math.log2(3)  # 1.5849625

# Hand-worked example (trec_eval NDCG uses linear gain rel / log2(rank + 1)):
#
# qA: qrels {d1: 1, d3: 1}; run ranks d1 (rel 1), d2 (rel 0), d3 (rel 1)
#     DCG  = 1/log2(2) + 1/log2(4) = 1 + 0.5            = 1.5
#     IDCG = 1/log2(2) + 1/log2(3) = 1 + 0.6309298      = 1.6309298
#     NDCG@10 = 1.5 / 1.6309298 = 0.9197207; Recall@100 = 2/2 = 1; MRR@10 = 1/1 = 1
# qB: qrels {d2: 2, d5: 1}; run ranks d4 (0), d5 (1), d2 (2)
#     DCG  = 0 + 1/log2(3) + 2/log2(4) = 0.6309298 + 1    = 1.6309298
#     IDCG = 2/log2(2) + 1/log2(3)     = 2 + 0.6309298    = 2.6309298
#     NDCG@10 = 1.6309298 / 2.6309298 = 0.6199062; Recall@100 = 2/2 = 1; MRR@10 = 1/2
# qC: qrels {d9: 1}; absent from the run -> 0 for every metric
# Means over 3 judged queries: NDCG@10 = (0.9197207 + 0.6199062 + 0)/3 = 0.5132090
#                              Recall@100 = (1 + 1 + 0)/3 = 2/3;  MRR@10 = (1 + 0.5 + 0)/3 = 0.5
QRELS = {"qA": {"d1": 1, "d3": 1}, "qB": {"d2": 2, "d5": 1}, "qC": {"d9": 1}}
RUN = {
    "qA": {"d1": 0.9, "d2": 0.8, "d3": 0.7},
    "qB": {"d4": 0.9, "d5": 0.8, "d2": 0.7},
}
NDCG_A = 1.5 / (1 + 1 / LOG2_3)
NDCG_B = (1 / LOG2_3 + 1) / (2 + 1 / LOG2_3)


def test_hand_values_are_what_the_comment_says() -> None:
    assert abs(NDCG_A - 0.9197207) < 1e-7
    assert abs(NDCG_B - 0.6199062) < 1e-7


def test_retrieval_metrics_hand_example() -> None:
    m = metrics.retrieval_metrics(QRELS, RUN)
    assert set(m) == {"ndcg@10", "recall@100", "mrr@10"}
    assert m["ndcg@10"] == pytest.approx((NDCG_A + NDCG_B) / 3, abs=1e-6)
    assert m["ndcg@10"] == pytest.approx(0.5132090, abs=1e-6)
    assert m["recall@100"] == pytest.approx(2 / 3, abs=1e-9)
    assert m["mrr@10"] == pytest.approx(0.5, abs=1e-9)


def test_missing_query_counts_as_zero() -> None:
    # qC alone, not in the run: every metric 0 (trec_eval itself would skip it)
    m = metrics.retrieval_metrics({"qC": {"d9": 1}}, {"qA": {"d9": 1.0}})
    assert m == {"ndcg@10": 0.0, "recall@100": 0.0, "mrr@10": 0.0}
    # dropping qC from the qrels raises the means to the two-query averages
    m2 = metrics.retrieval_metrics({k: QRELS[k] for k in ("qA", "qB")}, RUN)
    assert m2["ndcg@10"] == pytest.approx((NDCG_A + NDCG_B) / 2, abs=1e-6)
    assert m2["mrr@10"] == pytest.approx(0.75, abs=1e-9)


def test_queries_only_in_the_run_are_ignored() -> None:
    run = {**RUN, "qZ": {"d1": 1.0}}
    assert metrics.retrieval_metrics(QRELS, run) == pytest.approx(
        metrics.retrieval_metrics(QRELS, RUN)
    )


def test_cutoffs() -> None:
    # the one relevant doc at rank 11: outside NDCG@10 and MRR@10, inside Recall@100
    run = {"q": {f"n{i}": 100.0 - i for i in range(10)} | {"rel": 1.0}}
    m = metrics.retrieval_metrics({"q": {"rel": 1}}, run)
    assert m["ndcg@10"] == 0.0
    assert m["mrr@10"] == 0.0
    assert m["recall@100"] == 1.0
    # at rank 101 it is outside Recall@100 as well
    run = {"q": {f"n{i}": 1000.0 - i for i in range(100)} | {"rel": 1.0}}
    assert metrics.retrieval_metrics({"q": {"rel": 1}}, run)["recall@100"] == 0.0
    # at rank 10: NDCG@10 = (1/log2(11)) / 1 = 0.2890648, MRR@10 = 1/10
    run = {"q": {f"n{i}": 100.0 - i for i in range(9)} | {"rel": 1.0}}
    m = metrics.retrieval_metrics({"q": {"rel": 1}}, run)
    assert m["ndcg@10"] == pytest.approx(1 / math.log2(11), abs=1e-6)
    assert m["ndcg@10"] == pytest.approx(0.2890648, abs=1e-6)
    assert m["mrr@10"] == pytest.approx(0.1, abs=1e-9)


def test_run_order_is_by_score_not_insertion() -> None:
    # the dict lists the relevant doc first but scores it lowest: rank 2 of 2
    m = metrics.retrieval_metrics({"q": {"r": 1}}, {"q": {"r": 0.1, "n": 0.5}})
    assert m["mrr@10"] == pytest.approx(0.5)
    assert m["ndcg@10"] == pytest.approx(1 / LOG2_3, abs=1e-6)


# ----------------------------------------------------------------------------- Cohen's d, CV


def test_cohens_d_hand_example() -> None:
    # relevant 3,4,5 (mean 4, s² 1); non-relevant 1,2,3 (mean 2, s² 1)
    # pooled s² = (2·1 + 2·1)/(3 + 3 − 2) = 1  ->  d = (4 − 2)/1 = 2
    assert metrics.cohens_d([3, 4, 5], [1, 2, 3]) == pytest.approx(2.0)
    # relevant 2,4,6,8 (mean 5, s² = (9+1+1+9)/3 = 20/3); non-relevant 1,3 (mean 2, s² = 2)
    # pooled s² = (3·20/3 + 1·2)/(4 + 2 − 2) = 22/4 = 5.5  ->  d = 3/√5.5 = 1.2792043
    assert metrics.cohens_d([2, 4, 6, 8], [1, 3]) == pytest.approx(1.2792043, abs=1e-7)
    # antisymmetric
    assert metrics.cohens_d([1, 3], [2, 4, 6, 8]) == pytest.approx(-1.2792043, abs=1e-7)


def test_cohens_d_degenerate() -> None:
    assert math.isnan(metrics.cohens_d([1.0], [1.0, 2.0]))  # too few to estimate a variance
    assert math.isnan(metrics.cohens_d([1.0, 2.0], []))
    assert metrics.cohens_d([2.0, 2.0], [2.0, 2.0]) == 0.0  # no spread, no difference
    assert math.isnan(metrics.cohens_d([3.0, 3.0], [2.0, 2.0]))  # no spread, a difference


def test_coefficient_of_variation_hand_example() -> None:
    # 1,2,3,4: mean 2.5, population σ = √((2.25 + 0.25 + 0.25 + 2.25)/4) = √1.25 = 1.1180340
    # CV = 1.1180340 / 2.5 = 0.4472136
    assert metrics.coefficient_of_variation([1, 2, 3, 4]) == pytest.approx(0.4472136, abs=1e-7)
    assert metrics.coefficient_of_variation([5, 5, 5]) == 0.0
    # scale-free: multiplying every norm by 7 keeps the CV
    assert metrics.coefficient_of_variation([7, 14, 21, 28]) == pytest.approx(0.4472136, abs=1e-7)
    assert math.isnan(metrics.coefficient_of_variation([]))
    assert math.isnan(metrics.coefficient_of_variation([0.0, 0.0]))


def test_spearman_hand_example() -> None:
    # x ranks 1..5; y = 5,6,7,8,7 ranks 1,2,3.5,5,3.5 (tie averaged)
    # deviations: x −2,−1,0,1,2; y −2,−1,0.5,2,0.5; Σdxdy = 4+1+0+2+1 = 8
    # Σdx² = 10, Σdy² = 4+1+0.25+4+0.25 = 9.5  ->  ρ = 8/√95 = 0.8207827
    assert metrics.spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207827, abs=1e-7)
    assert metrics.spearman([1, 2, 3], [10, 200, 3000]) == pytest.approx(1.0)
    assert metrics.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_numpy_scores_and_labels_are_accepted() -> None:
    import numpy as np

    run = {q: {d: np.float32(s) for d, s in docs.items()} for q, docs in RUN.items()}
    qrels = {q: {d: np.int64(r) for d, r in docs.items()} for q, docs in QRELS.items()}
    assert metrics.retrieval_metrics(qrels, run) == pytest.approx(
        metrics.retrieval_metrics(QRELS, RUN), abs=1e-6
    )


def test_numpy_metrics_equal_trec_eval_on_random_runs_with_ties() -> None:
    """The scipy-free fallback of a serving install computes what trec_eval computes."""
    import numpy as np

    rng = np.random.default_rng(7)
    for trial in range(40):
        docs = [f"d{i}" for i in range(rng.integers(5, 150))]
        qrels, run = {}, {}
        for q in range(rng.integers(1, 8)):
            judged = rng.choice(docs, size=rng.integers(1, min(12, len(docs))), replace=False)
            qrels[f"q{q}"] = {d: int(rng.integers(0, 4)) for d in judged}
            if rng.random() < 0.9:  # some queries have no run at all
                retrieved = rng.choice(docs, size=rng.integers(1, len(docs)), replace=False)
                # coarse scores: many ties, which trec_eval breaks by document id
                run[f"q{q}"] = {d: float(rng.integers(0, 6)) / 5 for d in retrieved}
        qrels = {q: j for q, j in qrels.items() if any(g > 0 for g in j.values())} or {
            "q0": {docs[0]: 1}
        }
        expected = metrics.retrieval_metrics(qrels, run)
        got = metrics.numpy_retrieval_metrics(qrels, run)
        assert got == pytest.approx(expected, abs=1e-9), trial
