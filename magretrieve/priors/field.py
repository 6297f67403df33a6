"""Field prior: a number each document already carries, ridden in the document's norm.

A team often has a per-document prior (how often a page is cited or clicked, its year, a
quality grade) in the payload. The prior reads that field ``x(d)`` (or ``_length``, the
document's own length in words), applies a **transform** ``t`` (``raw``, ``log1p`` or ``rank``:
the document's mid-rank among the corpus's values, in [0, 1]), fills a document without the
field by the **missing rule** (``median``, ``min`` of the corpus's transformed values, or the
transform of ``zero``), standardizes over the indexed corpus,
``z(d) = (t(x(d)) − mean) / std``, and gives either

* a **multiplier** ``m(d) = exp(β·z(d))`` (the stored vector is ``m(d)·d̂``), or
* an **offset** ``b(d) = β·z(d)`` (stored ``[d̂ ; b(d)]``, searched with ``[q̂ ; 1]``).

β may be negative (older, shorter, less cited documents up). ``fit-prior`` chooses the
transform, the form and β by NDCG@10 of training queries, cosine always a candidate.

The prior's JSON records the field, transform, missing rule, form, β and the corpus statistics
(mean, std, the fill value, and for ``rank`` the corpus's quantiles), so a document added
later gets its prior from its own field value (:meth:`FieldPrior.terms_for_new` with its
payload bound by :meth:`FieldPrior.with_fields`), without refitting on the corpus.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError, DataError
from magretrieve.priors.base import DocumentPrior, Neighbours, PriorTerms, optional, require
from magretrieve.priors.document_fields import DocumentFields, quote_ids

TRANSFORMS = ("raw", "log1p", "rank")
FORMS = ("offset", "multiplier")
MISSING_RULES = ("median", "min", "zero")
#: |β| candidates (each sign) of the standardized field.
BETAS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15)
#: Corpus quantiles a ``rank`` prior records (every value when the corpus is smaller).
QUANTILES = 1001


def parse_spec(method: str) -> tuple[str, str | None, str | None]:
    """``field:NAME[:TRANSFORM[:MISSING]]`` -> (name, transform or None, missing or None)."""
    parts = method.split(":")
    if parts[0] != "field" or len(parts) < 2 or not parts[1] or len(parts) > 4:
        raise ConfigError(
            f"prior method {method!r}: write a field prior as field:NAME, field:NAME:TRANSFORM "
            f"or field:NAME:TRANSFORM:MISSING (e.g. field:citations:log1p:median)"
        )
    transform = parts[2] if len(parts) > 2 and parts[2] else None
    missing = parts[3] if len(parts) > 3 and parts[3] else None
    if transform is not None and transform not in TRANSFORMS:
        raise ConfigError(
            f"prior method {method!r}: unknown transform {transform!r}; "
            f"choose one of {', '.join(TRANSFORMS)}"
        )
    if missing is not None and missing not in MISSING_RULES:
        raise ConfigError(
            f"prior method {method!r}: unknown missing rule {missing!r}; "
            f"choose one of {', '.join(MISSING_RULES)}"
        )
    return parts[1], transform, missing


class FieldPrior(DocumentPrior):
    method = "field"
    uses_fields = True

    def __init__(
        self,
        field: str,
        transform: str = "log1p",
        form: str = "offset",
        beta: float = 0.0,
        missing: str = "median",
        mean: float = 0.0,
        std: float = 1.0,
        fill: float = 0.0,
        quantiles: Any = None,
    ) -> None:
        if not field:
            raise ConfigError("field prior: the field name is empty")
        if transform not in TRANSFORMS:
            raise ConfigError(f"field prior: unknown transform {transform!r}")
        if form not in FORMS:
            raise ConfigError(f"field prior: unknown form {form!r} (offset or multiplier)")
        if missing not in MISSING_RULES:
            raise ConfigError(f"field prior: unknown missing rule {missing!r}")
        self.field, self.transform, self.form, self.missing = field, transform, form, missing
        self.beta, self.mean, self.std, self.fill = (
            float(beta),
            float(mean),
            float(std),
            float(fill),
        )
        self.quantiles = None if quantiles is None else np.asarray(quantiles, np.float64)
        self._fields: DocumentFields | None = None
        self._z: np.ndarray | None = None

    @property
    def has_offset(self) -> bool:  # type: ignore[override]
        return self.form == "offset"

    @classmethod
    def grid(cls, **options: Any) -> list[DocumentPrior]:
        """Every transform (log1p only for a field without negative values, when ``fields``
        are given), both forms, β of each sign."""
        name = options["field"]
        transforms = [options["transform"]] if options.get("transform") else list(TRANSFORMS)
        fields: DocumentFields | None = options.get("fields")
        if fields is not None and not options.get("transform"):
            values = fields.column(name)
            if np.nanmin(values) < 0:
                transforms.remove("log1p")
        missing = options.get("missing") or "median"
        return [
            cls(name, t, form, sign * b, missing)
            for t in transforms
            for form in FORMS
            for b in BETAS
            for sign in (1.0, -1.0)
        ]

    def with_fields(self, fields: DocumentFields | None) -> FieldPrior:
        bound = copy.copy(self)
        bound._fields, bound._z = fields, None
        return bound

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "field": self.field,
            "transform": self.transform,
            "form": self.form,
            "beta": self.beta,
            "missing": self.missing,
            "mean": self.mean,
            "std": self.std,
            "fill": self.fill,
        }
        if self.quantiles is not None:
            out["quantiles"] = self.quantiles.tolist()
        return out

    @classmethod
    def from_params(cls, data: Mapping[str, Any], source: str) -> FieldPrior:
        field = require(data, "field", str, source)
        if not isinstance(data["field"], str) or not field:
            raise ConfigError(f"{source}: prior key 'field' must be a non-empty string")
        choices = {"transform": TRANSFORMS, "form": FORMS, "missing": MISSING_RULES}
        named = {}
        for key, allowed in choices.items():
            value = data.get(key)
            if value not in allowed:
                raise ConfigError(
                    f"{source}: prior key {key!r} must be one of {', '.join(allowed)}, "
                    f"got {value!r}"
                )
            named[key] = value
        std = optional(data, "std", float, 1.0, source)
        if not std > 0:
            raise ConfigError(f"{source}: prior key 'std' must be positive, got {std}")
        quantiles = data.get("quantiles")
        if named["transform"] == "rank":
            q = _quantiles(quantiles, source)
        elif quantiles is not None:
            raise ConfigError(f"{source}: prior key 'quantiles' belongs to the rank transform")
        else:
            q = None
        return cls(
            field,
            named["transform"],
            named["form"],
            require(data, "beta", float, source),
            named["missing"],
            optional(data, "mean", float, 0.0, source),
            std,
            optional(data, "fill", float, 0.0, source),
            q,
        )

    def label(self) -> str:
        return (
            f"field({self.field},{self.transform},{self.form},β={self.beta:g},"
            f"missing={self.missing})"
        )

    # ------------------------------------------------------------------ the numbers

    def _bound(self, count: int | None) -> DocumentFields:
        if self._fields is None:
            raise ConfigError(
                f"{self.source}: the field prior on {self.field!r} needs each document's "
                "payload (its fields), and none was given"
            )
        if count is not None and len(self._fields) != count:
            raise ConfigError(
                f"field prior: {len(self._fields)} payloads for {count} document vectors"
            )
        return self._fields

    def _values(self, fields: DocumentFields, require_any: bool) -> np.ndarray:
        """The raw field, NaN where missing; negative values under log1p refused."""
        x = fields.column(self.field, require_any=require_any)
        if self.transform == "log1p":
            negative = x < 0  # NaN compares False
            if negative.any():
                raise DataError(
                    f"field {self.field!r} is negative in {int(negative.sum())} document(s) "
                    f"({quote_ids(fields.ids_where(negative))}); the log1p transform needs "
                    "values ≥ 0 (use the raw or rank transform)"
                )
        return x

    def _transformed(self, x: np.ndarray) -> np.ndarray:
        if self.transform == "log1p":
            return np.log1p(x)
        if self.transform == "rank":
            q = self.quantiles
            assert q is not None
            below = np.searchsorted(q, x, side="left")
            upto = np.searchsorted(q, x, side="right")
            return np.asarray((below + upto) / (2.0 * len(q)), dtype=np.float64)
        return np.asarray(x, dtype=np.float64)

    def standardized(self, x: np.ndarray) -> np.ndarray:
        """``z`` of raw field values (NaN: missing) under the recorded statistics."""
        missing = np.isnan(x)
        t = np.full(len(x), self.fill)
        t[~missing] = self._transformed(x[~missing])
        return (t - self.mean) / self.std

    def fit_fields(self) -> None:
        """Corpus statistics from the bound fields; refuses a field that is missing from every
        document, non-numeric, NaN, negative under log1p or constant (one line each)."""
        fields = self._bound(None)
        x = self._values(fields, require_any=True)
        present = ~np.isnan(x)
        values = x[present]
        if values.min() == values.max():
            raise DataError(
                f"field {self.field!r} is constant ({values[0]:g} in every one of the "
                f"{int(present.sum())} document(s) that have it: "
                f"{quote_ids(fields.ids_where(present))}); it cannot rank anything"
            )
        if self.transform == "rank":
            grid = np.linspace(0.0, 1.0, min(QUANTILES, len(values)))
            self.quantiles = np.quantile(values, grid)
        t = self._transformed(values)
        if self.missing == "median":
            self.fill = float(np.median(t))
        elif self.missing == "min":
            self.fill = float(t.min())
        else:
            self.fill = float(self._transformed(np.zeros(1))[0])
        every = np.full(len(x), self.fill)
        every[present] = t
        self.mean, self.std = float(every.mean()), float(every.std())
        if not self.std > 0:  # every value present equals the fill
            raise DataError(
                f"field {self.field!r} takes one value over all {len(x)} documents after "
                f"the {self.transform} transform and the {self.missing} missing rule"
            )
        self._z = (every - self.mean) / self.std

    def fit_corpus(self, units: np.ndarray) -> None:
        self._bound(len(units))
        self.fit_fields()

    def _terms(self, units: np.ndarray, z: np.ndarray) -> PriorTerms:
        n = len(units)
        if self.form == "offset":
            return PriorTerms(np.asarray(units, np.float32), np.ones(n), self.beta * z)
        return PriorTerms(np.asarray(units, np.float32), np.exp(self.beta * z), np.zeros(n))

    def terms(self, units: np.ndarray) -> PriorTerms:
        if self._z is None or len(self._z) != len(units):
            self.fit_corpus(units)
        assert self._z is not None
        return self._terms(units, self._z)

    def terms_for_new(self, units: np.ndarray, neighbours: Neighbours) -> PriorTerms:
        """Terms of new documents (their payloads bound) from the recorded statistics."""
        if self.transform == "rank" and self.quantiles is None:
            raise ConfigError(f"{self.source}: a rank field prior records its corpus quantiles")
        fields = self._bound(len(units))
        return self._terms(units, self.standardized(self._values(fields, require_any=False)))


def _quantiles(value: Any, source: str) -> np.ndarray:
    try:
        q = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        q = np.zeros(0)
    if value is None or q.ndim != 1 or len(q) < 2 or not np.isfinite(q).all():
        raise ConfigError(
            f"{source}: prior key 'quantiles' must be a list of at least two finite numbers"
        )
    if (np.diff(q) < 0).any():
        raise ConfigError(f"{source}: prior key 'quantiles' must be non-decreasing")
    return q
