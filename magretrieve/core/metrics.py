"""Retrieval metrics and magnitude statistics.

Ranking metrics come from trec_eval through ``pytrec_eval`` (package ``pytrec-eval-terrier``):
it is the reference implementation BEIR and MTEB report with, so our NDCG@10 is comparable
to published numbers, and it ships wheels without extra dependencies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from numpy.typing import ArrayLike

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def retrieval_metrics(qrels: Qrels, run: Run) -> dict[str, float]:
    """Mean NDCG@10, Recall@100 and MRR@10 over the queries that have judgements.

    Queries missing from ``run`` count as zero (trec_eval would silently skip them). Computed by
    trec_eval (``pytrec_eval``, the ``eval`` extra) where it is installed; a serving install
    without it (pytrec_eval needs scipy, a large install) uses :func:`numpy_retrieval_metrics`, which
    tests/core/test_metrics.py holds equal to trec_eval on random runs with ties.
    """
    qrels = {q: {d: int(r) for d, r in docs.items()} for q, docs in qrels.items()}
    # plain floats: pytrec_eval refuses numpy scalars ("Unable to extract query/object scores")
    run = {q: {d: float(s) for d, s in docs.items()} for q, docs in run.items()}
    try:
        import pytrec_eval
    except ImportError:
        return numpy_retrieval_metrics(qrels, run)
    run10 = {q: dict(_trec_order(docs)[:10]) for q, docs in run.items()}
    full = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    mrr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run10)
    n = len(qrels)
    return {
        "ndcg@10": sum(v["ndcg_cut_10"] for v in full.values()) / n,
        "recall@100": sum(v["recall_100"] for v in full.values()) / n,
        "mrr@10": sum(v["recip_rank"] for v in mrr.values()) / n,
    }


def _trec_order(docs: Mapping[str, float]) -> list[tuple[str, float]]:
    """trec_eval's ranking: score descending, ties broken by document id descending."""
    return sorted(docs.items(), key=lambda kv: (-kv[1], _Desc(kv[0])))


class _Desc(str):
    """A string that sorts in reverse (for the tie rule of trec_eval)."""

    def __lt__(self, other: str) -> bool:
        return str.__gt__(self, other)


def numpy_retrieval_metrics(qrels: Qrels, run: Run) -> dict[str, float]:
    """trec_eval's ndcg_cut.10, recall.100 and recip_rank (of the top 10), without trec_eval.

    Hand-written (40 lines) so that the serving install can choose a prior on training queries
    without scipy; the definitions follow trec_eval: gains are the relevance grades, log2
    discounts, ideal ordering of the judged grades; relevant means grade > 0.
    """
    ndcg = recall = mrr = 0.0
    for qid, judged in qrels.items():
        ranked = [d for d, _ in _trec_order(run.get(qid, {}))]
        gains = [max(int(judged.get(d, 0)), 0) for d in ranked]
        dcg = sum(g / math.log2(i + 2) for i, g in enumerate(gains[:10]))
        ideal = sorted((g for g in judged.values() if g > 0), reverse=True)[:10]
        idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
        ndcg += dcg / idcg if idcg > 0 else 0.0
        relevant = sum(1 for g in judged.values() if g > 0)
        recall += sum(1 for g in gains[:100] if g > 0) / relevant if relevant else 0.0
        first = next((i for i, g in enumerate(gains[:10]) if g > 0), None)
        mrr += 1.0 / (first + 1) if first is not None else 0.0
    n = len(qrels)
    return {"ndcg@10": ndcg / n, "recall@100": recall / n, "mrr@10": mrr / n}


def cohens_d(relevant: ArrayLike, nonrelevant: ArrayLike) -> float:
    """(mean_rel − mean_non) / pooled standard deviation (sample variances, n−1).

    Above 0.5 the paper reads as "magnitude carries relevance"; NaN when undefined.
    """
    a = np.asarray(relevant, dtype=np.float64)
    b = np.asarray(nonrelevant, dtype=np.float64)
    if len(a) < 2 or len(b) < 2:
        return float("nan")
    pooled = ((len(a) - 1) * a.var(ddof=1) + (len(b) - 1) * b.var(ddof=1)) / (len(a) + len(b) - 2)
    if pooled <= 0:
        return 0.0 if math.isclose(a.mean(), b.mean()) else float("nan")
    return float((a.mean() - b.mean()) / math.sqrt(pooled))


def coefficient_of_variation(values: ArrayLike) -> float:
    """Population standard deviation over mean; the paper's CV of norms."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0 or x.mean() == 0:
        return float("nan")
    return float(x.std() / x.mean())


def spearman(x: ArrayLike, y: ArrayLike) -> float:
    """Spearman rank correlation (ties averaged), as STS benchmarks report it."""
    from magretrieve.core.extras import require

    stats = require("scipy.stats", what="STS evaluation")
    return float(stats.spearmanr(np.asarray(x), np.asarray(y)).statistic)
