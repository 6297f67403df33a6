"""Hard negatives for contrastive training, mined with the starting model.

For each training query the starting encoder ranks the whole corpus exactly; the top documents
that are neither judged relevant nor share a relevant document's text become that query's hard
negatives (``TrainingPair.negatives``, used by ``TrainConfig.hard_negatives``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from magretrieve.core.topk import exact_search
from magretrieve.data.readers import RetrievalDataset, TrainingPair
from magretrieve.train.encoder import Encoder


def mine_hard_negatives(
    encoder: Encoder,
    dataset: RetrievalDataset,
    pairs: Sequence[TrainingPair],
    count: int,
    *,
    top: int = 30,
    progress: bool = True,
) -> list[TrainingPair]:
    """Attach ``count`` hard negatives per pair: the starting model's top-``top`` non-relevant documents."""
    doc_ids = list(dataset.corpus)
    docs = encoder.encode_documents(
        [dataset.corpus[i].full_text for i in doc_ids], progress=progress and "mining: corpus"
    )
    # Several query ids may share a text: a pair's query text is relevant to the union.
    relevant: dict[str, set[str]] = {}
    for qid, judged in dataset.qrels.items():
        ids = relevant.setdefault(dataset.queries[qid], set())
        ids.update(d for d, rel in judged.items() if rel > 0)
    texts = list(relevant)
    qv = encoder.encode_queries(texts, progress=progress and "mining: queries")
    idx, _ = exact_search(qv, docs, top)
    rng = random.Random(0)
    negatives: dict[str, list[str]] = {}
    for row, text in enumerate(texts):
        # a document with a relevant document's text is no negative either
        relevant_texts = {dataset.corpus[d].full_text for d in relevant[text]}
        pool = [
            dataset.corpus[doc_ids[j]].full_text
            for j in idx[row]
            if doc_ids[j] not in relevant[text]
            and dataset.corpus[doc_ids[j]].full_text not in relevant_texts
        ]
        rng.shuffle(pool)
        negatives[text] = pool[:count]
    return [
        TrainingPair(p.query, p.positive, negatives.get(p.query, [])[:count], p.positive_id)
        for p in pairs
    ]
