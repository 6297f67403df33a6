"""NDCG@10 of an export on a BEIR split, by exact inner-product search in numpy.

Used to compare an int8 export with its fp32 twin on a data set the user names: the
agreement numbers say how close the vectors are, this says what it costs in ranking.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from magretrieve.core.metrics import retrieval_metrics

if TYPE_CHECKING:  # pragma: no cover
    from magretrieve.data.readers import RetrievalDataset
    from magretrieve.serving.runtime import OnnxEncoder


def exact_run(
    query_vecs: np.ndarray, doc_vecs: np.ndarray, qids: list[str], dids: list[str], k: int = 100
) -> dict[str, dict[str, float]]:
    """Top-``k`` documents per query by inner product (the index metric of every export)."""
    scores = query_vecs @ doc_vecs.T
    k = min(k, len(dids))
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    return {qid: {dids[j]: float(scores[i, j]) for j in top[i]} for i, qid in enumerate(qids)}


def evaluate_export(
    encoder: OnnxEncoder, dataset: RetrievalDataset, batch_size: int = 32, label: str = ""
) -> dict[str, float]:
    """NDCG@10, Recall@100 and MRR@10 of ``encoder`` on ``dataset`` (exact search)."""
    dids = list(dataset.corpus)
    qids = list(dataset.queries)
    docs = encoder.encode_documents(
        [dataset.corpus[d].full_text for d in dids],
        batch_size=batch_size,
        progress=f"{label} documents".strip(),
    )
    queries = encoder.encode_queries(
        [dataset.queries[q] for q in qids],
        batch_size=batch_size,
        progress=f"{label} queries".strip(),
    )
    return retrieval_metrics(dataset.qrels, exact_run(queries, docs, qids, dids))
