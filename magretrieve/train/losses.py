"""The contrastive loss (InfoNCE) of every trainer in magretrieve, local or across ranks.

One class, :class:`InfoNCE`, serves the encoder trainer (:mod:`magretrieve.train.trainer`), the
frozen-encoder norm heads (:mod:`magretrieve.train.heads`) and diagnose's per-example gradient probe
(:mod:`magretrieve.diagnose.side`). Logits are ``scale · ⟨q_i, d_j⟩`` over side-normalized
vectors; query ``i``'s target is its own positive, every other column is a negative, except
columns that hold the *same document* as its positive (a repeated text is not its own negative):
those are masked, recognised by equal integer keys (:func:`text_keys` for texts, row numbers
for cached vectors).

**Across ranks** (``torch.distributed`` initialized, e.g. under ``torchrun``), each rank's
queries and documents are all-gathered *with gradients* (``torch.distributed.nn.all_gather``,
as sentence-transformers' ``all_gather_with_grad``), so N ranks × batch B see exactly the
in-batch negatives of one process with batch N·B. Each rank scores its own queries against all
gathered columns and averages over them; DistributedDataParallel then averages the gradients
over ranks, which is the gradient of the mean over all N·B queries. Ranks may hold different
numbers of columns (hard negatives): sizes are exchanged and rows padded for the collective.

**Cached** (GradCache, Gao et al. 2021; sentence-transformers' CachedMultipleNegativesRanking
Loss): :func:`cached_backward` embeds a large batch in mini-batches without a graph, takes the
loss and its gradient with respect to the embeddings, then re-embeds each mini-batch with a
graph and back-propagates that gradient, replaying the random state so dropout masks match.
Memory is one mini-batch's activations; the gradient equals the uncached one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from magretrieve.train.distributed import world


def text_keys(texts: Sequence[str]) -> torch.Tensor:
    """A stable 63-bit integer per text (equal texts, equal keys; the same on every rank)."""
    keys = [
        int.from_bytes(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest(), "little") >> 1
        for t in texts
    ]
    return torch.tensor(keys, dtype=torch.int64)


def gather_rows(x: torch.Tensor, *, with_grad: bool) -> tuple[torch.Tensor, list[int]]:
    """Concatenate ``x`` of every rank along dim 0 (rank order); also returns each rank's rows.

    Row counts may differ between ranks. ``with_grad`` keeps the autograd graph: the gradient
    reaching another rank's rows flows back to that rank (summed), as all_gather_with_grad does.
    """
    rank, size = world()
    if size == 1:
        return x, [x.shape[0]]
    n = torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device)
    counts = [torch.zeros_like(n) for _ in range(size)]
    dist.all_gather(counts, n)
    sizes = [int(c.item()) for c in counts]
    top = max(sizes)
    if x.shape[0] < top:  # the collective needs equal shapes
        pad = x.new_zeros((top - x.shape[0], *x.shape[1:]))
        x = torch.cat([x, pad])
    if with_grad:
        parts = list(torch.distributed.nn.functional.all_gather(x))
    else:
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous())
        parts[rank] = x  # the local rows keep their graph
    return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)]), sizes


class InfoNCE:
    """InfoNCE with in-batch (and hard) negatives, masked duplicates, optional reverse direction.

    ``scale`` is 1/τ (20 = the paper's). ``symmetric`` adds the document→query direction over
    the positives (symmetric tasks). ``gather`` (default) pools every rank's rows when a process
    group is initialized; with one process it is plain InfoNCE.
    """

    def __init__(self, scale: float = 20.0, *, symmetric: bool = False, gather: bool = True):
        self.scale = float(scale)
        self.symmetric = symmetric
        self.gather = gather

    def __call__(
        self,
        q: torch.Tensor,
        d: torch.Tensor,
        *,
        positive_keys: torch.Tensor | None = None,
        column_keys: torch.Tensor | None = None,
        exclude: torch.Tensor | None = None,
        reduction: str = "mean",
    ) -> torch.Tensor:
        """Loss of queries ``q`` (B × dim) against ``d`` (B positives first, then negatives).

        ``positive_keys`` (B) and ``column_keys`` (len(d)) identify documents: a column whose
        key equals row i's positive key, other than column i, is masked (not a negative).
        Without keys nothing is masked. ``exclude`` (B × len(d) bool, one process only) is an
        explicit mask instead of keys. ``reduction``: "mean" or "none" (one loss per query).
        """
        b = q.shape[0]
        if d.shape[0] < b:
            raise ValueError(f"{d.shape[0]} document rows for {b} queries: positives come first")
        rank, size = world() if self.gather else (0, 1)
        if exclude is not None and size > 1:
            raise ValueError("an explicit exclude mask cannot span ranks; pass keys")
        if size > 1:
            d_all, d_sizes = gather_rows(d, with_grad=True)
            offset = sum(d_sizes[:rank])
        else:
            d_all, offset = d, 0
        logits = self.scale * (q @ d_all.T)
        target = torch.arange(b, device=q.device) + offset
        mask = None
        if positive_keys is not None and column_keys is not None:
            pos = positive_keys.to(q.device)
            cols = column_keys.to(q.device)
            if size > 1:
                cols, _ = gather_rows(cols, with_grad=False)
            mask = pos[:, None] == cols[None, :]
            mask[torch.arange(b, device=q.device), target] = False
        elif exclude is not None:
            mask = exclude.to(q.device)
        if mask is not None:
            logits = logits.masked_fill(mask, float("-inf"))
        loss = torch.nn.functional.cross_entropy(logits, target, reduction=reduction)
        if not self.symmetric:
            return loss
        # positives → queries: positive j's target is query j
        if size > 1:
            q_all, q_sizes = gather_rows(q, with_grad=True)
            q_offset = sum(q_sizes[:rank])
        else:
            q_all, q_offset = q, 0
        back = self.scale * (d[:b] @ q_all.T)
        back_target = torch.arange(b, device=q.device) + q_offset
        if positive_keys is not None and column_keys is not None:
            pos = positive_keys.to(q.device)
            pos_all = gather_rows(pos, with_grad=False)[0] if size > 1 else pos
            back_mask = pos[:, None] == pos_all[None, :]
            back_mask[torch.arange(b, device=q.device), back_target] = False
            back = back.masked_fill(back_mask, float("-inf"))
        elif exclude is not None:
            back = back.masked_fill(exclude[:, :b].T.to(q.device), float("-inf"))
        back_loss = torch.nn.functional.cross_entropy(back, back_target, reduction=reduction)
        return (loss + back_loss) / 2


def cached_backward(
    embed: Callable[[int, Any], torch.Tensor],
    chunks: Sequence[Sequence[Any]],
    loss_of: Callable[[list[torch.Tensor]], torch.Tensor],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """GradCache: back-propagate ``loss_of(embeddings)`` through ``embed`` one mini-batch at a time.

    ``chunks[s]`` are the mini-batches of input ``s`` (e.g. queries, documents); ``embed(s,
    chunk)`` returns the chunk's embeddings with a graph. ``loss_of`` gets one tensor per input
    (the chunks concatenated) and returns the scalar loss. Returns the loss and the embeddings
    (both detached).
    """
    states: list[list[Any]] = []
    cached: list[torch.Tensor] = []
    with torch.no_grad():
        for s, parts in enumerate(chunks):
            states.append([])
            outs = []
            for part in parts:
                states[-1].append(_rng_state())
                outs.append(embed(s, part))
            cached.append(torch.cat(outs).detach().requires_grad_(True))
    loss = loss_of(cached)
    loss.backward()
    for s, parts in enumerate(chunks):
        grad = cached[s].grad
        start = 0
        for part, state in zip(parts, states[s], strict=True):
            with _replayed(state):
                out = embed(s, part)
            out.backward(grad[start : start + out.shape[0]])
            start += out.shape[0]
    return loss.detach(), [c.detach() for c in cached]


def _rng_state() -> tuple[torch.Tensor, list[torch.Tensor]]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []
    return torch.get_rng_state(), cuda


class _replayed:
    """Run a block with a saved random state (so dropout draws the same masks), then resume."""

    def __init__(self, state: tuple[torch.Tensor, list[torch.Tensor]]) -> None:
        self.state = state

    def __enter__(self) -> None:
        self.saved = _rng_state()
        torch.set_rng_state(self.state[0])
        if self.state[1]:
            torch.cuda.set_rng_state_all(self.state[1])

    def __exit__(self, *exc: object) -> None:
        torch.set_rng_state(self.saved[0])
        if self.saved[1]:
            torch.cuda.set_rng_state_all(self.saved[1])
