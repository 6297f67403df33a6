"""Two or more priors at once: one direction, multipliers multiply, offsets add.

At most one part may change the direction (``center``); its own offset belongs to that
direction, so the multipliers scale it too: the score is
``Πm·(q̂·v + b_direction) + Σ b_other``. Examples: ``hub+inverted-softmax`` (a corpus
multiplier plus a query-bank offset), ``hub+field:citations`` (the hub multiplier and a
prior read from each document's ``citations``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError
from magretrieve.priors.base import DocumentPrior, Neighbours, PriorTerms


class CombinedPrior(DocumentPrior):
    method = "combined"

    def __init__(self, parts: Sequence[DocumentPrior]) -> None:
        parts = list(parts)
        if len(parts) < 2:
            raise ConfigError("a combined prior needs at least two parts")
        if sum(p.method == "center" for p in parts) > 1:
            raise ConfigError("a combined prior can hold at most one center part")
        if any(isinstance(p, CombinedPrior) for p in parts):
            raise ConfigError("combined priors do not nest")
        self.parts = parts

    @property
    def has_offset(self) -> bool:  # type: ignore[override]
        return any(p.has_offset for p in self.parts)

    @property
    def has_multiplier(self) -> bool:  # type: ignore[override]
        return any(p.has_multiplier for p in self.parts)

    @property
    def uses_query_bank(self) -> bool:  # type: ignore[override]
        return any(p.uses_query_bank for p in self.parts)

    @property
    def uses_fields(self) -> bool:  # type: ignore[override]
        return any(p.uses_fields for p in self.parts)

    def with_bank(self, bank: np.ndarray | None) -> CombinedPrior:
        return CombinedPrior([p.with_bank(bank) for p in self.parts])

    def with_fields(self, fields: Any) -> CombinedPrior:
        return CombinedPrior([p.with_fields(fields) for p in self.parts])

    def params(self) -> dict[str, Any]:
        return {"parts": [p.to_dict() for p in self.parts]}

    @classmethod
    def from_params(cls, data: Mapping[str, Any], source: str) -> CombinedPrior:
        from magretrieve.priors import prior_from_dict

        parts = data.get("parts")
        if not isinstance(parts, list):
            raise ConfigError(f"{source}: a combined prior needs a list 'parts'")
        read = [prior_from_dict(p, f"{source} part {i + 1}") for i, p in enumerate(parts)]
        try:
            return cls(read)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None

    def check_dimension(self, dimension: int, source: str) -> None:
        for i, part in enumerate(self.parts):
            part.check_dimension(dimension, f"{source} part {i + 1}")

    def label(self) -> str:
        return "+".join(p.label() for p in self.parts)

    def describe(self) -> dict[str, Any]:
        """The combination's terms, and each part's own (which part scales, which adds)."""
        return {**super().describe(), "parts": [p.describe() for p in self.parts]}

    def fit_corpus(self, units: np.ndarray) -> None:
        for p in self.parts:
            p.fit_corpus(units)

    def _combine(self, each: list[PriorTerms], units: np.ndarray) -> PriorTerms:
        direction = np.asarray(units, np.float32)
        base_offset = np.zeros(len(units))
        multiplier = np.ones(len(units))
        other = np.zeros(len(units))
        for part, t in zip(self.parts, each, strict=True):
            multiplier = multiplier * t.multiplier
            if part.method == "center":
                direction, base_offset = t.direction, t.offset
            else:
                other = other + t.offset
        return PriorTerms(direction, multiplier, multiplier * base_offset + other)

    def terms(self, units: np.ndarray) -> PriorTerms:
        return self._combine([p.terms(units) for p in self.parts], units)

    def terms_for_new(self, units: np.ndarray, neighbours: Neighbours) -> PriorTerms:
        return self._combine([p.terms_for_new(units, neighbours) for p in self.parts], units)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "document_prior",
            "method": "+".join(p.method for p in self.parts),
            **self.params(),
        }
