"""CSLS (Conneau et al., 2018) as a document offset: ``−α·r(d)``.

CSLS scores ``2·cos(q, d) − r(q) − r(d)``; per query only the document term matters, so the
ranking is that of ``cos(q, d) − α·r(d)`` with α = ½ for the published form (α is chosen on
training queries). ``r(d)`` is the mean cosine of ``d`` to its ``k`` nearest neighbours in a
*bank*: the training queries (``bank="queries"``, carried inside the prior) or the corpus
itself (``bank="corpus"``: the hub score, used additively instead of multiplicatively).
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
    as_int,
    decode_matrix,
    encode_matrix,
    optional,
    require,
    top_k_mean,
)

BANKS = ("queries", "corpus")


class CslsPrior(QueryBankPrior):
    method = "csls"
    has_offset = True

    def __init__(
        self, alpha: float = 0.5, k: int = 10, bank: str = "queries", queries: Any = None
    ) -> None:
        if bank not in BANKS:
            raise ConfigError(f"csls: bank must be one of {', '.join(BANKS)}, got {bank!r}")
        if k < 1:
            raise ConfigError(f"csls: k must be at least 1, got {k}")
        self.alpha, self.k, self.bank = float(alpha), int(k), bank
        self.queries = None if queries is None else np.asarray(queries, np.float32)
        self._r: np.ndarray | None = None

    @property
    def uses_query_bank(self) -> bool:  # type: ignore[override]
        return self.bank == "queries"

    @classmethod
    def grid(cls, bank: str = "", **options: Any) -> list[DocumentPrior]:
        banks = (bank,) if bank else BANKS
        return [cls(a, k, b) for b in banks for k in (10, 50) for a in (0.1, 0.25, 0.5, 1.0)]

    def with_bank(self, bank: np.ndarray | None) -> CslsPrior:
        return CslsPrior(self.alpha, self.k, self.bank, bank) if self.bank == "queries" else self

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {"alpha": self.alpha, "k": self.k, "bank": self.bank}
        if self.bank == "queries" and self.queries is not None:
            out["queries"] = encode_matrix(self.queries)
        return out

    @classmethod
    def from_params(cls, data: Mapping[str, Any], source: str) -> CslsPrior:
        bank = data.get("bank", "queries")
        if bank not in BANKS:
            raise ConfigError(
                f"{source}: csls bank must be one of {', '.join(BANKS)}, got {bank!r}"
            )
        queries = decode_matrix(data["queries"], source) if "queries" in data else None
        if bank == "queries" and queries is None:
            raise ConfigError(f"{source}: csls with a query bank lacks its 'queries'")
        k = optional(data, "k", as_int, 10, source)
        if k < 1:
            raise ConfigError(f"{source}: prior key 'k' must be at least 1, got {k}")
        return cls(require(data, "alpha", float, source), k, bank, queries)

    def _neighbour_mean(self, units: np.ndarray) -> np.ndarray:
        if self.bank == "corpus":  # the hub score: one corpus-kNN code path for both priors
            from magretrieve.priors.hub import corpus_hub_scores

            return corpus_hub_scores(units, self.k)
        if self.queries is None:
            raise ConfigError("csls: no query bank (fit the prior on training queries)")
        return top_k_mean(units, self.queries, self.k)

    def fit_corpus(self, units: np.ndarray) -> None:
        self._r = self._neighbour_mean(units)

    def terms(self, units: np.ndarray) -> PriorTerms:
        if self._r is None or len(self._r) != len(units):
            self.fit_corpus(units)
        assert self._r is not None
        n = len(units)
        return PriorTerms(np.asarray(units, np.float32), np.ones(n), -self.alpha * self._r)

    def terms_for_new(self, units: np.ndarray, neighbours: Neighbours) -> PriorTerms:
        if self.bank == "queries":
            r = self._neighbour_mean(units)
        else:
            cos = neighbours(units, self.k)
            r = cos.mean(axis=1) if cos.shape[1] else np.zeros(len(units))
        n = len(units)
        return PriorTerms(np.asarray(units, np.float32), np.ones(n), -self.alpha * r)
