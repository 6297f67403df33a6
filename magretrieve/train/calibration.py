"""Norm calibration: divide raw vectors by the training corpus's mean document norm.

An encoder pretrained through a ``Normalize`` layer has raw norms of 2–4 (all-MiniLM-L6-v2:
about 2.2 on scifact). Under qnorm/dot, InfoNCE logits are ``scale · cos · ‖d‖``, so the first
steps run at an effective temperature several times colder than cosine's and the gradients
explode. Dividing every raw vector by ``c = mean ‖d‖`` (measured once, on the training
corpus, before training) puts step-1 logits at cosine's temperature while keeping the
*relative* magnitudes the mode is meant to learn from.

``c`` is stored as :attr:`EncoderConfig.norm_scale`; ``Encoder.forward`` divides by it, so
the exported graphs (which call ``forward``) and the manifest's ``norm_scale`` carry it
without any further code.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from magretrieve.core.errors import ConfigError, DataError

if TYPE_CHECKING:  # pragma: no cover
    from magretrieve.train.encoder import Encoder

logger = logging.getLogger(__name__)

#: Documents encoded to measure c (a random sample; the mean norm converges fast).
DEFAULT_SAMPLE = 1000


def mean_document_norm(
    encoder: Encoder,
    documents: Sequence[str],
    *,
    sample: int | None = DEFAULT_SAMPLE,
    seed: int = 0,
    batch_size: int = 64,
    progress: bool = False,
) -> float:
    """Mean raw (pre-calibration, pre-head) pooled norm of ``documents`` (a seeded sample)."""
    docs = list(dict.fromkeys(documents))  # unique, order kept
    if not docs:
        raise DataError("norm calibration needs at least one document")
    if sample is not None and len(docs) > sample:
        docs = random.Random(seed).sample(docs, sample)
    previous = (encoder.config.norm_scale, encoder.norm_head)
    encoder.config.norm_scale, encoder.norm_head = 1.0, None  # measure the raw encoder
    try:
        raw = encoder.embed(docs, "document", batch_size=batch_size, progress=progress)
    finally:
        encoder.config.norm_scale, encoder.norm_head = previous
    norms = np.linalg.norm(raw, axis=1)
    c = float(norms.mean())
    if not (c > 0 and np.isfinite(c)):
        raise ConfigError(
            f"norm calibration measured a mean document norm of {c}; cannot divide by it"
        )
    return c


def calibrate(
    encoder: Encoder,
    documents: Sequence[str],
    *,
    sample: int | None = DEFAULT_SAMPLE,
    seed: int = 0,
    progress: bool = False,
) -> float:
    """Measure ``c`` on ``documents`` and store it as the encoder's ``norm_scale``; returns c.

    Call once before training: the training loop, evaluation, ``save`` and the export all
    read ``config.norm_scale``.
    """
    c = mean_document_norm(encoder, documents, sample=sample, seed=seed, progress=progress)
    encoder.config.norm_scale = c
    encoder.config.extra["norm_calibration"] = {
        "mean_document_norm": c,
        "documents": min(len(set(documents)), sample or len(set(documents))),
        "seed": seed,
    }
    logger.info("norm calibration: c = %.4f (raw vectors are divided by it)", c)
    return c
