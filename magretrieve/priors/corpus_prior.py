"""A training-free document magnitude derived from the corpus: down-weight "hub" documents.

Dense retrievers have hubs: documents close to many others, which show up in the top-k of
many queries without being relevant to them. The hub score of a document is the mean cosine
to its ``k`` nearest *other* documents; standardized over the corpus it becomes ``z``, and
the document's magnitude is ``exp(−β·z)``. The stored vector is ``d̂·exp(−β·z)``, the query
stays unit-norm, so the score is ``cos(q, d)·exp(−β·z)`` — still one inner product.

β is the only parameter; it is chosen on *training* queries (:func:`choose_beta`), never on
a test set. ``z`` is recomputed on whatever corpus is indexed, so the prior adapts to a new
corpus by construction. β = 0 is cosine exactly.

Torch-free (numpy only): it runs on stored vectors (``magretrieve rescale --corpus-prior``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError, DataError

KIND = "corpus_prior"
DEFAULT_K = 10
#: β values tried by :func:`choose_beta` (0 = cosine is always among them).
DEFAULT_BETAS = (0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)


def unit(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit norm (float32)."""
    v = np.asarray(vectors, dtype=np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def hub_scores(
    unit_docs: np.ndarray, k: int = DEFAULT_K, chunk: int = 1024, method: str = "auto"
) -> np.ndarray:
    """Mean cosine of each document to its ``k`` nearest other documents.

    Exact (O(n²·dim) time, O(chunk·n) memory) below ``magretrieve.priors.neighbors.EXACT_MAX``
    documents, approximate k-NN (FAISS IVF) above it; ``method`` forces one path
    (see :func:`magretrieve.priors.neighbors.mean_knn_similarity`).
    """
    from magretrieve.priors.neighbors import mean_knn_similarity

    return mean_knn_similarity(unit_docs, k, method=method, chunk=chunk)


@dataclass
class CorpusPrior:
    """β, k and the corpus statistics needed to score documents added later."""

    beta: float
    k: int = DEFAULT_K
    #: Mean and standard deviation of the hub score over the corpus it was fitted on.
    mean: float = 0.0
    std: float = 1.0
    #: Where β was chosen and what each candidate scored there (provenance).
    chosen_on: str = ""
    grid: dict[str, float] = field(default_factory=dict)
    kind: str = KIND

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "corpus prior") -> CorpusPrior:
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{source}: a corpus prior is a JSON object (as `magretrieve fit-prior` writes), "
                f"got a JSON {type(data).__name__}"
            )
        if data.get("kind", KIND) != KIND:
            raise ConfigError(f"{source}: not a corpus prior (kind {data.get('kind')!r})")
        try:
            prior = cls(
                beta=float(data["beta"]),
                k=int(data.get("k", DEFAULT_K)),
                mean=float(data.get("mean", 0.0)),
                std=float(data.get("std", 1.0)),
                chosen_on=str(data.get("chosen_on", "")),
                grid={str(a): float(b) for a, b in dict(data.get("grid") or {}).items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{source}: malformed corpus prior ({exc})") from None
        prior.validate(source)
        return prior

    def validate(self, source: str = "corpus prior") -> None:
        if not np.isfinite(self.beta):
            raise ConfigError(f"{source}: beta must be finite, got {self.beta}")
        if self.k < 1:
            raise ConfigError(f"{source}: k must be at least 1, got {self.k}")
        if not (self.std > 0 and np.isfinite(self.std)):
            raise ConfigError(f"{source}: std must be positive, got {self.std}")

    def fit_statistics(self, unit_docs: np.ndarray) -> np.ndarray:
        """Set mean/std from this corpus's hub scores; returns its z-scores."""
        h = hub_scores(unit_docs, self.k)
        self.mean = float(h.mean())
        self.std = float(h.std()) or 1.0
        return (h - self.mean) / self.std

    def z_scores(self, hubs: np.ndarray) -> np.ndarray:
        return (np.asarray(hubs, dtype=np.float64) - self.mean) / self.std

    def magnitudes(self, z: np.ndarray) -> np.ndarray:
        """``exp(−β·z)`` per document."""
        return np.exp(-self.beta * np.asarray(z, dtype=np.float64))


def apply_magnitudes(unit_docs: np.ndarray, magnitudes: np.ndarray) -> np.ndarray:
    """Stored vectors ``d̂ · m`` (float32)."""
    return (np.asarray(unit_docs, dtype=np.float32) * magnitudes[:, None]).astype(np.float32)


def rescale_corpus(
    unit_docs: np.ndarray, beta: float, k: int = DEFAULT_K
) -> tuple[np.ndarray, CorpusPrior]:
    """Fit the hub statistics on this corpus and return its rescaled vectors and the prior."""
    prior = CorpusPrior(beta=beta, k=k)
    z = prior.fit_statistics(unit(unit_docs))
    return apply_magnitudes(unit(unit_docs), prior.magnitudes(z)), prior


def _ndcg(
    query_units: np.ndarray,
    stored: np.ndarray,
    qids: Sequence[str],
    doc_ids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
    depth: int = 100,
) -> float:
    from magretrieve.core import metrics
    from magretrieve.evaluation.retrieval import exact_search

    idx, scores = exact_search(np.asarray(query_units, dtype=np.float32), stored, depth)
    run = {
        q: {doc_ids[j]: float(s) for j, s in zip(idx[r], scores[r], strict=True)}
        for r, q in enumerate(qids)
    }
    return metrics.retrieval_metrics({q: dict(qrels[q]) for q in qids}, run)["ndcg@10"]


def choose_beta(
    query_units: np.ndarray,
    unit_docs: np.ndarray,
    qids: Sequence[str],
    doc_ids: Sequence[str],
    qrels: Mapping[str, Mapping[str, int]],
    *,
    betas: Sequence[float] = DEFAULT_BETAS,
    k: int = DEFAULT_K,
    chosen_on: str = "training queries",
) -> CorpusPrior:
    """Pick β by NDCG@10 of *training* queries over the training corpus (ties: smaller |β|).

    Pass training queries only: choosing β on a test set would report an optimistic number.
    """
    if not len(qids):
        raise DataError("choose_beta needs at least one training query")
    prior = CorpusPrior(beta=0.0, k=k, chosen_on=chosen_on)
    docs = unit(unit_docs)
    z = prior.fit_statistics(docs)
    grid: dict[str, float] = {}
    best = (-1.0, 0.0)
    for beta in sorted(set(float(b) for b in betas) | {0.0}, key=abs):
        prior.beta = beta
        score = _ndcg(
            query_units, apply_magnitudes(docs, prior.magnitudes(z)), qids, doc_ids, qrels
        )
        grid[f"{beta:g}"] = score
        if score > best[0] + 1e-12:
            best = (score, beta)
    prior.beta = best[1]
    prior.grid = grid
    return prior


def _encode_split(encoder: Any, dataset: Any, progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """Unit query vectors (judged queries, in qrels order) and unit document vectors."""
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
    return unit(queries), unit(docs)


def check_cosine_model(encoder: Any, source: str) -> None:
    """The prior multiplies *unit* document vectors: refuse models that keep a magnitude."""
    sim = getattr(encoder, "similarity", None)
    if sim is not None and (sim.gamma_q, sim.gamma_d) != (1.0, 1.0):
        raise ConfigError(
            f"{source}: the corpus prior goes on top of a cosine model (γq = γd = 1); this model "
            f"scores with mode {sim.mode!r} (γq {sim.gamma_q:g}, γd {sim.gamma_d:g}), whose "
            "document magnitude would be overwritten"
        )


def fit_prior(
    encoder: Any,
    dataset: Any,
    *,
    betas: Sequence[float] = DEFAULT_BETAS,
    k: int = DEFAULT_K,
    progress: bool = True,
) -> CorpusPrior:
    """Encode a *training* split (BEIR) with a cosine model and choose β on its judged queries.

    The JSON of the returned prior (:meth:`CorpusPrior.to_dict`) is what ``magretrieve
    rescale --prior-file`` applies to a store built with the same model.
    """
    check_cosine_model(encoder, "corpus prior")
    if not dataset.qrels:
        raise DataError(f"{dataset.name}:{dataset.split}: no judged queries to choose β on")
    q, d = _encode_split(encoder, dataset, progress)
    qids = [x for x in dataset.queries if x in dataset.qrels]
    return choose_beta(
        q,
        d,
        qids,
        list(dataset.corpus),
        dataset.qrels,
        betas=betas,
        k=k,
        chosen_on=f"{dataset.name}:{dataset.split}",
    )


def score_with_prior(
    encoder: Any, dataset: Any, prior: CorpusPrior, *, progress: bool = True
) -> tuple[float, float]:
    """NDCG@10 on ``dataset`` of cosine and of cosine × prior (hub statistics refitted on it)."""
    check_cosine_model(encoder, "corpus prior")
    q, d = _encode_split(encoder, dataset, progress)
    qids = [x for x in dataset.queries if x in dataset.qrels]
    doc_ids = list(dataset.corpus)
    fitted = CorpusPrior(beta=prior.beta, k=prior.k)
    stored = apply_magnitudes(d, fitted.magnitudes(fitted.fit_statistics(d)))
    return (
        _ndcg(q, d, qids, doc_ids, dataset.qrels),
        _ndcg(q, stored, qids, doc_ids, dataset.qrels),
    )


class WithCorpusPrior:
    """A cosine encoder whose document vectors carry the corpus prior ``d̂·exp(−β·z)``.

    For evaluation (``evaluate_retrieval``) and anything else that encodes a whole corpus in
    one call: the hub statistics are refitted on each ``encode_documents`` call, i.e. on the
    corpus being encoded, exactly as ``magretrieve rescale`` does on a store. Scores are
    ``q̂·d̂·m(d)`` — qnorm's contract (γq = 1, γd = 0), which is what :attr:`similarity` says.
    """

    def __init__(self, encoder: Any, prior: CorpusPrior) -> None:
        from magretrieve.core.similarity import resolve

        check_cosine_model(encoder, "corpus prior")
        prior.validate()
        self.encoder = encoder
        self.prior = prior
        self.similarity = resolve("qnorm")

    def encode_queries(
        self, texts: Sequence[str], batch_size: int = 64, progress: bool | str = False
    ) -> np.ndarray:
        return unit(self.encoder.encode_queries(texts, batch_size=batch_size, progress=progress))

    def encode_documents(
        self, texts: Sequence[str], batch_size: int = 64, progress: bool | str = False
    ) -> np.ndarray:
        docs = unit(self.encoder.encode_documents(texts, batch_size=batch_size, progress=progress))
        fitted = CorpusPrior(beta=self.prior.beta, k=self.prior.k)
        return apply_magnitudes(docs, fitted.magnitudes(fitted.fit_statistics(docs)))
