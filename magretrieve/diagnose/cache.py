"""Raw embeddings computed once and shared by every diagnostic.

Diagnose scores the same texts under several modes (cosine, dot, qnorm, dnorm). Only the
side normalization differs between them, so the raw pooled vectors are encoded once here
and a :class:`ModeView` applies each mode's sides through :mod:`magretrieve.core.similarity`.
A view quacks like an :class:`~magretrieve.train.encoder.Encoder` (``embed``,
``encode_queries``, ``encode_documents``, ``similarity``), so the evaluation functions of
:mod:`magretrieve.evaluation.retrieval` run on it unchanged.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core import similarity
from magretrieve.core.config import SIDES
from magretrieve.core.errors import ConfigError


class EmbeddingCache:
    """Raw embeddings memoized per side and text, filled from ``encoder`` on demand.

    Built without an encoder (``EmbeddingCache.from_vectors``) it serves fixed vectors,
    which is how the tests feed synthetic corpora through the same code path.
    """

    def __init__(self, encoder: Any = None, *, batch_size: int = 64) -> None:
        self.encoder = encoder
        self.batch_size = batch_size
        self.store: dict[str, dict[str, np.ndarray]] = {side: {} for side in SIDES}
        self.lengths: dict[str, dict[str, int]] = {side: {} for side in SIDES}

    @classmethod
    def from_vectors(
        cls,
        queries: Mapping[str, Sequence[float]],
        documents: Mapping[str, Sequence[float]],
        lengths: Mapping[str, int] | None = None,
    ) -> EmbeddingCache:
        """A cache holding given raw vectors by text (no encoder behind it)."""
        cache = cls()
        cache.store["query"] = {t: np.asarray(v, dtype=np.float32) for t, v in queries.items()}
        cache.store["document"] = {t: np.asarray(v, dtype=np.float32) for t, v in documents.items()}
        if lengths:
            cache.lengths["document"] = dict(lengths)
        return cache

    def embed(
        self,
        texts: Sequence[str],
        side: str,
        batch_size: int | None = None,
        progress: bool | str = False,
    ) -> np.ndarray:
        """Raw vectors of ``texts`` (encoding only the ones not seen before)."""
        store = self.store[side]
        missing = list(dict.fromkeys(t for t in texts if t not in store))
        if missing:
            if self.encoder is None:
                raise ConfigError(
                    f"no {side} vector for {missing[0][:60]!r} and no encoder to embed it"
                )
            vectors = self.encoder.embed(
                missing, side, batch_size=batch_size or self.batch_size, progress=progress
            )
            store.update(zip(missing, vectors, strict=True))
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([store[t] for t in texts]).astype(np.float32)

    def token_lengths(self, texts: Sequence[str], side: str) -> list[int]:
        """Tokens the model sees (after truncation); whitespace words without a tokenizer."""
        known = self.lengths[side]
        missing = list(dict.fromkeys(t for t in texts if t not in known))
        if missing:
            if self.encoder is not None and hasattr(self.encoder, "token_lengths"):
                counts = self.encoder.token_lengths(missing, side)
            else:
                counts = [len(t.split()) for t in missing]
            known.update(zip(missing, counts, strict=True))
        return [known[t] for t in texts]

    def view(self, sim: similarity.Similarity) -> ModeView:
        """This cache seen through similarity ``sim``."""
        return ModeView(self, sim)

    # ------------------------------------------------------------------ disk

    def save(self, path: str | Path) -> Path:
        """Write the cached vectors to ``path`` (.npz) so a rerun encodes nothing twice."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = {}
        texts: dict[str, list[str]] = {}
        for side in SIDES:
            texts[side] = list(self.store[side])
            if texts[side]:
                arrays[side] = np.stack([self.store[side][t] for t in texts[side]])
        arrays["texts"] = np.frombuffer(json.dumps(texts).encode(), dtype=np.uint8)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        tmp.replace(path)
        return path

    def load(self, path: str | Path) -> bool:
        """Merge vectors saved by :meth:`save`; False when ``path`` does not exist."""
        path = Path(path)
        if not path.is_file():
            return False
        with np.load(path) as data:
            texts = json.loads(bytes(data["texts"]).decode())
            for side in SIDES:
                if texts.get(side):
                    self.store[side].update(zip(texts[side], data[side], strict=True))
        return True


class ModeView(similarity.SideVectors):
    """An :class:`EmbeddingCache` under one similarity: what a store would hold and send."""

    def __init__(self, cache: EmbeddingCache, sim: similarity.Similarity) -> None:
        self.cache = cache
        self.similarity = sim

    def embed(
        self, texts: Sequence[str], side: str, batch_size: int = 64, progress: bool | str = False
    ) -> np.ndarray:
        return self.cache.embed(texts, side, batch_size, progress)


def model_fingerprint(encoder: Any) -> str:
    """A short hash of an encoder's config and weights: the key of its embedding cache file."""
    import torch

    # the mode does not change raw vectors; everything that shapes them does
    cfg = {
        k: v
        for k, v in encoder.config.to_dict().items()
        if k not in ("mode", "gamma_q", "gamma_d", "base_model", "extra")
    }
    digest = hashlib.sha256(json.dumps(cfg, sort_keys=True).encode())
    with torch.no_grad():
        for name, tensor in encoder.state_dict().items():
            digest.update(name.encode())
            digest.update(
                tensor.detach().cpu().contiguous().view(-1).to(torch.float32).numpy().tobytes()
            )
    return digest.hexdigest()[:16]
