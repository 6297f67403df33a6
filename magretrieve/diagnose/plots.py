"""PNG plots of the diagnostics (matplotlib, Agg backend: no display needed).

Each function writes one figure and returns its path. Every plot has a title, axis labels
with units, and a legend, so it reads on its own in a report.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

DPI = 110


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def norm_histograms(
    relevant: np.ndarray, nonrelevant: np.ndarray, cohens_d: float, path: Path, title: str
) -> Path:
    """Density histograms of raw ‖d‖ for relevant vs non-relevant documents in the top-100."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    both = (
        np.concatenate([relevant, nonrelevant]) if relevant.size + nonrelevant.size else np.zeros(1)
    )
    lo, hi = np.percentile(both, [0.5, 99.5]) if both.size > 1 else (0, 1)
    if hi <= lo:
        lo, hi = lo - 0.5, hi + 0.5
    bins = np.linspace(lo, hi, 40)
    ax.hist(
        nonrelevant,
        bins=bins,
        density=True,
        alpha=0.55,
        color="tab:gray",
        label=f"non-relevant in top-100 (n={nonrelevant.size}, mean {np.mean(nonrelevant) if nonrelevant.size else float('nan'):.3f})",
    )
    ax.hist(
        relevant,
        bins=bins,
        density=True,
        alpha=0.6,
        color="tab:orange",
        label=f"relevant (n={relevant.size}, mean {np.mean(relevant) if relevant.size else float('nan'):.3f})",
    )
    ax.set_xlabel("raw document norm ‖d‖")
    ax.set_ylabel("density")
    ax.set_title(f"{title}\nCohen's d = {cohens_d:.2f}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def norm_length_scatter(
    lengths: np.ndarray,
    norms: np.ndarray,
    pearson: float,
    spearman: float,
    path: Path,
    title: str,
    max_points: int = 5000,
) -> Path:
    """Raw ‖d‖ against the number of tokens the model saw, with the two correlations."""
    plt = _plt()
    rng = np.random.default_rng(0)
    keep = rng.choice(len(norms), size=min(max_points, len(norms)), replace=False)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    small = keep.size < 500
    ax.scatter(
        lengths[keep],
        norms[keep],
        s=18 if small else 5,
        alpha=0.7 if small else 0.35,
        color="tab:blue",
        edgecolors="none",
        label=f"documents (showing {keep.size} of {len(norms)})",
    )
    ax.set_xlabel("document length (tokens after truncation)")
    ax.set_ylabel("raw document norm ‖d‖")
    corr = (
        f"Pearson r = {pearson:.2f}, Spearman ρ = {spearman:.2f}"
        if np.isfinite(pearson)
        else "correlation undefined (constant length or norm)"
    )
    ax.set_title(f"{title}\n{corr}", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def score_decomposition(
    hits: Mapping[str, np.ndarray], path: Path, title: str, max_points: int = 6000
) -> Path:
    """Top hits placed by cos θ (x) and raw ‖d‖ (y): qnorm/dot scores grow with both."""
    plt = _plt()
    cos, norm, rel = hits["cosine"], hits["doc_norm"], hits["relevant"].astype(bool)
    rng = np.random.default_rng(0)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for mask, color, label, size in (
        (~rel, "tab:gray", "non-relevant", 6),
        (rel, "tab:orange", "relevant", 14),
    ):
        idx = np.flatnonzero(mask)
        if idx.size > max_points:
            idx = rng.choice(idx, size=max_points, replace=False)
        ax.scatter(
            cos[idx],
            norm[idx],
            s=size,
            alpha=0.5,
            color=color,
            edgecolors="none",
            label=f"{label} (n={int(mask.sum())})",
        )
    # iso-score lines of ‖d‖·cos θ (the qnorm score; dot adds the constant ‖q‖ per query)
    if cos.size:
        xs = np.linspace(max(cos.min(), 1e-3), cos.max(), 100)
        for level in np.percentile(cos * norm, [10, 50, 90]):
            ax.plot(xs, level / xs, color="tab:blue", lw=0.8, ls="--", alpha=0.6)
        ax.plot(
            [],
            [],
            color="tab:blue",
            lw=0.8,
            ls="--",
            label="equal ‖d‖·cos θ (qnorm score; 10th/50th/90th pct)",
        )
        ax.set_ylim(norm.min() * 0.97, norm.max() * 1.03)
        ax.set_xlim(cos.min() - 0.02, cos.max() + 0.02)
    ax.set_xlabel("cos θ (query, document)")
    ax.set_ylabel("raw document norm ‖d‖")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def training_curves(log: Mapping[str, Any], path: Path, title: str) -> Path:
    """γq, γd and mean raw query/document norms over the steps of a training log."""
    plt = _plt()
    steps = [s["step"] for s in log.get("steps", [])]
    get = lambda key: [s.get(key, float("nan")) for s in log.get("steps", [])]  # noqa: E731
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(steps, get("gamma_q"), label="γq (query)", color="tab:blue")
    ax1.plot(steps, get("gamma_d"), label="γd (document)", color="tab:orange", ls="--")
    ax1.set_ylim(-0.05, 1.05)
    ax1.set_xlabel("training step")
    ax1.set_ylabel("γ (1 = normalized, 0 = raw)")
    ax1.set_title("normalization exponents", fontsize=10)
    ax1.legend(fontsize=8)
    window = max(1, len(steps) // 15)
    for key, color, label in (
        ("mean_query_norm", "tab:blue", "mean ‖q‖ (batch)"),
        ("mean_doc_norm", "tab:orange", "mean ‖d⁺‖ (batch)"),
    ):
        values = np.asarray(get(key), dtype=float)
        if window > 1:
            ax2.plot(steps, values, color=color, alpha=0.25, lw=0.8)
            smooth = np.convolve(values, np.ones(window) / window, mode="valid")
            ax2.plot(
                steps[window - 1 :],
                smooth,
                color=color,
                label=f"{label}, rolling mean of {window} steps",
            )
        else:
            ax2.plot(steps, values, color=color, label=label)
    ax2.set_xlabel("training step")
    ax2.set_ylabel("raw norm")
    ax2.set_title("mean raw norms", fontsize=10)
    ax2.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def symmetry_bars(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Spearman with gold per mode in both orders, plus the mean asymmetry."""
    plt = _plt()
    modes = [r["mode"] for r in rows]
    x = np.arange(len(modes))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.bar(x - 0.18, [r["spearman_ab"] for r in rows], 0.36, label="s(a, b)", color="tab:blue")
    ax1.bar(x + 0.18, [r["spearman_ba"] for r in rows], 0.36, label="s(b, a)", color="tab:orange")
    ax1.set_xticks(x, modes)
    ax1.set_ylabel("Spearman ρ with gold")
    ax1.set_title("STS Spearman, both orders", fontsize=10)
    ax1.legend(fontsize=8)
    asym = [r["mean_asymmetry"] for r in rows]
    bars = ax2.bar(x, asym, 0.5, color="tab:red")
    ax2.bar_label(bars, labels=[f"{a:.3g}" for a in asym], fontsize=8)
    ax2.set_ylim(0, max(max(asym) * 1.15, 1e-6))
    ax2.set_xticks(x, modes)
    ax2.set_ylabel("mean |s(a,b) − s(b,a)|")
    ax2.set_title("asymmetry (0 for symmetric modes)", fontsize=10)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path
