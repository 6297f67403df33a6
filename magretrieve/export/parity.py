"""ONNX-vs-PyTorch parity: the check every export runs before anything is written.

The texts cover one-token to truncated lengths and are run in mixed-length batches (so
padding and the attention mask matter), through the *serving* path: ``OnnxEncoder``
tokenizes with the ``tokenizers`` library from the exported files, so a tokenizer,
prefix or max-length mismatch fails parity just like a graph error would.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from magretrieve.core.errors import MagRetrieveError

if TYPE_CHECKING:  # pragma: no cover
    from magretrieve.serving.onnx_encoder import OnnxEncoder
    from magretrieve.train.encoder import Encoder

#: fp32 parity bar of an export: max absolute difference and relative norm error.
MAX_ABS_DIFF = 1e-4
MAX_REL_NORM_ERR = 1e-5

_LONG = (
    "Statin therapy lowers low-density lipoprotein cholesterol and reduces cardiovascular "
    "mortality in patients at high risk; the effect on all-cause mortality in primary "
    "prevention is smaller and depends on baseline risk, age and dose. "
)
PARITY_TEXTS: tuple[str, ...] = (
    "a",
    "what causes heart disease?",
    "Aspirin",
    "does vitamin d reduce the risk of cancer in older adults",
    "boundary layer flow over a swept wing at high speed",
    _LONG,
    "mice lacking the gene show increased brain protein levels",
    _LONG * 12,  # longer than any max length: exercises truncation
    "x",
    "Smoking, lung cancer & kidney damage: a 10-year cohort study (n=1,204).",
    "UNUSUAL CASE and ünïcödé text — with dashes",
    "low dose",
)
#: Batch sizes the texts are run in: single texts, a ragged batch of 5, all at once.
PARITY_BATCH_SIZES: tuple[int, ...] = (1, 5, len(PARITY_TEXTS))


class ParityError(MagRetrieveError):
    """An exported graph does not reproduce the PyTorch encoder within tolerance."""


def compare(reference: np.ndarray, candidate: np.ndarray) -> dict[str, float]:
    """Max abs difference, max relative norm error, min/mean cosine of two vector sets."""
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    ref_norm = np.linalg.norm(ref, axis=1)
    cand_norm = np.linalg.norm(cand, axis=1)
    rel = np.abs(cand_norm - ref_norm) / np.maximum(ref_norm, 1e-12)
    cos = np.sum(ref * cand, axis=1) / np.maximum(ref_norm * cand_norm, 1e-12)
    return {
        "max_abs_diff": float(np.max(np.abs(ref - cand))),
        "max_rel_norm_err": float(np.max(rel)),
        "mean_rel_norm_err": float(np.mean(rel)),
        "min_cosine": float(np.min(cos)),
        "mean_cosine": float(np.mean(cos)),
    }


def reference_vectors(encoder: Encoder, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """The PyTorch encoder's query and document vectors (what the graphs must reproduce).

    A model whose vectors hold NaN or inf (NaN weights, an overflowing layer) is refused
    here: an export of it would be a store full of NaN.
    """
    from magretrieve.core.errors import ConfigError

    vectors = {
        "query": encoder.encode_queries(list(texts), batch_size=len(texts)),
        "document": encoder.encode_documents(list(texts), batch_size=len(texts)),
    }
    for side, vecs in vectors.items():
        bad = ~np.isfinite(np.asarray(vecs, dtype=np.float64)).all(axis=1)
        if bad.any():
            raise ConfigError(
                f"the model's {side} vectors contain NaN or inf (parity text "
                f"{texts[int(np.flatnonzero(bad)[0])][:40]!r}, {int(bad.sum())} of {len(texts)}): "
                "its weights hold NaN/inf or a layer overflows; nothing was exported"
            )
    return vectors


def measure(
    encoder: Encoder | dict[str, np.ndarray],
    onnx_encoder: OnnxEncoder,
    texts: Sequence[str] = PARITY_TEXTS,
    batch_sizes: Sequence[int] = PARITY_BATCH_SIZES,
) -> dict[str, Any]:
    """Worst-case agreement per side over every batch size (reference: an Encoder or vectors)."""
    reference = encoder if isinstance(encoder, dict) else reference_vectors(encoder, texts)
    report: dict[str, Any] = {}
    for side in ("query", "document"):
        encode = onnx_encoder.encode_queries if side == "query" else onnx_encoder.encode_documents
        worst: dict[str, float] = {}
        for bs in batch_sizes:
            stats = compare(reference[side], encode(list(texts), batch_size=bs))
            for key, value in stats.items():
                better_low = not key.endswith("cosine")
                if key in worst and np.isnan(worst[key]):
                    continue  # NaN is the worst value there is: keep it
                if (
                    key not in worst
                    or np.isnan(value)
                    or (value > worst[key] if better_low else value < worst[key])
                ):
                    worst[key] = value
        report[side] = worst
    # np.max propagates NaN (the builtin max would drop it)
    for key in ("max_abs_diff", "max_rel_norm_err"):
        report[key] = float(np.max([report[s][key] for s in ("query", "document")]))
    return report


def check(report: dict[str, Any], where: str) -> None:
    """Raise :class:`ParityError` unless a parity report is within the fp32 tolerances.

    Written as "not within" so that NaN (which compares false with everything) fails.
    """
    within = (
        report["max_abs_diff"] <= MAX_ABS_DIFF and report["max_rel_norm_err"] <= MAX_REL_NORM_ERR
    )
    if not within:
        raise ParityError(
            f"{where}: ONNX output differs from PyTorch (max abs diff "
            f"{report['max_abs_diff']:.3g} > {MAX_ABS_DIFF:g} or relative norm error "
            f"{report['max_rel_norm_err']:.3g} > {MAX_REL_NORM_ERR:g}); nothing was written"
        )
