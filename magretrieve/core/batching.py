"""Batches by a token budget over length-sorted texts (shared by the ONNX and torch encoders).

A batch is padded to its longest text, so its cost is ``rows × longest`` tokens (plus the
attention term). Sorting texts longest first and closing a batch when ``rows × longest``
would pass the budget gives few padded tokens, and many short texts (queries, titles) per
batch instead of a fixed count sized for the longest ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from magretrieve.core.errors import ConfigError

#: Default padded-token budget per batch: the fastest budget for documents on every runtime
#: measured (benchmarks/results/batch_budget.md). Why it is small: a layer's feed-forward
#: activation is ``tokens × intermediate × 4`` bytes, and a batch whose activations fit the
#: CPU's last-level cache runs faster than a bigger one that does not. Bigger models or smaller
#: caches may want less; ``max_batch_tokens`` is the knob.
DEFAULT_BATCH_TOKENS = 2048


def token_budget_batches(
    lengths: Sequence[int], max_tokens: int | None = DEFAULT_BATCH_TOKENS, max_rows: int = 32
) -> list[np.ndarray]:
    """Index arrays into ``lengths``: longest first, each batch ``rows × longest ≤ max_tokens``.

    A batch holds at most ``max_rows`` texts and at least one (a single text longer than the
    budget is its own batch). ``max_tokens=None`` gives fixed ``max_rows`` batches over the
    same length-sorted order.
    """
    if max_rows < 1:
        raise ConfigError(f"batch_size must be at least 1, got {max_rows}")
    if max_tokens is not None and max_tokens < 1:
        raise ConfigError(f"max_batch_tokens must be at least 1, got {max_tokens}")
    n = len(lengths)
    if n == 0:
        return []
    order = np.argsort(-np.asarray(lengths, dtype=np.int64), kind="stable")
    if max_tokens is None:
        return [order[i : i + max_rows] for i in range(0, n, max_rows)]
    batches: list[np.ndarray] = []
    start = 0
    while start < n:
        longest = max(int(lengths[order[start]]), 1)  # sorted: the first row is the longest
        rows = max(1, min(max_rows, max_tokens // longest, n - start))
        batches.append(order[start : start + rows])
        start += rows
    return batches
