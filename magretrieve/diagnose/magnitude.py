"""Does magnitude carry relevance? Norm CV, Cohen's d of raw norms, and the norm–length bias.

* ``norm_cv``: coefficient of variation of raw document norms over the corpus (paper:
  ≥ 0.1 suggests magnitude is already in use).
* ``cohens_d``: raw ‖d‖ of relevant vs non-relevant documents among each query's top-100
  under the model's own similarity (paper: > 0.5 means magnitude carries relevance; a
  negative d means norms point *away* from relevance, as in normalization-pretrained models).
* ``pearson_norm_length`` / ``spearman_norm_length``: correlation of ‖d‖ with the number
  of tokens the model saw (the known length bias of dot-product models).

Search and the statistics come from :mod:`magretrieve.evaluation.retrieval`; nothing is re-derived here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from magretrieve.core import metrics, similarity
from magretrieve.core.topk import exact_search
from magretrieve.data.readers import RetrievalDataset
from magretrieve.diagnose.cache import EmbeddingCache
from magretrieve.evaluation.retrieval import evaluate_retrieval

#: Cohen's d above which the paper reads "magnitude carries relevance".
CARRIES_D = 0.5
#: Cohen's d at or below which norms point away from relevance ("small" effect, Cohen 1988).
ANTI_D = -0.2
#: Corpus norm CV from which the paper reads "magnitude is already in use".
CV_IN_USE = 0.1


@dataclass
class MagnitudeSignal:
    """Magnitude figures of one model on one BEIR split."""

    dataset: str
    mode: str
    cohens_d: float
    norm_cv: float
    mean_doc_norm: float
    mean_norm_relevant: float
    mean_norm_nonrelevant: float
    pearson_norm_length: float
    spearman_norm_length: float
    #: NDCG@10 of the model as it is under cosine-ranking (γd = 1) and dot-ranking (γd = 0).
    ndcg_at_10: dict[str, float] = field(default_factory=dict)
    verdict: str = ""
    # plot material, not written to JSON
    relevant_norms: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    nonrelevant_norms: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    doc_norms: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    doc_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    top_hits: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in (
            "relevant_norms",
            "nonrelevant_norms",
            "doc_norms",
            "doc_lengths",
            "top_hits",
        ):
            data.pop(key)
        return data


def norm_length_correlation(norms: ArrayLike, lengths: ArrayLike) -> tuple[float, float]:
    """(Pearson, Spearman) of document norm vs token length; NaN when either is constant."""
    x = np.asarray(lengths, dtype=np.float64)
    y = np.asarray(norms, dtype=np.float64)
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return float("nan"), float("nan")
    return float(np.corrcoef(x, y)[0, 1]), metrics.spearman(x, y)


def magnitude_verdict(cohens_d: float, norm_cv: float) -> str:
    """One sentence on what the raw norms say about relevance."""
    cv_text = (
        f"corpus norm CV {norm_cv:.3f} (≥ {CV_IN_USE}: norms vary, magnitude may already be in use)"
        if norm_cv >= CV_IN_USE
        else f"corpus norm CV {norm_cv:.3f} (< {CV_IN_USE}: norms nearly constant)"
    )
    if not np.isfinite(cohens_d):
        return f"Cohen's d undefined (too few relevant documents retrieved); {cv_text}"
    if cohens_d > CARRIES_D:
        head = f"magnitude already carries relevance here (Cohen's d {cohens_d:.2f} > {CARRIES_D})"
    elif cohens_d <= ANTI_D:
        head = (
            f"raw norms point away from relevance (Cohen's d {cohens_d:.2f} ≤ {ANTI_D}): relevant "
            "documents have smaller norms"
        )
    else:
        head = f"magnitude carries little relevance signal yet (Cohen's d {cohens_d:.2f})"
    return f"{head}; {cv_text}"


def magnitude_signal(
    cache: EmbeddingCache,
    dataset: RetrievalDataset,
    sim: similarity.Similarity,
    *,
    k: int = 100,
    top_hits: int = 10,
    progress: bool = True,
) -> MagnitudeSignal:
    """Magnitude figures of the vectors behind ``cache`` on ``dataset`` under ``sim``.

    Cohen's d and CV come from :func:`magretrieve.evaluation.retrieval.evaluate_retrieval` (top-``k``
    under ``sim``); NDCG@10 is added for cosine- and dot-ranking (cheap: vectors are cached).
    """
    own = evaluate_retrieval(cache.view(sim), dataset, k=k, progress=progress)
    doc_ids = list(dataset.corpus)
    texts = [dataset.corpus[i].full_text for i in doc_ids]
    raw_docs = cache.embed(texts, "document", progress=progress and "encoding corpus")
    norms = np.linalg.norm(raw_docs, axis=1)
    lengths = np.asarray(cache.token_lengths(texts, "document"), dtype=np.float64)
    pearson, spear = norm_length_correlation(norms, lengths)

    qids = list(dataset.queries)
    raw_q = cache.embed([dataset.queries[q] for q in qids], "query")
    stored_q = similarity.query_vectors(raw_q, sim)
    stored_d = similarity.document_vectors(raw_docs, sim)
    idx, _ = exact_search(stored_q, stored_d, k)
    rel_mask = np.array(
        [
            [dataset.qrels.get(q, {}).get(doc_ids[j], 0) > 0 for j in idx[r]]
            for r, q in enumerate(qids)
        ]
    )
    picked = norms[idx]
    # score decomposition of the top hits: cos θ vs raw ‖d‖ (what one-sided modes multiply by)
    unit_q = similarity.partial_normalize(raw_q, 1.0)
    unit_d = similarity.partial_normalize(raw_docs, 1.0)
    top = idx[:, :top_hits]
    cos = np.einsum("qd,qkd->qk", unit_q, unit_d[top])

    ndcg: dict[str, float] = {}
    for name in ("cosine", "dot"):
        if name == sim.ranks_like:
            ndcg[name] = own.ndcg_at_10
        else:
            ndcg[name] = evaluate_retrieval(
                cache.view(similarity.resolve(name)), dataset, k=k, progress=False
            ).ndcg_at_10
    rel_norms, non_norms = picked[rel_mask], picked[~rel_mask]
    return MagnitudeSignal(
        dataset=own.dataset,
        mode=sim.mode,
        cohens_d=own.cohens_d,
        norm_cv=own.norm_cv,
        mean_doc_norm=own.mean_doc_norm,
        mean_norm_relevant=float(rel_norms.mean()) if rel_norms.size else float("nan"),
        mean_norm_nonrelevant=float(non_norms.mean()) if non_norms.size else float("nan"),
        pearson_norm_length=pearson,
        spearman_norm_length=spear,
        ndcg_at_10=ndcg,
        verdict=magnitude_verdict(own.cohens_d, own.norm_cv),
        relevant_norms=rel_norms,
        nonrelevant_norms=non_norms,
        doc_norms=norms,
        doc_lengths=lengths,
        top_hits={
            "cosine": cos.reshape(-1),
            "doc_norm": norms[top].reshape(-1),
            "relevant": rel_mask[:, :top_hits].reshape(-1),
        },
    )
