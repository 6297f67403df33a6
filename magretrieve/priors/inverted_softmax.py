"""Static inverted softmax (Smith et al., 2017) as a document offset.

The inverted softmax normalizes each document's scores over a bank of queries:
``exp(β·cos(q, d)) / Σ_{q'∈bank} exp(β·cos(q', d))``. Its logarithm divided by β ranks like
``cos(q, d) − α·(1/β)·log mean_{q'} exp(β·cos(q', d))`` with α = 1 (the mean instead of the sum
only shifts every score by the same constant). The bank is the training queries, as QB-Norm
(Bogolin et al., 2022) found sufficient; β (temperature) and α (strength) are chosen on
training queries with the bank cross-fitted.

QB-Norm's *dynamic* variant applies the normalization only when a query's top-1 cosine hit is
a document that is some bank query's top-1; that choice depends on the query, so one static
index cannot serve it (it would take a second search per query). benchmarks/priors.py
measures it; the served prior is the static form.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError
from magretrieve.priors.base import (
    DocumentPrior,
    Neighbours,
    PriorTerms,
    QueryBankPrior,
    decode_matrix,
    encode_matrix,
    log_mean_exp,
    require,
)


class InvertedSoftmaxPrior(QueryBankPrior):
    method = "inverted-softmax"
    has_offset = True
    uses_query_bank = True

    def __init__(self, beta: float = 20.0, alpha: float = 1.0, queries: Any = None) -> None:
        if not beta > 0:
            raise ConfigError(f"inverted-softmax: beta must be positive, got {beta}")
        self.beta, self.alpha = float(beta), float(alpha)
        self.queries = None if queries is None else np.asarray(queries, np.float32)

    @classmethod
    def grid(cls, **options: Any) -> list[DocumentPrior]:
        return [cls(b, a) for b in (5.0, 10.0, 20.0, 50.0) for a in (0.25, 0.5, 1.0)]

    def with_bank(self, bank: np.ndarray | None) -> InvertedSoftmaxPrior:
        return InvertedSoftmaxPrior(self.beta, self.alpha, bank)

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"beta": self.beta, "alpha": self.alpha}
        if self.queries is not None:
            out["queries"] = encode_matrix(self.queries)
        return out

    @classmethod
    def from_params(cls, data: Mapping[str, Any], source: str) -> InvertedSoftmaxPrior:
        if "queries" not in data:
            raise ConfigError(f"{source}: inverted-softmax lacks its query bank 'queries'")
        beta = require(data, "beta", float, source)
        if not beta > 0:
            raise ConfigError(f"{source}: prior key 'beta' must be positive, got {beta}")
        return cls(
            beta, require(data, "alpha", float, source), decode_matrix(data["queries"], source)
        )

    def offsets(self, units: np.ndarray) -> np.ndarray:
        if self.queries is None:
            raise ConfigError("inverted-softmax: no query bank (fit it on training queries)")
        return -self.alpha * log_mean_exp(units, self.queries, self.beta) / self.beta

    def terms(self, units: np.ndarray) -> PriorTerms:
        n = len(units)
        return PriorTerms(np.asarray(units, np.float32), np.ones(n), self.offsets(units))

    def terms_for_new(self, units: np.ndarray, neighbours: Neighbours) -> PriorTerms:
        return self.terms(units)
