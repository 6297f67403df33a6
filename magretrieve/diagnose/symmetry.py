"""Task symmetry: Spearman with gold under each mode, in both argument orders.

One-sided modes (qnorm, dnorm, a learnable γq ≠ γd) score s(a, b) ≠ s(b, a): on a symmetric
task (STS, deduplication, clustering) the answer depends on which sentence is "the query".
:func:`magretrieve.evaluation.retrieval.evaluate_sts` does the scoring; this module runs it per mode on
cached raw vectors, so each sentence is encoded once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from magretrieve.core import similarity
from magretrieve.data.readers import SentencePair
from magretrieve.diagnose.cache import EmbeddingCache
from magretrieve.evaluation.retrieval import evaluate_sts

MODES = ("cosine", "dot", "qnorm", "dnorm")


def symmetry_check(
    cache: EmbeddingCache,
    pairs: Sequence[SentencePair],
    *,
    name: str = "sts",
    own: similarity.Similarity | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """One row per mode: Spearman s(a,b), Spearman s(b,a), mean/max |s(a,b) − s(b,a)|, symmetric?

    ``own`` (the model's similarity) is added when it is not one of the four fixed modes.
    """
    sims = [similarity.resolve(m) for m in MODES]
    if own is not None and own.mode not in MODES:
        sims.append(own)
    texts = list(dict.fromkeys([p.a for p in pairs] + [p.b for p in pairs]))
    # encode every sentence once per side up front (with progress); modes then reuse them
    cache.embed(texts, "query", progress=progress and "STS: encoding (query side)")
    cache.embed(texts, "document", progress=progress and "STS: encoding (document side)")
    rows = []
    for sim in sims:
        res = evaluate_sts(cache.view(sim), pairs, name=name, progress=False, sim=sim).to_dict()
        res["symmetric_mode"] = sim.is_symmetric
        rows.append(res)
    return rows


def symmetry_verdict(rows: Sequence[dict[str, Any]]) -> str:
    """Plain words: which modes break symmetry and what that cost in Spearman here."""
    if not rows:
        return ""
    sym = [r for r in rows if r["symmetric_mode"]]
    one = [r for r in rows if not r["symmetric_mode"]]
    best_sym = max(sym, key=lambda r: r["spearman_ab"]) if sym else None
    parts = []
    if one:
        worst = max(one, key=lambda r: r["mean_asymmetry"])
        parts.append(
            "one-sided modes break symmetry: s(a,b) ≠ s(b,a) "
            f"(mean |s(a,b) − s(b,a)| up to {worst['mean_asymmetry']:.4f} under {worst['mode']}); "
            + ", ".join(
                f"{r['mode']} Spearman {r['spearman_ab']:.3f}/{r['spearman_ba']:.3f}" for r in one
            )
        )
    if best_sym is not None:
        parts.append(
            f"for symmetric tasks use {best_sym['mode']} (Spearman {best_sym['spearman_ab']:.3f}, "
            "asymmetry 0)"
        )
    return "; ".join(parts)
