"""The seam every document prior goes through: direction, multiplier, offset.

A training-free document prior turns the unit document vector ``d̂`` into three terms,

* a unit **direction** ``v(d)`` (``d̂`` itself for every prior but mean-direction removal),
* a **multiplier** ``m(d) > 0``,
* an additive **offset** ``b(d)``,

so the score of a unit query ``q̂`` is ``m(d)·(q̂·v(d)) + b(d)``. One inner-product index serves
it: the stored vector is ``m(d)·v(d)`` when no offset is needed (as the corpus prior always
was) and ``[m(d)·v(d) ; b(d)]`` (one extra coordinate) otherwise, with the query ``[q̂ ; 1]``.
Every prior is a function of the stored unit vectors (plus, for query-bank priors, the
training queries it carries), so any cosine-built store can be given any prior without
re-encoding text, and a hit's score splits back into (cosine, multiplier, offset).

Priors are fitted in two steps: :meth:`DocumentPrior.fit_corpus` computes the corpus
statistics on whatever corpus is indexed (so the prior adapts to a new corpus), and
:meth:`DocumentPrior.terms` gives the three terms of that corpus's documents.
:meth:`DocumentPrior.terms_for_new` gives them for documents added to a store later, from the
recorded statistics and the store's nearest neighbours.

Numpy only (no torch): priors run on stored vectors.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from magretrieve.core.errors import ConfigError, DataError

KIND = "document_prior"
#: Fitted corpus statistics: part of a prior's JSON, not of its name.
STATE_KEYS = ("mean", "std", "queries")

#: ``neighbours(units, k)``: cosines of each unit vector to its ``k`` nearest stored documents
#: (rows sorted descending; fewer columns when the store is small). Used for documents added later.
Neighbours = Callable[[np.ndarray, int], np.ndarray]


def unit(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit norm (float32)."""
    v = np.asarray(vectors, dtype=np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


@dataclass
class PriorTerms:
    """Direction (unit rows), multiplier and offset of each document."""

    direction: np.ndarray
    multiplier: np.ndarray
    offset: np.ndarray

    @classmethod
    def identity(cls, units: np.ndarray) -> PriorTerms:
        n = len(units)
        return cls(np.asarray(units, np.float32), np.ones(n), np.zeros(n))

    def scores(self, query_units: np.ndarray) -> np.ndarray:
        """``m(d)·(q̂·v(d)) + b(d)`` for every query (rows) and document (columns)."""
        q = np.asarray(query_units, dtype=np.float64)
        return (q @ self.direction.T.astype(np.float64)) * self.multiplier + self.offset


#: Rows computed at a time by :func:`stored_vectors` (its float64 products stay small).
STORED_BLOCK = 65536


def stored_vectors(terms: PriorTerms, with_offset: bool) -> np.ndarray:
    """What the store holds: ``m·v`` or ``[m·v ; b]`` (float32; products in float64, in
    blocks of rows so a million documents never need a float64 copy of the corpus)."""
    if not with_offset and np.any(terms.offset != 0):
        raise ConfigError("this prior has an offset; its store needs the extra coordinate")
    n, dim = terms.direction.shape
    out = np.empty((n, dim + (1 if with_offset else 0)), dtype=np.float32)
    multiplier = np.asarray(terms.multiplier, dtype=np.float64)
    for start in range(0, n, STORED_BLOCK):
        rows = slice(start, start + STORED_BLOCK)
        out[rows, :dim] = terms.direction[rows].astype(np.float64) * multiplier[rows, None]
    if with_offset:
        out[:, dim] = terms.offset
    return out


def query_vectors(query_units: np.ndarray, with_offset: bool) -> np.ndarray:
    """What is searched with: ``q̂`` or ``[q̂ ; 1]`` (float32)."""
    q = np.asarray(query_units, dtype=np.float32)
    if not with_offset:
        return q
    return np.hstack([q, np.ones((len(q), 1), np.float32)])


def split_stored(stored: np.ndarray, with_offset: bool) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`stored_vectors`: the scaled direction part and the offset."""
    s = np.atleast_2d(np.asarray(stored, dtype=np.float32))
    if not with_offset:
        return s, np.zeros(len(s), np.float32)
    return s[:, :-1], s[:, -1]


def encode_matrix(matrix: np.ndarray) -> dict[str, Any]:
    """A float32 matrix as JSON (base64 of little-endian bytes + shape): the query bank."""
    m = np.ascontiguousarray(np.asarray(matrix, dtype="<f4"))
    return {"shape": list(m.shape), "float32_base64": base64.b64encode(m.tobytes()).decode()}


def decode_matrix(data: Any, source: str) -> np.ndarray:
    try:
        shape = tuple(as_int(x) for x in data["shape"])
        raw = base64.b64decode(data["float32_base64"], validate=True)
        m: np.ndarray = np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float32)
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise ConfigError(f"{source}: prior key 'queries' is malformed ({exc})") from None
    if m.ndim != 2 or not len(m) or not m.shape[1] or not np.isfinite(m).all():
        raise ConfigError(
            f"{source}: prior key 'queries' must be a finite, non-empty 2-D matrix, "
            f"got shape {list(m.shape)}"
        )
    return m


def top_k_mean(
    units: np.ndarray, bank: np.ndarray, k: int, *, exclude_self: bool = False, chunk: int = 1024
) -> np.ndarray:
    """Mean cosine of each row of ``units`` to its ``k`` nearest rows of ``bank`` (exact, chunked).

    ``exclude_self`` (``units`` is ``bank``): a vector is not its own neighbour.
    """
    u = np.asarray(units, dtype=np.float32)
    b = np.asarray(bank, dtype=np.float32)
    n = len(b) - (1 if exclude_self else 0)
    if n < 1:
        raise DataError(f"a neighbour bank needs at least {2 if exclude_self else 1} vectors")
    k = min(int(k), n)
    if k < 1:
        raise ConfigError(f"k must be at least 1, got {k}")
    out = np.zeros(len(u), dtype=np.float64)
    for start in range(0, len(u), chunk):
        sims = u[start : start + chunk] @ b.T
        if exclude_self:
            rows = np.arange(sims.shape[0])
            sims[rows, start + rows] = -np.inf
        top = np.partition(sims, sims.shape[1] - k, axis=1)[:, sims.shape[1] - k :]
        out[start : start + chunk] = top.mean(axis=1)
    return out


def log_mean_exp(units: np.ndarray, bank: np.ndarray, beta: float, chunk: int = 1024) -> np.ndarray:
    """``log mean_{q'∈bank} exp(β·cos(q', d))`` per document (stable)."""
    u = np.asarray(units, dtype=np.float32)
    b = np.asarray(bank, dtype=np.float32)
    if not len(b):
        raise DataError("the query bank is empty")
    out = np.zeros(len(u), dtype=np.float64)
    for start in range(0, len(u), chunk):
        x = beta * (u[start : start + chunk] @ b.T).astype(np.float64)
        top = x.max(axis=1, keepdims=True)
        out[start : start + chunk] = top[:, 0] + np.log(np.exp(x - top).mean(axis=1))
    return out


class DocumentPrior:
    """Base of every prior: parameters, corpus statistics, and the three terms per document.

    Subclasses set :attr:`method`, :attr:`has_offset`, implement :meth:`fit_corpus`,
    :meth:`terms` and :meth:`terms_for_new`, and (de)serialize their own parameters.
    """

    method: ClassVar[str] = ""
    #: Does the prior need the extra offset coordinate in the store?
    has_offset: ClassVar[bool] = False
    #: Does it scale documents (a multiplier m(d) other than 1)?
    has_multiplier: ClassVar[bool] = False
    #: Does it carry a bank of training queries (so its selection must be cross-fitted)?
    uses_query_bank: ClassVar[bool] = False
    #: Does it read each document's payload fields (bound by :meth:`with_fields`)?
    uses_fields: ClassVar[bool] = False
    #: Where it was read from (a file name), for error messages.
    source: str = "prior"

    @classmethod
    def grid(cls, **options: Any) -> list[DocumentPrior]:
        """The candidates ``fit-prior`` tries for this method (on training queries)."""
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        """Parameters and fitted statistics as JSON-ready values."""
        raise NotImplementedError

    @classmethod
    def from_params(cls, data: Mapping[str, Any], source: str) -> DocumentPrior:
        raise NotImplementedError

    def with_bank(self, bank: np.ndarray | None) -> DocumentPrior:
        """This prior with another query bank (query-bank priors); others return themselves."""
        return self

    def with_fields(self, fields: Any) -> DocumentPrior:
        """This prior reading the payloads ``fields`` (a
        :class:`~magretrieve.priors.document_fields.DocumentFields` aligned with the vectors
        given next); priors of the vectors alone return themselves."""
        return self

    def fit_corpus(self, units: np.ndarray) -> None:
        """Compute the corpus statistics (on the corpus being indexed)."""

    def check_dimension(self, dimension: int, source: str) -> None:
        """Refuse, naming ``source`` and the field, state of another dimension than the store's.

        Priors that carry vectors (a query bank, a mean direction) override it; it runs before
        anything is written, so a prior fitted with another model fails in one line.
        """

    def terms(self, units: np.ndarray) -> PriorTerms:
        """Terms of the corpus :meth:`fit_corpus` saw (``units`` is that corpus)."""
        raise NotImplementedError

    def terms_for_new(self, units: np.ndarray, neighbours: Neighbours) -> PriorTerms:
        """Terms of documents added to a store later (recorded statistics, store neighbours)."""
        raise NotImplementedError

    def shown_params(self) -> dict[str, Any]:
        """The parameters a person chose (no fitted statistics, no vectors)."""
        return {
            k: v
            for k, v in self.params().items()
            if k not in STATE_KEYS and not isinstance(v, dict | list)
        }

    def label(self) -> str:
        """Short human-readable name with parameters, e.g. ``hub(β=0.05,k=10)``."""
        shown = self.shown_params()
        return f"{self.method}(" + ",".join(f"{k}={_fmt(v)}" for k, v in shown.items()) + ")"

    def describe(self) -> dict[str, Any]:
        """What a score shown to a person must say about this prior: its name, label and
        chosen parameters, and which terms it sets (a multiplier m(d), an offset b(d))."""
        return {
            "name": self.to_dict()["method"],
            "label": self.label(),
            "params": self.shown_params(),
            "multiplier": bool(self.has_multiplier),
            "offset": bool(self.has_offset),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"kind": KIND, "method": self.method, **self.params()}


class QueryBankPrior(DocumentPrior):
    """A prior that carries a bank of training queries: ``queries``, an (n, dim) float32
    matrix (None until fitted), which must match the store's dimension."""

    queries: np.ndarray | None = None

    def check_dimension(self, dimension: int, source: str) -> None:
        if self.queries is not None and self.queries.shape[1] != int(dimension):
            raise ConfigError(
                f"{source}: prior key 'queries' holds vectors of dimension "
                f"{self.queries.shape[1]}, the store {dimension} (fitted with another model?)"
            )


def compact(prior_dict: Mapping[str, Any]) -> dict[str, Any]:
    """A prior's JSON without its bulky state (query bank, mean vector, quantiles), for
    printing."""
    out: dict[str, Any] = {}
    for key, value in prior_dict.items():
        if key in ("queries", "quantiles") or (key == "mean" and isinstance(value, list)):
            continue
        out[key] = [compact(p) for p in value] if key == "parts" else value
    return out


def _fmt(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def as_int(value: Any) -> int:
    """A JSON integer (``10``, ``10.0``); strings, booleans and fractions are refused."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not an integer: {value!r}")
    if isinstance(value, float) and not (np.isfinite(value) and value.is_integer()):
        raise ValueError(f"not an integer: {value!r}")
    return int(value)


def as_float(value: Any) -> float:
    """A JSON number; strings and booleans are refused (``"0.5"`` is a typo, not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    return float(value)


def _strict(cast: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return {int: as_int, float: as_float}.get(cast, cast)  # type: ignore[call-overload]


def require(data: Mapping[str, Any], key: str, cast: Callable[[Any], Any], source: str) -> Any:
    """``cast(data[key])`` or a one-line ConfigError naming the file and key.

    ``int`` and ``float`` are strict: a JSON string or boolean is refused, not converted.
    """
    if key not in data:
        raise ConfigError(f"{source}: prior {data.get('method')!r} lacks {key!r}")
    try:
        value = _strict(cast)(data[key])
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(
            f"{source}: prior key {key!r} is malformed: {_short(data[key])}"
        ) from None
    if isinstance(value, float) and not np.isfinite(value):
        raise ConfigError(f"{source}: prior key {key!r} must be finite, got {value}")
    return value


def optional(
    data: Mapping[str, Any], key: str, cast: Callable[[Any], Any], default: Any, source: str
) -> Any:
    """:func:`require` when ``key`` is present, else ``default``."""
    return require(data, key, cast, source) if key in data else default


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
