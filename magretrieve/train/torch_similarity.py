"""torch twins of the similarity family's numpy functions (:mod:`magretrieve.core.similarity`).

Training, export and diagnose compute ``x/‖x‖^γ`` on tensors, with γ possibly a learnable
tensor; the semantics are those of the numpy functions, which the tests hold equal.
"""

from __future__ import annotations

import torch

from magretrieve.core.similarity import EPS


def partial_normalize_torch(x: torch.Tensor, gamma: float | torch.Tensor) -> torch.Tensor:
    """torch twin of :func:`partial_normalize`; γ may be a (learnable) tensor."""
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(EPS)
    if isinstance(gamma, torch.Tensor):
        return x / norms.pow(gamma)
    if gamma == 0.0:
        return x
    if gamma == 1.0:
        return x / norms
    return x / norms.pow(gamma)


def score_matrix_torch(
    q: torch.Tensor,
    d: torch.Tensor,
    gamma_q: float | torch.Tensor,
    gamma_d: float | torch.Tensor,
) -> torch.Tensor:
    """torch twin of :func:`score_matrix`, differentiable in the embeddings and in γ."""
    return partial_normalize_torch(q, gamma_q) @ partial_normalize_torch(d, gamma_d).T
