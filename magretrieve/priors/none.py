"""No prior: plain cosine. Always a candidate when a prior is chosen on training queries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from magretrieve.priors.base import DocumentPrior, Neighbours, PriorTerms


class NoPrior(DocumentPrior):
    method = "none"

    @classmethod
    def grid(cls, **options: Any) -> list[DocumentPrior]:
        return [cls()]

    def params(self) -> dict[str, Any]:
        return {}

    @classmethod
    def from_params(cls, data: Mapping[str, Any], source: str) -> NoPrior:
        return cls()

    def terms(self, units: np.ndarray) -> PriorTerms:
        return PriorTerms.identity(units)

    def terms_for_new(self, units: np.ndarray, neighbours: Neighbours) -> PriorTerms:
        return PriorTerms.identity(units)

    def label(self) -> str:
        return "none (cosine)"
