"""Hub prior: multiplier ``exp(−β·z(d))``.

``z`` is the document's hub score (mean cosine to its ``k`` nearest other documents),
standardized over the indexed corpus. Hubs — documents near many others, retrieved for many
queries they do not answer — are scaled down; β = 0 is cosine.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError
from magretrieve.priors.base import (
    DocumentPrior,
    Neighbours,
    PriorTerms,
    as_int,
    optional,
    require,
)

#: Neighbours of the hub score unless a prior names another ``k``.
DEFAULT_K = 10


def hub_scores(
    unit_docs: np.ndarray, k: int = DEFAULT_K, chunk: int = 1024, method: str = "auto"
) -> np.ndarray:
    """Mean cosine of each document to its ``k`` nearest other documents.

    Exact below ``magretrieve.priors.neighbors.EXACT_MAX`` documents, approximate k-NN (FAISS
    IVF) above it; ``method`` forces one path (see
    :func:`magretrieve.priors.neighbors.mean_knn_similarity`).
    """
    from magretrieve.priors.neighbors import mean_knn_similarity

    return mean_knn_similarity(unit_docs, k, method=method, chunk=chunk)


_REUSED: contextvars.ContextVar[tuple[np.ndarray, dict[int, np.ndarray]] | None] = (
    contextvars.ContextVar("reused_hub_scores", default=None)
)


@contextlib.contextmanager
def hub_scores_reused(units: np.ndarray) -> Iterator[None]:
    """Inside this block the hub scores of ``units`` (this very array) are computed once per
    ``k`` and reused: choosing a prior refits every candidate on the same corpus, and at a
    million documents each hub score takes minutes. The array must not change inside."""
    token = _REUSED.set((units, {}))
    try:
        yield
    finally:
        _REUSED.reset(token)


def corpus_hub_scores(units: np.ndarray, k: int) -> np.ndarray:
    """The hub score of every document of an indexed corpus (one code path for all priors)."""
    reused = _REUSED.get()
    if reused is None or reused[0] is not units:
        return hub_scores(units, k)
    if k not in reused[1]:
        reused[1][k] = hub_scores(units, k)
    return reused[1][k].copy()


class HubPrior(DocumentPrior):
    method = "hub"
    has_multiplier = True

    def __init__(
        self, beta: float, k: int = DEFAULT_K, mean: float = 0.0, std: float = 1.0
    ) -> None:
        if k < 1:
            raise ConfigError(f"hub prior: k must be at least 1, got {k}")
        self.beta, self.k, self.mean, self.std = float(beta), int(k), float(mean), float(std)
        self._z: np.ndarray | None = None

    @classmethod
    def grid(cls, **options: Any) -> list[DocumentPrior]:
        return [cls(b, DEFAULT_K) for b in (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)]

    def params(self) -> dict[str, Any]:
        return {"beta": self.beta, "k": self.k, "mean": self.mean, "std": self.std}

    @classmethod
    def from_params(cls, data: Mapping[str, Any], source: str) -> HubPrior:
        k = optional(data, "k", as_int, DEFAULT_K, source)
        if k < 1:
            raise ConfigError(f"{source}: prior key 'k' must be at least 1, got {k}")
        std = optional(data, "std", float, 1.0, source)
        if not std > 0:
            raise ConfigError(f"{source}: prior key 'std' must be positive, got {std}")
        return cls(
            require(data, "beta", float, source), k, optional(data, "mean", float, 0.0, source), std
        )

    def fit_corpus(self, units: np.ndarray) -> None:
        h = corpus_hub_scores(units, self.k)
        self.mean, self.std = float(h.mean()), float(h.std()) or 1.0
        self._z = (h - self.mean) / self.std

    def _multiplier(self, hubs: np.ndarray) -> np.ndarray:
        return np.exp(-self.beta * (np.asarray(hubs, np.float64) - self.mean) / self.std)

    def terms(self, units: np.ndarray) -> PriorTerms:
        if self._z is None or len(self._z) != len(units):
            self.fit_corpus(units)
        assert self._z is not None
        n = len(units)
        return PriorTerms(np.asarray(units, np.float32), np.exp(-self.beta * self._z), np.zeros(n))

    def terms_for_new(self, units: np.ndarray, neighbours: Neighbours) -> PriorTerms:
        cos = neighbours(units, self.k)
        hubs = cos.mean(axis=1) if cos.shape[1] else np.full(len(units), self.mean)
        return PriorTerms(
            np.asarray(units, np.float32), self._multiplier(hubs), np.zeros(len(units))
        )
