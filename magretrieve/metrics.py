"""Retrieval metrics and magnitude statistics.

Ranking metrics come from trec_eval through ``pytrec_eval`` (package ``pytrec-eval-terrier``):
it is the reference implementation BEIR and MTEB report with, so our NDCG@10 is comparable
to published numbers, and it ships wheels without extra dependencies.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

Run = Mapping[str, Mapping[str, float]]
Qrels = Mapping[str, Mapping[str, int]]


def retrieval_metrics(qrels: Qrels, run: Run) -> dict[str, float]:
    """Mean NDCG@10, Recall@100 and MRR@10 over the queries that have judgements.

    Queries missing from ``run`` count as zero (trec_eval would silently skip them).
    """
    import pytrec_eval

    qrels = {q: {d: int(r) for d, r in docs.items()} for q, docs in qrels.items()}
    # plain floats: pytrec_eval refuses numpy scalars ("Unable to extract query/object scores")
    run = {q: {d: float(s) for d, s in docs.items()} for q, docs in run.items()}
    run10 = {q: dict(sorted(docs.items(), key=lambda kv: -kv[1])[:10]) for q, docs in run.items()}
    full = pytrec_eval.RelevanceEvaluator(qrels, {"ndcg_cut.10", "recall.100"}).evaluate(run)
    mrr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(run10)
    n = len(qrels)
    return {
        "ndcg@10": sum(v["ndcg_cut_10"] for v in full.values()) / n,
        "recall@100": sum(v["recall_100"] for v in full.values()) / n,
        "mrr@10": sum(v["recip_rank"] for v in mrr.values()) / n,
    }


def cohens_d(relevant: Sequence[float], nonrelevant: Sequence[float]) -> float:
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


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Population standard deviation over mean; the paper's CV of norms."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0 or x.mean() == 0:
        return float("nan")
    return float(x.std() / x.mean())


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation (ties averaged), as STS benchmarks report it."""
    from scipy.stats import spearmanr

    return float(spearmanr(np.asarray(x), np.asarray(y)).statistic)
