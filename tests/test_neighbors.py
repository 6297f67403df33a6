"""Hub scores by approximate k-NN agree with the exact O(n²) path (magretrieve.priors.neighbors)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from magretrieve.core.errors import ConfigError, DataError
from magretrieve.priors import neighbors
from magretrieve.priors.base import unit
from magretrieve.priors.hub import hub_scores
from magretrieve.priors.neighbors import approximate_mean_knn, mean_knn_similarity


def clustered(n: int, dim: int = 32, topics: int = 40, seed: int = 0) -> np.ndarray:
    """Unit vectors around ``topics`` centres with uneven spread: documents of tight topics
    are hubs, those of loose ones are not (the structure the hub score measures)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(topics, dim))
    spread = rng.uniform(0.3, 1.5, size=topics)
    which = rng.integers(0, topics, n)
    return unit(centres[which] + rng.normal(size=(n, dim)) * spread[which, None])


def test_exact_path_matches_hand_values() -> None:
    d = np.array([[1.0, 0.0], [0.0, 1.0], [np.sqrt(0.5), np.sqrt(0.5)]], dtype=np.float32)
    for method in ("exact", "auto"):
        np.testing.assert_allclose(
            mean_knn_similarity(d, 2, method=method), [0.35355339, 0.35355339, 0.70710677]
        )


@pytest.mark.parametrize("method", ["blocked", "ivf", "hnsw"])
def test_approximate_paths_agree_with_exact(method: str) -> None:
    x = clustered(4000)
    exact = mean_knn_similarity(x, 10, method="exact")
    approx = mean_knn_similarity(x, 10, method=method)
    assert spearmanr(exact, approx)[0] > 0.99
    # an approximate neighbour is never closer than the true k-th: the mean can only drop
    assert (approx <= exact + 1e-5).all()
    assert np.abs(approx - exact).mean() < 0.01


def test_auto_switches_to_the_approximate_path_above_the_threshold(monkeypatch) -> None:
    x = clustered(1200)
    calls: list[str] = []
    real = neighbors.approximate_mean_knn

    def spy(*a, **kw):
        calls.append(kw["method"])
        return real(*a, **kw)

    monkeypatch.setattr(neighbors, "approximate_mean_knn", spy)
    monkeypatch.setattr(neighbors, "EXACT_MAX", 1000)
    hub_scores(x, 5)  # the corpus prior's call site goes through the dispatch
    assert calls == ["ivf"]  # FAISS IndexIVFFlat: the path that met Spearman ≥ 0.99 at 200k
    monkeypatch.setattr(neighbors, "EXACT_MAX", 5000)
    hub_scores(x, 5)
    assert calls == ["ivf"]  # exact below the threshold


def test_streamed_source_equals_the_array() -> None:
    x = clustered(3000)

    def chunks():
        for start in range(0, len(x), 700):  # blocks that do not divide n
            yield x[start : start + 700]

    from_array = approximate_mean_knn(x, 10, chunk=700)
    streamed = approximate_mean_knn(chunks, 10, n=len(x), chunk=700)
    np.testing.assert_allclose(streamed, from_array, rtol=1e-6)


def test_bad_input() -> None:
    x = clustered(50)
    with pytest.raises(DataError, match="at least 2 documents"):
        mean_knn_similarity(x[:1], 3)
    with pytest.raises(ConfigError, match="unknown k-NN method 'annoy'"):
        mean_knn_similarity(x, 3, method="annoy")
    with pytest.raises(ConfigError, match="needs n"):
        approximate_mean_knn(lambda: iter([x]), 3)
    with pytest.raises(DataError, match="yielded 50 vectors, expected 60"):
        approximate_mean_knn(lambda: iter([x]), 3, n=60)
