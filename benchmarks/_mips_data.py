"""Shared by mips_scale.py and the ann_tuning_queries study: synthetic magnitude-keeping vectors
shaped like the MiniLM qnorm passages, exact inner-product top-k, recall@k."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from magretrieve.core.topk import exact_search

K = 10


@dataclass
class Mixture:
    """A mixture over unit directions with per-cluster norm samples (see the module docstring)."""

    means: np.ndarray  # (C, d) mean of the member directions (not renormalized)
    stds: np.ndarray  # (C, d) per-dimension std of the member directions
    weights: np.ndarray  # (C,)
    norms: list[np.ndarray] = field(default_factory=list)  # measured norms per cluster

    @classmethod
    def fit(cls, docs: np.ndarray, clusters: int, seed: int = 0) -> Mixture:
        import faiss

        norms = np.linalg.norm(docs, axis=1)
        units = (docs / norms[:, None]).astype(np.float32)
        km = faiss.Kmeans(units.shape[1], clusters, niter=20, seed=seed, spherical=True)
        km.train(units)
        _, assign = km.index.search(units, 1)
        assign = assign.ravel()
        means, stds, weights, per = [], [], [], []
        for c in range(clusters):
            member = units[assign == c]
            if len(member) < 2:
                continue
            means.append(member.mean(axis=0))
            stds.append(member.std(axis=0))
            weights.append(len(member))
            per.append(norms[assign == c])
        w = np.asarray(weights, dtype=np.float64)
        return cls(np.asarray(means), np.asarray(stds), w / w.sum(), per)

    def sample(self, n: int, seed: int, chunk: int = 100_000) -> np.ndarray:
        rng = np.random.default_rng(seed)
        d = self.means.shape[1]
        out = np.empty((n, d), dtype=np.float32)
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            c = rng.choice(len(self.weights), size=m, p=self.weights)
            x = self.means[c] + self.stds[c] * rng.standard_normal((m, d))
            x /= np.linalg.norm(x, axis=1, keepdims=True)
            r = np.fromiter(
                (self.norms[ci][rng.integers(len(self.norms[ci]))] for ci in c),
                dtype=np.float64,
                count=m,
            )
            r *= np.exp(rng.normal(0.0, 0.02, size=m))
            out[start : start + m] = (x * r[:, None]).astype(np.float32)
        return out


def exact_topk(queries: np.ndarray, docs: np.ndarray, k: int = K) -> np.ndarray:
    """Row indices of the exact top-k inner products, best first (the package's own
    :func:`magretrieve.core.topk.exact_search`: ties go to the lower row)."""
    return exact_search(queries, docs, k)[0]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(
        np.mean([len(set(f[:K]) & set(t[:K])) / K for f, t in zip(found, truth, strict=True)])
    )
