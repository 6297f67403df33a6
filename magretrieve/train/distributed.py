"""Training across processes: the process group ``torchrun`` describes, and what ranks share.

Used by the trainer (:mod:`magretrieve.train.trainer`) and the loss
(:mod:`magretrieve.train.losses`, which all-gathers across ranks). Outside ``torchrun`` every
function here is a no-op or reports one rank, so the single-process path needs no branches.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
import torch.distributed as dist


def world() -> tuple[int, int]:
    """(rank, world size) of the initialized process group, or (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def init_distributed() -> tuple[int, int, str | None]:
    """Join the process group ``torchrun`` describes (``WORLD_SIZE`` > 1): gloo on CPU, NCCL on
    GPUs (one per process, by ``LOCAL_RANK``). Returns (rank, world size, this rank's device or
    None). Without torchrun it does nothing and returns (0, 1, None).
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1, None
    device = None
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, size = world()
    return rank, size, device


def finish_distributed() -> None:
    """Leave the process group :func:`init_distributed` joined (nothing to do without one)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def data_parallel(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` inside DistributedDataParallel across ranks (which also copies rank 0's
    weights to every rank), or ``model`` itself in a single process."""
    if world()[1] <= 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    # find_unused_parameters: BERT's pooler (and a frozen side's stages) get no gradient
    return DistributedDataParallel(model, device_ids=ids, find_unused_parameters=True)


def average_gradients(params: Sequence[torch.nn.Parameter], size: int) -> None:
    """Average each parameter's gradient over ``size`` ranks in place (for backward passes
    that ran under DistributedDataParallel's ``no_sync``)."""
    for p in params:
        if p.grad is None:  # unused on every rank alike (same graph), e.g. BERT's pooler
            continue
        dist.all_reduce(p.grad)
        p.grad /= size
