"""Mean-direction removal (Ren, Sun & Liang, 2026; a classical hubness reducer), served exactly.

Cosine after subtracting the corpus mean ``μ`` from queries and documents ranks, per query,
like ``(q̂ − λμ)·u(d)`` with ``u(d) = (d̂ − λμ)/‖d̂ − λμ‖`` (the query's own norm is the same for
every document). That is ``q̂·u(d) − λ·μ·u(d)``: direction ``u(d)``, offset ``−λ·μ·u(d)``, so
the *unchanged* unit query serves it through the offset coordinate. λ = 1 is full removal,
λ = 0 cosine; λ is chosen on training queries. ``μ`` is the mean of the indexed unit vectors
and is recorded, so documents added later use the same one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError
from magretrieve.priors.base import DocumentPrior, Neighbours, PriorTerms, require, unit


class CenterPrior(DocumentPrior):
    method = "center"
    has_offset = True

    def __init__(self, strength: float = 1.0, mean: Any = None) -> None:
        self.strength = float(strength)
        self.mean = None if mean is None else np.asarray(mean, np.float64).reshape(-1)

    @classmethod
    def grid(cls, **options: Any) -> list[DocumentPrior]:
        return [cls(s) for s in (0.25, 0.5, 0.75, 1.0)]

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"strength": self.strength}
        if self.mean is not None:
            out["mean"] = [float(x) for x in self.mean]
        return out

    @classmethod
    def from_params(cls, data: Mapping[str, Any], source: str) -> CenterPrior:
        mean = data.get("mean")
        if mean is not None:
            if not isinstance(mean, list) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) for x in mean
            ):
                raise ConfigError(f"{source}: prior key 'mean' is not a list of numbers")
            mean = np.asarray(mean, dtype=np.float64).reshape(-1)
            if not len(mean) or not np.isfinite(mean).all():
                raise ConfigError(f"{source}: prior key 'mean' must be a finite, non-empty vector")
        return cls(require(data, "strength", float, source), mean)

    def check_dimension(self, dimension: int, source: str) -> None:
        if self.mean is not None and self.mean.shape[0] != int(dimension):
            raise ConfigError(
                f"{source}: prior key 'mean' has dimension {self.mean.shape[0]}, the store "
                f"{dimension} (fitted with another model?)"
            )

    def fit_corpus(self, units: np.ndarray) -> None:
        self.mean = np.asarray(units, np.float64).mean(axis=0)

    def terms(self, units: np.ndarray) -> PriorTerms:
        if self.mean is None:
            self.fit_corpus(units)
        return self._terms(units)

    def _terms(self, units: np.ndarray) -> PriorTerms:
        assert self.mean is not None
        if self.mean.shape[0] != np.asarray(units).shape[1]:
            raise ConfigError(
                f"center prior: its mean has dimension {self.mean.shape[0]}, the vectors "
                f"{np.asarray(units).shape[1]}"
            )
        shift = self.strength * self.mean
        u = unit(np.asarray(units, np.float64) - shift)
        return PriorTerms(u, np.ones(len(u)), -(u.astype(np.float64) @ shift))

    def terms_for_new(self, units: np.ndarray, neighbours: Neighbours) -> PriorTerms:
        if self.mean is None:
            raise ConfigError("center prior: no recorded mean for documents added later")
        return self._terms(units)
