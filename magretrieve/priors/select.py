"""Choose a prior and its parameters on *training* queries only ("no prior" always competes).

Each candidate is scored by NDCG@10 of the training queries over the training corpus, served
exactly as a store would serve it (stored ``[m·v ; b]``, query ``[q̂ ; 1]``). Priors that carry
a bank of training queries are **cross-fitted**: the queries are split into folds and each
fold is scored with a bank built from the other folds, so no query is normalized against
itself. The chosen prior then carries the bank of all training queries.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError, DataError
from magretrieve.core.topk import top_k
from magretrieve.priors.base import DocumentPrior, query_vectors, stored_vectors, unit
from magretrieve.priors.combined import CombinedPrior
from magretrieve.priors.none import NoPrior

#: Folds of the cross-fitting of query-bank priors.
FOLDS = 5


def grid(method: str, fields: Any = None) -> list[DocumentPrior]:
    """Candidates of one method (a :data:`REGISTRY` name, a :data:`VARIANTS` name,
    ``field:NAME[:TRANSFORM[:MISSING]]``, or ``fields``: every numeric field of ``fields``, the
    corpus's :class:`~magretrieve.priors.document_fields.DocumentFields`, which also narrows
    a field's grid)."""
    from magretrieve.priors import REGISTRY, VARIANTS
    from magretrieve.priors.field import FieldPrior, parse_spec

    if method == "fields":  # every numeric field of the corpus (none known without one)
        names = fields.numeric_fields() if fields is not None else []
        return [p for name in names for p in FieldPrior.grid(field=name, fields=fields)]
    if method.startswith("field"):
        name, transform, missing = parse_spec(method)
        return FieldPrior.grid(field=name, transform=transform, missing=missing, fields=fields)
    if method in VARIANTS:
        name, options = VARIANTS[method]
        return REGISTRY[name].grid(**options)
    if method in REGISTRY:
        return REGISTRY[method].grid()
    known = ", ".join(
        ["auto", *(m for m in REGISTRY if m != "field"), *VARIANTS, "field:NAME", "fields"]
    )
    raise ConfigError(
        f"unknown prior method {method!r}; choose one of {known}, or a combination a+b"
    )


#: What ``--method auto`` tries, besides the combinations of the best of each: every
#: registered method, and a field prior of every numeric field of ``fields`` (when given)
#: and of the document's length.
def auto_methods(fields: Any = None) -> list[str]:
    from magretrieve.priors import REGISTRY

    methods = [m for m in REGISTRY if m not in ("none", "field")]
    if fields is not None:
        methods += [f"field:{name}" for name in fields.numeric_fields()]
    return methods


#: Queries scored per matrix product when ranking a corpus (bounds memory at millions of
#: documents: one block of scores, never the whole queries × documents matrix).
QUERY_BLOCK = 128


def _top10_run(
    scores: np.ndarray, qids: Sequence[str], doc_ids: Sequence[str]
) -> dict[str, dict[str, float]]:
    top, _ = top_k(scores, 10)
    return {q: {doc_ids[j]: float(scores[r, j]) for j in top[r]} for r, q in enumerate(qids)}


def _ndcg_of_run(
    run: Mapping[str, Mapping[str, float]],
    qids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
) -> float:
    from magretrieve.core import metrics

    return metrics.retrieval_metrics({q: dict(qrels[q]) for q in qids}, dict(run))["ndcg@10"]


def _blockwise_run(
    block_scores: Callable[[slice], np.ndarray], qids: Sequence[str], doc_ids: Sequence[str]
) -> dict[str, dict[str, float]]:
    """The top-10 run of the queries ranked ``QUERY_BLOCK`` at a time: ``block_scores(rows)``
    is the (block × documents) score matrix of the queries in ``rows``, so the whole queries ×
    documents matrix never has to exist at once."""
    run: dict[str, dict[str, float]] = {}
    for start in range(0, len(qids), QUERY_BLOCK):
        rows = slice(start, start + QUERY_BLOCK)
        run.update(_top10_run(block_scores(rows), qids[rows], doc_ids))
    return run


def ndcg_at_10(
    scores: np.ndarray,
    qids: Sequence[str],
    doc_ids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
) -> float:
    """NDCG@10 (trec_eval) of a score matrix (queries × documents)."""
    return _ndcg_of_run(_blockwise_run(lambda rows: scores[rows], qids, doc_ids), qids, qrels)


def _served_vectors(
    prior: DocumentPrior, queries: np.ndarray, docs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(query vectors, stored vectors) as an inner-product index holds them after ``prior``
    (its corpus statistics fitted on ``docs``)."""
    prior.fit_corpus(docs)
    stored = stored_vectors(prior.terms(docs), prior.has_offset)
    return query_vectors(queries, prior.has_offset), stored


def served_scores(prior: DocumentPrior, queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """Scores as an inner-product index serves them after ``prior`` (corpus stats on ``docs``)."""
    qv, stored = _served_vectors(prior, queries, docs)
    return qv @ stored.T


def training_score(
    prior: DocumentPrior,
    queries: np.ndarray,
    docs: np.ndarray,
    qids: Sequence[str],
    doc_ids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
    folds: int = FOLDS,
) -> float:
    """NDCG@10 of the training queries as an inner-product index serves them after ``prior``
    (:func:`served_scores`), cross-fitted when the prior has a query bank: each fold of the
    queries is scored with a bank of the other folds, so no query is normalized against
    itself. Queries are ranked a block at a time, never as a queries × documents matrix."""

    def served_run(fitted: DocumentPrior, rows: np.ndarray) -> dict[str, dict[str, float]]:
        qv, stored = _served_vectors(fitted, queries[rows], docs)
        block_qids = [qids[i] for i in rows]
        return _blockwise_run(lambda block: qv[block] @ stored.T, block_qids, doc_ids)

    n = len(queries)
    if not prior.uses_query_bank:
        return _ndcg_of_run(served_run(prior, np.arange(n)), qids, qrels)
    if n < 2:
        raise DataError("a query-bank prior needs at least 2 training queries to cross-fit")
    fold_of = np.random.default_rng(0).permutation(n) % min(folds, n)
    run: dict[str, dict[str, float]] = {}
    for f in range(min(folds, n)):
        held = fold_of == f
        run.update(served_run(prior.with_bank(queries[~held]), np.flatnonzero(held)))
    return _ndcg_of_run(run, qids, qrels)


@dataclass
class Selection:
    """The chosen prior (its bank: all training queries) and what every candidate scored."""

    prior: DocumentPrior
    training_ndcg: float
    chosen_on: str
    grid: dict[str, float] = field(default_factory=dict)
    truncated_queries: int = 0
    #: The same choice cross-fitted over query folds (:func:`cross_fit`), when it was made.
    held_out: CrossFit | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {
            **self.prior.to_dict(),
            "label": self.prior.label(),
            "training_ndcg": self.training_ndcg,
            "chosen_on": self.chosen_on,
            "grid": self.grid,
            "truncated_queries": self.truncated_queries,
        }
        if self.held_out is not None:
            out["held_out"] = self.held_out.to_dict()
        return out


def choose_prior(
    query_units: np.ndarray,
    doc_units: np.ndarray,
    qids: Sequence[str],
    doc_ids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    method: str = "auto",
    chosen_on: str = "training queries",
    progress: bool = False,
    grids: Mapping[str, Sequence[DocumentPrior]] | None = None,
    include_none: bool = True,
    memo: dict[str, float] | None = None,
    fields: Any = None,
) -> Selection:
    """Pick the prior with the best training NDCG@10 (ties: the earlier, simpler candidate).

    ``method`` is ``auto`` (every method, then combinations of the best of each), one method
    name, or a combination ``a+b`` (the best of each part, combined). ``grids`` replaces the
    candidates of a method (e.g. ``{"hub": [HubPrior(0.1)]}``). ``include_none=False`` is for
    measurement only (what the method's best candidate does when forced on); ``fit-prior``
    always keeps plain cosine as a candidate. ``memo`` (label -> training NDCG@10) lets repeated
    calls on the same training data skip candidates already scored. ``fields`` (a
    :class:`~magretrieve.priors.document_fields.DocumentFields` aligned with ``doc_ids``) are
    the payloads field priors read; ``auto`` then tries every numeric field too.
    """
    if not len(qids):
        raise DataError("choosing a prior needs at least one judged training query")
    q, d = unit(query_units), unit(doc_units)
    from magretrieve.priors.hub import hub_scores_reused
    from magretrieve.priors.neighbors import progress_shown

    # every candidate is refitted on the same corpus: its hub scores are computed once per k
    with hub_scores_reused(d), progress_shown(progress):
        return _choose(q, d, qids, doc_ids, qrels, method, chosen_on, progress, grids,
                       include_none, memo, fields)  # fmt: skip


def _choose(
    q: np.ndarray,
    d: np.ndarray,
    qids: Sequence[str],
    doc_ids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
    method: str,
    chosen_on: str,
    progress: bool,
    grids: Mapping[str, Sequence[DocumentPrior]] | None,
    include_none: bool,
    memo: dict[str, float] | None,
    fields: Any = None,
) -> Selection:
    from tqdm.auto import tqdm

    scored: dict[str, float] = {}
    ranked: list[tuple[float, DocumentPrior]] = []

    def score(p: DocumentPrior) -> float:
        label = p.label()
        value = memo[label] if memo is not None and label in memo else None
        if value is None:
            value = training_score(p, q, d, qids, doc_ids, qrels)
            if memo is not None:
                memo[label] = value
        scored[p.label()] = value
        ranked.append((value, p))
        return value

    score(NoPrior())
    methods = auto_methods(fields) if method == "auto" else method.split("+")
    singles = {m: list((grids or {}).get(m) or grid(m, fields)) for m in methods}
    if fields is not None:  # field priors read the training corpus's payloads
        singles = {m: [p.with_fields(fields) for p in c] for m, c in singles.items()}
    empty = [m for m, c in singles.items() if not c]
    if empty:
        raise ConfigError(f"prior method {empty[0]!r}: the corpus has no numeric field to try")
    best_of: dict[str, tuple[float, DocumentPrior]] = {}
    total = sum(len(c) for c in singles.values())
    bar = tqdm(total=total, desc="choosing a prior", unit="candidate", disable=not progress)
    for m, candidates in singles.items():
        for p in candidates:
            value = score(p)
            bar.update(1)
            if m not in best_of or value > best_of[m][0] + 1e-12:
                best_of[m] = (value, p)
    bar.close()
    if method == "auto":
        # the best multiplier/direction prior with the best of each offset prior, and the two
        # direction-or-multiplier priors together
        geometric = {m: v for m, v in best_of.items() if not m.startswith("field:")}
        mult = [geometric[m][1] for m in geometric if not geometric[m][1].has_offset]
        mult += [geometric[m][1] for m in geometric if geometric[m][1].method == "center"]
        offs = [geometric[m][1] for m in geometric if geometric[m][1].has_offset]
        offs = [p for p in offs if p.method != "center"]
        for a in mult:
            for b in offs:
                score(CombinedPrior([a, b]))
        if len(mult) > 1:
            score(CombinedPrior(sorted(mult, key=lambda p: p.method != "center")))
        # the best field prior with the best of each geometric prior, and the two best fields
        by_field = sorted(
            (v for m, v in best_of.items() if m.startswith("field:")), key=lambda v: -v[0]
        )
        if by_field:
            for _, p in geometric.values():
                score(CombinedPrior([p, by_field[0][1]]))
            if len(by_field) > 1:
                score(CombinedPrior([by_field[0][1], by_field[1][1]]))
    elif len(methods) > 1:
        score(CombinedPrior([best_of[m][1] for m in methods]))
        if not include_none:  # forced: the combination itself
            ranked = ranked[-1:]
    if not include_none:
        ranked = ranked[1:] if ranked[0][1].method == "none" else ranked
    best = ranked[0]
    for value, p in ranked[1:]:
        if value > best[0] + 1e-12:
            best = (value, p)
    chosen = best[1].with_bank(q) if best[1].uses_query_bank else best[1]
    return Selection(chosen, best[0], chosen_on, scored)


@dataclass
class CrossFit:
    """A choice of prior scored on queries it was not chosen on: the queries are split into
    folds, the prior is chosen on the other folds (as :func:`choose_prior` does, cosine a
    candidate) and each fold is ranked with it. ``per_query`` holds NDCG@10 per query id."""

    folds: int
    cosine: float
    prior: float
    chosen: list[str]
    per_query_cosine: dict[str, float] = field(default_factory=dict)
    per_query_prior: dict[str, float] = field(default_factory=dict)
    #: The prior each fold was ranked with (fold order).
    priors: list[DocumentPrior] = field(default_factory=list)
    #: Each fold's query ids (fold order).
    fold_qids: list[list[str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "folds": self.folds,
            "cosine": self.cosine,
            "prior": self.prior,
            "chosen": self.chosen,
        }


def per_query_ndcg(
    run: Mapping[str, Mapping[str, float]],
    qids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
) -> dict[str, float]:
    """NDCG@10 (trec_eval) of each query of a run."""
    return {q: _ndcg_of_run({q: run.get(q, {})}, [q], qrels) for q in qids}


def cross_fit(
    query_units: np.ndarray,
    doc_units: np.ndarray,
    qids: Sequence[str],
    doc_ids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    method: str = "auto",
    folds: int = FOLDS,
    seed: int = 0,
    grids: Mapping[str, Sequence[DocumentPrior]] | None = None,
    fields: Any = None,
    memo: dict[int, dict[str, float]] | None = None,
) -> CrossFit:
    """Held-out NDCG@10 of choosing a prior, for a collection with one judged split.

    Queries are dealt into ``folds`` folds (a permutation seeded by ``seed``); each fold is
    ranked, as a store serves it, by the prior chosen on the other folds' queries, so no query
    takes part in choosing the prior it is scored with. Plain cosine is scored on the same
    queries. ``memo`` (fold -> label -> training NDCG@10) lets calls with the same queries,
    folds and seed but another ``method`` skip the candidates already scored.
    """
    n = len(qids)
    if n < 2:
        raise DataError("cross-fitting a prior over query folds needs at least 2 judged queries")
    k = min(int(folds), n)
    if k < 2:
        raise ConfigError(f"cross-fitting needs at least 2 folds, got {folds}")
    q, d = unit(query_units), unit(doc_units)
    from magretrieve.priors.hub import hub_scores_reused

    fold_of = np.random.default_rng(seed).permutation(n) % k
    run: dict[str, dict[str, float]] = {}
    chosen: list[str] = []
    priors: list[DocumentPrior] = []
    fold_qids: list[list[str]] = []
    with hub_scores_reused(d):
        for f in range(k):
            held = [int(i) for i in np.flatnonzero(fold_of == f)]
            rest = [int(i) for i in np.flatnonzero(fold_of != f)]
            fold_memo = None if memo is None else memo.setdefault(f, {})
            sel = _choose(q[rest], d, [qids[i] for i in rest], doc_ids, qrels, method,
                          "other query folds", False, grids, True, fold_memo, fields)  # fmt: skip
            chosen.append(sel.prior.label())
            priors.append(sel.prior)
            fold_qids.append([qids[i] for i in held])
            qv, stored = _served_vectors(sel.prior, q[held], d)

            def block(rows: slice, qv: np.ndarray = qv, stored: np.ndarray = stored) -> np.ndarray:
                return np.asarray(qv[rows] @ stored.T)

            run.update(_blockwise_run(block, [qids[i] for i in held], doc_ids))
    cosine_run = _blockwise_run(lambda rows: q[rows] @ d.T, list(qids), doc_ids)
    with_prior = per_query_ndcg(run, qids, qrels)
    cosine = per_query_ndcg(cosine_run, qids, qrels)
    return CrossFit(
        k,
        float(np.mean(list(cosine.values()))),
        float(np.mean(list(with_prior.values()))),
        chosen,
        cosine,
        with_prior,
        priors,
        fold_qids,
    )
