"""Fit a prior with an encoder on a BEIR training split, and score it on held-out splits.

This is what ``magretrieve fit-prior`` runs: encode the training corpus and its judged
queries once, choose the prior on them (:func:`~magretrieve.priors.select.choose_prior`), and
for each ``--eval`` set report NDCG@10 of cosine and of the prior (corpus statistics refitted on
that set's corpus, as ``rescale`` refits them on a store). Queries cut at the model's query
length are counted and reported. Field priors read each document's JSON fields. When the
collection has only the one judged split, the choice is also cross-fitted over query folds
and its held-out NDCG@10 reported (:func:`~magretrieve.priors.select.cross_fit`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError, DataError
from magretrieve.priors.base import DocumentPrior, query_vectors, stored_vectors, unit
from magretrieve.priors.document_fields import DocumentFields
from magretrieve.priors.select import (
    Selection,
    choose_prior,
    cross_fit,
    grid,
    ndcg_at_10,
    served_scores,
)


def check_cosine_model(encoder: Any, source: str = "prior") -> None:
    """Priors go on top of unit vectors: refuse models that keep a magnitude."""
    sim = getattr(encoder, "similarity", None)
    if sim is None:
        manifest = getattr(encoder, "manifest", None)
        gammas = (getattr(manifest, "gamma_q", 1.0), getattr(manifest, "gamma_d", 1.0))
        mode = getattr(manifest, "mode", "?")
    else:
        gammas, mode = (sim.gamma_q, sim.gamma_d), sim.mode
    if tuple(gammas) != (1.0, 1.0):
        raise ConfigError(
            f"{source}: document priors go on top of a cosine model (γq = γd = 1); this model "
            f"scores with mode {mode!r} (γq {gammas[0]:g}, γd {gammas[1]:g}), whose document "
            "magnitude would be overwritten"
        )


def encode_split(
    encoder: Any, dataset: Any, progress: bool
) -> tuple[np.ndarray, np.ndarray, list[str], list[str], int]:
    """Unit query and document vectors, query ids, document ids, and truncated queries."""
    doc_ids = list(dataset.corpus)
    docs = encoder.encode_documents(
        [dataset.corpus[i].full_text for i in doc_ids],
        progress=f"{dataset.name}: corpus" if progress else False,
    )
    qids = [q for q in dataset.queries if q in dataset.qrels]
    queries = encoder.encode_queries(
        [dataset.queries[q] for q in qids],
        progress=f"{dataset.name}: queries" if progress else False,
    )
    truncated = int(getattr(encoder, "last_truncated", 0) or 0)
    return unit(queries), unit(docs), qids, doc_ids, truncated


def dataset_fields(dataset: Any) -> DocumentFields:
    """The payload of every corpus document (its JSON fields, title and text), in corpus order."""
    ids = list(dataset.corpus)
    payloads = [
        {**doc.payload, "title": doc.title, "text": doc.text}
        for doc in (dataset.corpus[i] for i in ids)
    ]
    return DocumentFields(ids, payloads)


def judged_splits(dataset: Any) -> list[str]:
    """The judged splits (``qrels/*.tsv``) beside the split ``dataset`` came from."""
    source = getattr(dataset, "source", "")
    if not source:
        return [dataset.split]
    from pathlib import Path

    return sorted(p.stem for p in Path(source).parent.glob("*.tsv"))


def check_fields(method: str, fields: DocumentFields) -> None:
    """Refuse a field prior's field (missing everywhere, not numeric, NaN, negative under
    log1p, constant) before anything is encoded: one line naming the field and documents."""
    if method == "auto":
        return
    for part in method.split("+"):
        if part == "fields":  # only fields that can be used are tried
            if not fields.numeric_fields():
                raise ConfigError(
                    "prior method 'fields': no document has a numeric field that varies"
                )
        elif part.startswith("field"):
            candidates = grid(part, fields)
            first = candidates[0].with_fields(fields)
            first.fit_fields()  # type: ignore[attr-defined]


def fit_prior(
    encoder: Any,
    dataset: Any,
    *,
    method: str = "auto",
    grids: Mapping[str, Sequence[DocumentPrior]] | None = None,
    progress: bool = True,
    cross_fit_folds: int | None = None,
) -> Selection:
    """Choose a prior on the judged queries of a *training* split (never pass a test split).

    ``cross_fit_folds``: also choose it on all but one fold of the queries, score the held-out
    fold, and report that (``Selection.held_out``); needed when the collection has no other
    judged split to check the prior on.
    """
    check_cosine_model(encoder, "fit-prior")
    fields = dataset_fields(dataset)
    check_fields(method, fields)
    if not dataset.qrels:
        raise DataError(f"{dataset.name}:{dataset.split}: no judged queries to choose a prior on")
    if not any(rel > 0 for docs in dataset.qrels.values() for rel in docs.values()):
        # every candidate would score NDCG 0: a "choice" among them means nothing
        where = f"{dataset.source}: " if getattr(dataset, "source", "") else ""
        raise DataError(
            f"{where}{dataset.name}:{dataset.split} has no relevant judgement (every grade is "
            "0 or below), so no prior can be chosen on it; give a split with relevant documents"
        )
    q, d, qids, doc_ids, truncated = encode_split(encoder, dataset, progress)
    selection = choose_prior(
        q,
        d,
        qids,
        doc_ids,
        dataset.qrels,
        method=method,
        chosen_on=f"{dataset.name}:{dataset.split}",
        progress=progress,
        grids=grids,
        fields=fields,
    )
    selection.truncated_queries = truncated
    if cross_fit_folds:
        selection.held_out = cross_fit(
            q, d, qids, doc_ids, dataset.qrels, method=method, folds=cross_fit_folds,
            grids=grids, fields=fields,
        )  # fmt: skip
    return selection


def score_with_prior(
    encoder: Any, dataset: Any, prior: DocumentPrior, *, progress: bool = True
) -> dict[str, Any]:
    """NDCG@10 on ``dataset`` of cosine and of the prior, and the queries cut short."""
    check_cosine_model(encoder, "fit-prior")
    q, d, qids, doc_ids, truncated = encode_split(encoder, dataset, progress)
    prior = prior.with_fields(dataset_fields(dataset))
    return {
        "data": f"{dataset.name}:{dataset.split}",
        "cosine": ndcg_at_10(q @ d.T, qids, doc_ids, dataset.qrels),
        "prior": ndcg_at_10(served_scores(prior, q, d), qids, doc_ids, dataset.qrels),
        "truncated_queries": truncated,
    }


class WithPrior:
    """A cosine encoder whose document vectors carry a document prior, for evaluation.

    For ``evaluate_retrieval`` and anything else that encodes a whole corpus in one call: the
    prior's corpus statistics are refitted on each ``encode_documents`` call, i.e. on the
    corpus being encoded, exactly as ``magretrieve rescale`` refits them on a store. Documents
    become ``m·v`` (or ``[m·v ; b]`` with queries ``[q̂ ; 1]`` when the prior has an offset), so
    the inner product is the served score; :attr:`similarity` says how to read them (qnorm:
    unit queries, stored documents as they are; dot when the query carries the extra 1).
    """

    def __init__(self, encoder: Any, prior: DocumentPrior) -> None:
        from magretrieve.core.similarity import resolve

        check_cosine_model(encoder, "prior")
        self.encoder = encoder
        self.prior = prior
        self.similarity = resolve("dot" if prior.has_offset else "qnorm")

    def encode_queries(
        self, texts: Sequence[str], batch_size: int = 64, progress: bool | str = False
    ) -> np.ndarray:
        q = unit(self.encoder.encode_queries(texts, batch_size=batch_size, progress=progress))
        return query_vectors(q, self.prior.has_offset)

    def encode_documents(
        self, texts: Sequence[str], batch_size: int = 64, progress: bool | str = False
    ) -> np.ndarray:
        from magretrieve.priors import prior_from_dict

        docs = unit(self.encoder.encode_documents(texts, batch_size=batch_size, progress=progress))
        fitted = prior_from_dict(self.prior.to_dict(), self.prior.source)
        fitted.fit_corpus(docs)
        return stored_vectors(fitted.terms(docs), fitted.has_offset)
