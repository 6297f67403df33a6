"""Document norm heads: learn a magnitude on top of a normalization-pretrained encoder.

An encoder pretrained through a ``Normalize`` layer (all-MiniLM, BGE, E5, GTE, ...) has raw
norms that carry an *anti*-relevance signal, so qnorm/dot fine-tuning from the raw vectors
starts far from the good cosine solution. A norm head starts *at* cosine instead::

    document vector = d̂ · exp(g(d̂))        d̂ = d / ‖d‖,  g: R^dim -> R

``g`` is a linear map or a 2-layer MLP whose output layer is zero-initialized, so at step 0
``g ≡ 0``, every document vector is unit-norm and the ranking *is* cosine, exactly. qnorm
InfoNCE then teaches ``g`` a relevance prior (a log-magnitude), optionally bounded to
``±bound`` with ``bound·tanh(g/bound)`` so no document can be pushed arbitrarily far.

``g`` reads only the unit vector ``d̂`` (what a cosine-normalized store already holds), which
is what lets ``magretrieve rescale`` apply a frozen-encoder head to stored vectors without
re-encoding any text. :func:`log_magnitude_numpy` is the torch-free twin used there.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError
from magretrieve.core.norm_head import (  # noqa: F401  (re-exported: the head's torch-free half)
    DEFAULT_HIDDEN,
    HEAD_FILE,
    HEAD_KINDS,
    check_head_config,
    head_spec,
    load_head_weights,
    log_magnitude_numpy,
)
from magretrieve.core.training import TrainConfig


def build_head(dim: int, kind: str, hidden: int = DEFAULT_HIDDEN, bound: float = 0.0) -> Any:
    """A zero-output :class:`NormHead` (torch), or ``None`` for ``kind == "none"``."""
    check_head_config(kind, hidden, bound)
    if kind == "none":
        return None
    return NormHead(dim, kind, hidden, bound)


@functools.cache
def _torch_module() -> Any:
    import torch
    from torch import nn

    class _NormHead(nn.Module):
        """``g(d̂)``: log-magnitude of each document from its unit vector (zero at init)."""

        def __init__(self, dim: int, kind: str, hidden: int, bound: float) -> None:
            super().__init__()
            self.kind, self.dim, self.hidden, self.bound = kind, int(dim), int(hidden), float(bound)
            if kind == "linear":
                self.out = nn.Linear(dim, 1)
            else:
                self.inner = nn.Linear(dim, hidden)
                self.out = nn.Linear(hidden, 1)
            # Zero output layer: g ≡ 0 at step 0, so the model starts as cosine exactly.
            # (Gradients still flow: ∂g/∂w_out = the layer's input, which is not zero.)
            nn.init.zeros_(self.out.weight)
            nn.init.zeros_(self.out.bias)

        def forward(self, unit: torch.Tensor) -> torch.Tensor:
            x = unit
            if self.kind == "mlp":
                x = nn.functional.silu(self.inner(x))
            g = self.out(x).squeeze(-1)
            if self.bound > 0:
                g = self.bound * torch.tanh(g / self.bound)
            return g

        def scale(self, pooled: torch.Tensor) -> torch.Tensor:
            """``d̂ · exp(g(d̂))`` for raw pooled vectors (any positive rescaling of d is ignored)."""
            unit = pooled / pooled.norm(dim=-1, keepdim=True).clamp_min(1e-12)
            return unit * torch.exp(self(unit)).unsqueeze(-1)

        def spec(self) -> dict[str, Any]:
            return head_spec(self.kind, self.hidden, self.bound)

    return _NormHead


def NormHead(dim: int, kind: str, hidden: int = DEFAULT_HIDDEN, bound: float = 0.0) -> Any:
    """Construct the torch head module (defined lazily so ``magretrieve.train.heads`` stays torch-free)."""
    return _torch_module()(dim, kind, hidden, bound)


# ----------------------------------------------------------------------------- weights I/O


def save_head(head: Any, folder: str | Path) -> Path:
    """Write the head's weights as safetensors (``norm_head.safetensors``) into ``folder``."""
    from safetensors.torch import save_file

    path = Path(folder) / HEAD_FILE
    save_file({k: v.detach().cpu().contiguous() for k, v in head.state_dict().items()}, str(path))
    return path


# ----------------------------------------------------------------------------- fast training


def train_head_on_vectors(
    query_units: np.ndarray,
    doc_units: np.ndarray,
    positives: list[tuple[int, int]],
    negatives: Mapping[int, list[int]] | None = None,
    *,
    kind: str = "linear",
    hidden: int = DEFAULT_HIDDEN,
    bound: float = 0.0,
    epochs: int = 30,
    batch_size: int = 32,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    scale: float = 20.0,
    hard_negatives: int = 7,
    seed: int = 42,
    on_epoch: Any = None,
) -> tuple[Any, list[float]]:
    """Train a head on cached unit vectors of a *frozen* encoder (seconds instead of hours).

    ``positives`` are (query row, document row) pairs; ``negatives`` maps a query row to
    document rows used as hard negatives (e.g. the zero-shot top-30 non-relevant). The loss
    is qnorm InfoNCE with in-batch + hard negatives: logits ``scale · cos(q, d)·exp(g(d))``,
    exactly what :func:`magretrieve.train.trainer.train` computes for ``trainable=["norm_head"]``
    with the encoder in eval mode. ``on_epoch(epoch, head)`` (head in eval mode) lets a caller
    score a validation split after each epoch. Returns the head (eval mode) and the per-epoch
    mean loss.
    """
    import torch

    from magretrieve.train.losses import InfoNCE

    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    head = build_head(doc_units.shape[1], kind, hidden, bound)
    if head is None:
        raise ConfigError("train_head_on_vectors needs a head kind other than 'none'")
    q_all = torch.from_numpy(np.ascontiguousarray(query_units, dtype=np.float32))
    d_all = torch.from_numpy(np.ascontiguousarray(doc_units, dtype=np.float32))
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    info_nce = InfoNCE(scale, gather=False)
    pos = np.asarray(positives, dtype=np.int64)
    losses: list[float] = []
    negatives = negatives or {}
    for _ in range(epochs):
        order = rng.permutation(len(pos))
        total, count = 0.0, 0
        for start in range(0, len(order), batch_size):
            rows = pos[order[start : start + batch_size]]
            if len(rows) < 2:
                continue
            cols = list(rows[:, 1])
            for qrow in rows[:, 0]:
                pool = negatives.get(int(qrow), [])
                if pool and hard_negatives:
                    pick = rng.choice(len(pool), size=min(hard_negatives, len(pool)), replace=False)
                    cols.extend(pool[i] for i in pick)
            cols_t = torch.as_tensor(cols)
            q = q_all[torch.as_tensor(rows[:, 0])]
            d = d_all[cols_t]
            d = d * torch.exp(head(d)).unsqueeze(-1)
            # keys = document rows: a column holding a query's own positive document
            # (repeated) is not its negative
            loss = info_nce(q, d, positive_keys=torch.as_tensor(rows[:, 1]), column_keys=cols_t)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(rows)
            count += len(rows)
        losses.append(total / max(count, 1))
        if on_epoch is not None:
            head.eval()
            with torch.no_grad():
                on_epoch(len(losses), head)
            head.train()
    head.eval()
    return head, losses


def train_frozen_head(
    encoder: Any, pairs: list[Any], config: TrainConfig, *, progress: bool = True
) -> list[float]:
    """Train ``encoder.norm_head`` with the encoder frozen: encode every text once, then train
    on the cached unit vectors (:func:`train_head_on_vectors`). Minutes instead of hours on CPU.

    ``pairs`` are :class:`~magretrieve.data.readers.TrainingPair` (hard negatives from their
    ``negatives``). ``config`` gives the epochs, batch size, scale, hard negatives, seed and
    ``head_lr`` (the head's learning rate). The trained weights are copied into
    ``encoder.norm_head``; returns the per-epoch mean loss.
    """
    import torch

    if encoder.norm_head is None:
        raise ConfigError("train_frozen_head needs an encoder with a norm head")
    queries = list(dict.fromkeys(p.query for p in pairs))
    docs = list(
        dict.fromkeys([p.positive for p in pairs] + [n for p in pairs for n in p.negatives])
    )
    head, encoder.norm_head = encoder.norm_head, None  # encode the frozen encoder's unit vectors
    try:
        q = encoder.embed(queries, "query", progress=progress and "frozen head: queries")
        d = encoder.embed(docs, "document", progress=progress and "frozen head: documents")
    finally:
        encoder.norm_head = head
    unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # noqa: E731
    q_row = {t: i for i, t in enumerate(queries)}
    d_row = {t: i for i, t in enumerate(docs)}
    positives = [(q_row[p.query], d_row[p.positive]) for p in pairs]
    negatives: dict[int, list[int]] = {}
    for p in pairs:
        pool = negatives.setdefault(q_row[p.query], [])
        pool.extend(d_row[n] for n in p.negatives if d_row[n] not in pool)
    trained, losses = train_head_on_vectors(
        unit(q),
        unit(d),
        positives,
        negatives,
        kind=head.kind,
        hidden=head.hidden,
        bound=head.bound,
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=config.head_lr,
        scale=config.scale,
        hard_negatives=config.hard_negatives,
        seed=config.seed,
    )
    with torch.no_grad():
        head.load_state_dict(trained.state_dict())
    head.eval()
    return losses
