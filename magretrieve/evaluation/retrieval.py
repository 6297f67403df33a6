"""Evaluation: exact search with the model's own similarity, ranking metrics, and magnitude statistics.

It consumes vectors, not models: anything with ``encode_queries``/``encode_documents``
(the torch :class:`~magretrieve.train.encoder.Encoder` or the ONNX runtime) can be evaluated.
Cohen's d of document norms and the corpus norm CV are reported next to NDCG because they
tell a user whether magnitude carries relevance.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from magretrieve.core import metrics, similarity
from magretrieve.core.topk import exact_search
from magretrieve.data.readers import RetrievalDataset, SentencePair


@dataclass
class RetrievalEval:
    """Metrics of one model on one BEIR split."""

    dataset: str
    mode: str
    gamma_q: float
    gamma_d: float
    ndcg_at_10: float
    recall_at_100: float
    mrr_at_10: float
    #: Cohen's d of raw document norms, relevant vs non-relevant among each query's top-100.
    cohens_d: float
    #: Coefficient of variation of raw document norms over the corpus.
    norm_cv: float
    mean_doc_norm: float
    n_queries: int
    n_documents: int
    seconds: float
    run: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)
    #: Queries longer than the model's query length (cut before encoding); -1 when unknown.
    truncated_queries: int = -1

    def to_dict(self, with_run: bool = False) -> dict[str, Any]:
        data = asdict(self)
        if not with_run:
            data.pop("run")
        return data


def _run(
    idx: np.ndarray, scores: np.ndarray, qids: Sequence[str], doc_ids: Sequence[str]
) -> dict[str, dict[str, float]]:
    return {
        qid: {doc_ids[j]: float(s) for j, s in zip(idx[row], scores[row], strict=True)}
        for row, qid in enumerate(qids)
    }


def exact_run(
    queries: np.ndarray,
    documents: np.ndarray,
    qids: Sequence[str],
    doc_ids: Sequence[str],
    k: int = 100,
) -> dict[str, dict[str, float]]:
    """A run (query id → {document id: score}) of exact top-``k`` inner-product search.

    Inner product is the index metric of every export, so stored vectors are searched as
    an index would, without one.
    """
    idx, scores = exact_search(np.asarray(queries), np.asarray(documents), k)
    return _run(idx, scores, qids, doc_ids)


def evaluate_vectors(
    encoder: Any, dataset: RetrievalDataset, batch_size: int = 32, label: str = ""
) -> dict[str, float]:
    """NDCG@10, Recall@100 and MRR@10 (:func:`magretrieve.core.metrics.retrieval_metrics`)
    of the vectors ``encoder`` stores for ``dataset``, by exact search.

    Used to compare two exports of one model (an int8 export with its fp32 twin): no
    magnitude statistics, just what the vectors cost in ranking. ``label`` prefixes the
    progress bars.
    """
    doc_ids = list(dataset.corpus)
    qids = list(dataset.queries)
    docs = encoder.encode_documents(
        [dataset.corpus[d].full_text for d in doc_ids],
        batch_size=batch_size,
        progress=f"{label} documents".strip(),
    )
    queries = encoder.encode_queries(
        [dataset.queries[q] for q in qids],
        batch_size=batch_size,
        progress=f"{label} queries".strip(),
    )
    return metrics.retrieval_metrics(dataset.qrels, exact_run(queries, docs, qids, doc_ids))


def raw_document_norms(
    encoder: Any,
    stored: np.ndarray | None,
    texts: Sequence[str],
    sim: similarity.Similarity,
    batch_size: int,
    progress: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Stored document vectors and the raw norms ‖d‖ behind them, encoding the corpus once.

    Without ``embed`` the norms are recovered from the stored vectors when γd < 1, and are
    NaN when γd = 1 (the statistics built on them then read NaN, i.e. unknown).
    """
    if hasattr(encoder, "embed"):
        raw = encoder.embed(
            texts,
            "document",
            batch_size=batch_size,
            progress="encoding corpus" if progress else False,
        )
        return similarity.document_vectors(raw, sim), np.linalg.norm(raw, axis=1)
    if stored is None:
        stored = encoder.encode_documents(
            texts, batch_size=batch_size, progress="encoding corpus" if progress else False
        )
    stored_norms = np.linalg.norm(stored, axis=1)
    if sim.gamma_d < 1.0:  # ‖stored‖ = ‖d‖^(1−γd)
        return stored, np.power(np.maximum(stored_norms, similarity.EPS), 1.0 / (1.0 - sim.gamma_d))
    # Magnitude is gone from unit stored vectors: the raw norms are unknown (NaN), not 1 —
    # float32 rounding of unit norms would otherwise give a meaningless Cohen's d.
    return stored, np.full(len(stored), np.nan)


def magnitude_statistics(
    doc_norms: np.ndarray,
    top_idx: np.ndarray,
    qids: Sequence[str],
    doc_ids: Sequence[str],
    qrels: dict[str, dict[str, int]],
) -> dict[str, float]:
    """Cohen's d of norms (relevant vs non-relevant in each query's retrieved list) and corpus CV."""
    rel: list[float] = []
    non: list[float] = []
    for row, qid in enumerate(qids):
        judged = qrels.get(qid, {})
        for j in top_idx[row]:
            (rel if judged.get(doc_ids[j], 0) > 0 else non).append(doc_norms[j])
    return {
        "cohens_d": metrics.cohens_d(rel, non),
        "norm_cv": metrics.coefficient_of_variation(doc_norms),
        "mean_doc_norm": float(np.mean(doc_norms)),
    }


def evaluate_retrieval(
    encoder: Any,
    dataset: RetrievalDataset,
    *,
    k: int = 100,
    batch_size: int = 64,
    progress: bool = True,
    sim: similarity.Similarity | None = None,
) -> RetrievalEval:
    """Exact search of ``dataset`` with the model's own similarity, plus magnitude statistics."""
    started = time.perf_counter()
    sim = sim or encoder.similarity
    doc_ids = list(dataset.corpus)
    texts = [dataset.corpus[i].full_text for i in doc_ids]
    qids = list(dataset.queries)
    stored, norms = raw_document_norms(encoder, None, texts, sim, batch_size, progress)
    q = encoder.encode_queries(
        [dataset.queries[i] for i in qids],
        batch_size=batch_size,
        progress="encoding queries" if progress else False,
    )
    truncated: Any = getattr(encoder, "last_truncated", None)
    if truncated is None:
        truncated = getattr(getattr(encoder, "encoder", None), "last_truncated", -1)
    q = np.asarray(q, dtype=np.float32)
    top_idx, top_scores = exact_search(q, stored, k)
    run = _run(top_idx, top_scores, qids, doc_ids)
    scores = metrics.retrieval_metrics(dataset.qrels, run)
    mags = magnitude_statistics(norms, top_idx, qids, doc_ids, dataset.qrels)
    return RetrievalEval(
        dataset=f"{dataset.name}:{dataset.split}",
        mode=sim.mode,
        gamma_q=sim.gamma_q,
        gamma_d=sim.gamma_d,
        ndcg_at_10=scores["ndcg@10"],
        recall_at_100=scores["recall@100"],
        mrr_at_10=scores["mrr@10"],
        cohens_d=mags["cohens_d"],
        norm_cv=mags["norm_cv"],
        mean_doc_norm=mags["mean_doc_norm"],
        n_queries=len(qids),
        n_documents=len(doc_ids),
        seconds=time.perf_counter() - started,
        run=run,
        truncated_queries=int(truncated),
    )


@dataclass
class StsEval:
    """Spearman of model scores vs gold on a symmetric pair set, in both argument orders."""

    dataset: str
    mode: str
    gamma_q: float
    gamma_d: float
    spearman_ab: float
    spearman_ba: float
    mean_asymmetry: float
    max_asymmetry: float
    n_pairs: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def evaluate_sts(
    encoder: Any,
    pairs: Sequence[SentencePair],
    *,
    name: str = "sts",
    batch_size: int = 64,
    progress: bool = True,
    sim: similarity.Similarity | None = None,
) -> StsEval:
    """Score s(a, b) and s(b, a) with the mode's two sides; one-sided modes show asymmetry here."""
    sim = sim or encoder.similarity
    a = [p.a for p in pairs]
    b = [p.b for p in pairs]
    gold = [p.score for p in pairs]
    qa = encoder.encode_queries(
        a, batch_size=batch_size, progress="encoding pairs (a)" if progress else False
    )
    qb = encoder.encode_queries(
        b, batch_size=batch_size, progress="encoding pairs (b)" if progress else False
    )
    da = encoder.encode_documents(
        a, batch_size=batch_size, progress="encoding pairs (a)" if progress else False
    )
    db = encoder.encode_documents(
        b, batch_size=batch_size, progress="encoding pairs (b)" if progress else False
    )
    ab = np.einsum("ij,ij->i", qa, db)
    ba = np.einsum("ij,ij->i", qb, da)
    diff = np.abs(ab - ba)
    return StsEval(
        dataset=name,
        mode=sim.mode,
        gamma_q=sim.gamma_q,
        gamma_d=sim.gamma_d,
        spearman_ab=metrics.spearman(ab, gold),
        spearman_ba=metrics.spearman(ba, gold),
        mean_asymmetry=float(diff.mean()),
        max_asymmetry=float(diff.max()),
        n_pairs=len(pairs),
    )
