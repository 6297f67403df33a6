"""Hub prior (the original corpus prior): multiplier ``exp(−β·z(d))``.

``z`` is the document's hub score (mean cosine to its ``k`` nearest other documents),
standardized over the indexed corpus. Hubs — documents near many others, retrieved for many
queries they do not answer — are scaled down; β = 0 is cosine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError
from magretrieve.priors.base import DocumentPrior, Neighbours, PriorTerms, require


def corpus_hub_scores(units: np.ndarray, k: int) -> np.ndarray:
    """Mean cosine of each document to its ``k`` nearest other documents."""
    from magretrieve.priors.corpus_prior import hub_scores

    return hub_scores(units, k)


class HubPrior(DocumentPrior):
    method = "hub"

    def __init__(self, beta: float, k: int = 10, mean: float = 0.0, std: float = 1.0) -> None:
        if k < 1:
            raise ConfigError(f"hub prior: k must be at least 1, got {k}")
        self.beta, self.k, self.mean, self.std = float(beta), int(k), float(mean), float(std)
        self._z: np.ndarray | None = None

    @classmethod
    def grid(cls, **options: Any) -> list[DocumentPrior]:
        return [cls(b, 10) for b in (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3)]

    def params(self) -> dict[str, Any]:
        return {"beta": self.beta, "k": self.k, "mean": self.mean, "std": self.std}

    @classmethod
    def from_params(cls, data: Mapping[str, Any], source: str) -> HubPrior:
        prior = cls(
            require(data, "beta", float, source),
            int(data.get("k", 10)),
            float(data.get("mean", 0.0)),
            float(data.get("std", 1.0)),
        )
        if not (prior.std > 0 and np.isfinite(prior.std)):
            raise ConfigError(f"{source}: hub prior std must be positive, got {prior.std}")
        return prior

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
