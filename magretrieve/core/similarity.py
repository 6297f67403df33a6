"""The similarity family: the single home of γ semantics.

s(q, d) = (q / ‖q‖^γq) · (d / ‖d‖^γd) = ‖q‖^(1−γq) ‖d‖^(1−γd) cos θ

γ = 1 normalizes a side, γ = 0 keeps its magnitude. Only γd changes a ranking, so an
index stores ``d / ‖d‖^γd`` and is searched by inner product. Everything that needs to
know what a mode means asks this module; nothing else re-derives ‖d‖^(1−γd).

numpy functions serve; their torch twins, which train, live in
:mod:`magretrieve.train.torch_similarity`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError

#: Fixed (γq, γd) of each named mode; ``learnable`` has trained γ values instead.
FIXED_GAMMAS: dict[str, tuple[float, float]] = {
    "cosine": (1.0, 1.0),
    "dot": (0.0, 0.0),
    "qnorm": (1.0, 0.0),
    "dnorm": (0.0, 1.0),
}
MODES: tuple[str, ...] = (*FIXED_GAMMAS, "learnable")
#: γ where learnable training starts in the paper (sigmoid(0)).
PAPER_LEARNABLE_INIT = 0.5
#: Every score is an inner product of the stored vectors.
INDEX_METRIC = "inner_product"
#: Guard against division by zero for all-zero vectors.
EPS = 1e-12


@dataclass(frozen=True)
class Similarity:
    """A resolved similarity: a mode name and its two exponents."""

    mode: str
    gamma_q: float
    gamma_d: float

    @property
    def is_symmetric(self) -> bool:
        """True when s(a, b) = s(b, a) for every pair, i.e. γq = γd."""
        return math.isclose(self.gamma_q, self.gamma_d, abs_tol=1e-9)

    @property
    def query_contract(self) -> str:
        """What the query vectors look like: ``unit_norm`` or ``magnitude_keeping``."""
        return vector_contract(self.gamma_q)

    @property
    def document_contract(self) -> str:
        """What the stored document vectors look like: ``unit_norm`` or ``magnitude_keeping``."""
        return vector_contract(self.gamma_d)

    @property
    def ranks_like(self) -> str:
        """The fixed mode that orders documents identically for a fixed query (only γd matters)."""
        if self.gamma_d == 1.0:
            return "cosine"
        if self.gamma_d == 0.0:
            return "dot"
        return self.mode

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "gamma_q": self.gamma_q, "gamma_d": self.gamma_d}


def vector_contract(gamma: float) -> str:
    """``unit_norm`` when γ = 1 (the vector is normalized), else ``magnitude_keeping``."""
    return "unit_norm" if gamma == 1.0 else "magnitude_keeping"


def _check_gamma(name: str, value: float) -> float:
    try:
        value = float(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{name} must be a number in [0, 1], got {value!r}") from exc
    if not (0.0 <= value <= 1.0) or math.isnan(value):
        raise ConfigError(f"{name} must lie in [0, 1], got {value}")
    return value


def resolve(mode: str, gamma_q: float | None = None, gamma_d: float | None = None) -> Similarity:
    """Turn a mode name (and, for ``learnable``, its γ values) into a :class:`Similarity`.

    Fixed modes take no γ, or exactly their own; ``learnable`` takes any γ in [0, 1]
    (default 0.5 each, the paper's start).
    """
    if not isinstance(mode, str) or mode.lower() not in MODES:
        raise ConfigError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    mode = mode.lower()
    if mode == "learnable":
        gq = _check_gamma("gamma_q", PAPER_LEARNABLE_INIT if gamma_q is None else gamma_q)
        gd = _check_gamma("gamma_d", PAPER_LEARNABLE_INIT if gamma_d is None else gamma_d)
        return Similarity("learnable", gq, gd)
    fq, fd = FIXED_GAMMAS[mode]
    for name, given, fixed in (("gamma_q", gamma_q, fq), ("gamma_d", gamma_d, fd)):
        if given is not None and not math.isclose(_check_gamma(name, given), fixed):
            raise ConfigError(
                f"mode {mode!r} fixes {name}={fixed}; got {given} (use mode 'learnable')"
            )
    return Similarity(mode, fq, fd)


def is_symmetric(mode: str | Similarity) -> bool:
    """Whether a mode scores s(a, b) = s(b, a); one-sided modes do not."""
    sim = mode if isinstance(mode, Similarity) else resolve(mode)
    return sim.is_symmetric


# ----------------------------------------------------------------------------- numpy


def partial_normalize(x: np.ndarray, gamma: float) -> np.ndarray:
    """Return ``x / ‖x‖^γ`` row-wise (γ = 1 normalizes, γ = 0 returns ``x`` unchanged)."""
    x = np.asarray(x, dtype=np.float32)
    if gamma == 0.0:
        return np.array(x, copy=True)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    out: np.ndarray = (x / np.power(np.maximum(norms, EPS), gamma)).astype(np.float32)
    return out


def query_vectors(q: np.ndarray, sim: Similarity) -> np.ndarray:
    """The vectors a search sends for raw query embeddings ``q``: ``q / ‖q‖^γq``."""
    return partial_normalize(q, sim.gamma_q)


def document_vectors(d: np.ndarray, sim: Similarity) -> np.ndarray:
    """The vectors an index must store for raw document embeddings ``d``: ``d / ‖d‖^γd``."""
    return partial_normalize(d, sim.gamma_d)


def score_matrix(q: np.ndarray, d: np.ndarray, sim: Similarity) -> np.ndarray:
    """Scores of every query (rows) against every document (columns) from raw embeddings."""
    scores: np.ndarray = query_vectors(q, sim) @ document_vectors(d, sim).T
    return scores


def decompose(query_vec: np.ndarray, doc_vecs: np.ndarray) -> dict[str, np.ndarray]:
    """Split inner-product scores of *stored* vectors into cos θ and the two stored norms.

    score = ‖q_stored‖ · ‖d_stored‖ · cos θ, so a user sees what magnitude contributed.
    """
    q = np.asarray(query_vec, dtype=np.float32).reshape(-1)
    d = np.atleast_2d(np.asarray(doc_vecs, dtype=np.float32))
    qn = float(np.linalg.norm(q))
    dn = np.linalg.norm(d, axis=1)
    scores = d @ q
    cos = scores / np.maximum(qn * dn, EPS)
    return {"score": scores, "query_norm": np.full_like(dn, qn), "doc_norm": dn, "cosine": cos}


class SideVectors:
    """Mixin: store-ready query and document vectors from a raw ``embed`` under ``self.similarity``.

    Anything that can produce raw pooled embeddings (the torch encoder, a cache of them) gets
    ``encode_queries``/``encode_documents`` with exactly the serving semantics.
    """

    similarity: Similarity

    def embed(
        self, texts: Any, side: str, batch_size: int = 64, progress: bool | str = False
    ) -> np.ndarray:
        raise NotImplementedError

    def encode_queries(
        self, texts: Any, batch_size: int = 64, progress: bool | str = False
    ) -> np.ndarray:
        """Query vectors as sent to a store: ``q / ‖q‖^γq``."""
        return query_vectors(self.embed(texts, "query", batch_size, progress), self.similarity)

    def encode_documents(
        self, texts: Any, batch_size: int = 64, progress: bool | str = False
    ) -> np.ndarray:
        """Document vectors as a store keeps them: ``d / ‖d‖^γd`` (magnitude kept unless γd = 1)."""
        return document_vectors(
            self.embed(texts, "document", batch_size, progress), self.similarity
        )
