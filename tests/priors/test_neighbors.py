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


@pytest.mark.parametrize("method", ["grouped", "blocked", "ivf", "hnsw"])
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
    calls: list[int] = []
    real = neighbors.grouped_mean_knn

    def spy(*a, **kw):
        calls.append(len(a[0]))
        return real(*a, **kw)

    monkeypatch.setattr(neighbors, "grouped_mean_knn", spy)
    monkeypatch.setattr(neighbors, "EXACT_MAX", 1000)
    hub_scores(x, 5)  # the corpus prior's call site goes through the dispatch
    assert calls == [1200]  # IVF candidates, computed list by list
    monkeypatch.setattr(neighbors, "EXACT_MAX", 5000)
    hub_scores(x, 5)
    assert calls == [1200]  # exact below the threshold


def test_grouped_by_hand_two_lists(monkeypatch) -> None:
    """Two far-apart pairs, one list each, one probe: each document's only candidate is its
    partner (itself excluded), so the score is their cosine; probing both lists is exact."""
    a, b = np.array([1.0, 0.0, 0.0]), np.array([0.0, 0.0, 1.0])
    tilt = np.array([0.0, 0.6, 0.0])
    x = unit(np.stack([a, a + tilt, b, b + tilt]).astype(np.float32))
    lists = unit(np.stack([a + tilt / 2, b + tilt / 2]).astype(np.float32))
    monkeypatch.setattr(neighbors, "kmeans_centroids", lambda *_a, **_k: lists)
    cos_pair = float(x[0] @ x[1])  # 1 / sqrt(1.36)
    got = neighbors.grouped_mean_knn(x, 1, nprobe=1, nlist=2)
    np.testing.assert_allclose(got, [cos_pair] * 4, rtol=1e-6)
    # k = 2 with one probe: only the partner is a candidate, the mean is over what was found
    np.testing.assert_allclose(neighbors.grouped_mean_knn(x, 2, nprobe=1, nlist=2), [cos_pair] * 4)
    # both lists probed: the exact answer (partner and the nearer of the far pair)
    exact = mean_knn_similarity(x, 2, method="exact")
    np.testing.assert_allclose(
        neighbors.grouped_mean_knn(x, 2, nprobe=2, nlist=2), exact, atol=1e-6
    )


def test_kmeans_finds_separated_clusters() -> None:
    """Three tight, far-apart clusters: every list holds one cluster, its centroid the
    normalized mean of the members."""
    rng = np.random.default_rng(3)
    centres = np.eye(16, dtype=np.float32)[:3]
    x = unit(np.repeat(centres, 60, axis=0) + 0.01 * rng.normal(size=(180, 16)))  # all trained
    found = neighbors.kmeans_centroids(x, 3)
    assign = np.argmax(x @ found.T, axis=1)
    assert sorted(np.bincount(assign, minlength=3)) == [60, 60, 60]
    for c in range(3):
        members = x[assign == c]
        np.testing.assert_allclose(found[c], unit(members.sum(0, keepdims=True))[0], atol=1e-5)
    probes = neighbors.nearest_lists(x[:1], found, 3)
    np.testing.assert_array_equal(np.argsort(-(x[:1] @ found.T), axis=1), probes)


def test_grouped_probing_every_list_is_exact() -> None:
    x = clustered(900)
    exact = mean_knn_similarity(x, 7, method="exact")
    np.testing.assert_allclose(
        neighbors.grouped_mean_knn(x, 7, nlist=12, nprobe=12), exact, atol=1e-6
    )


def test_grouped_has_the_candidates_of_an_ivf_search() -> None:
    """Same lists, same probes: the grouped product finds what an IndexIVFFlat search finds."""
    import faiss

    x = clustered(3000)
    nlist, nprobe, k = 40, 3, 10
    centroids = neighbors.kmeans_centroids(x, nlist)
    quantizer = faiss.IndexFlatIP(x.shape[1])
    index = faiss.IndexIVFFlat(quantizer, x.shape[1], nlist, faiss.METRIC_INNER_PRODUCT)
    index.train(centroids)  # quantizer holds exactly these centroids (nlist points, nlist lists)
    quantizer.reset()
    quantizer.add(centroids)
    index.add(x)
    index.nprobe = nprobe
    sims, labels = index.search(x, k + 1)
    own = labels == np.arange(len(x))[:, None]
    own[~own.any(axis=1), k] = True
    ivf = sims[~own].reshape(len(x), k).mean(axis=1)
    monkey = neighbors.kmeans_centroids
    try:
        neighbors.kmeans_centroids = lambda *_a, **_k: centroids
        grouped = neighbors.grouped_mean_knn(x, k, nlist=nlist, nprobe=nprobe)
    finally:
        neighbors.kmeans_centroids = monkey
    np.testing.assert_allclose(grouped, ivf, atol=1e-5)


def test_progress_is_shown_with_tqdm(capsys) -> None:
    x = clustered(1500)
    with neighbors.progress_shown():
        mean_knn_similarity(x, 5, method="grouped")
    err = capsys.readouterr().err
    assert "hub score: k-means, probes" in err and "hub score (grouped ivf)" in err
    mean_knn_similarity(x, 5, method="grouped")
    assert "hub score" not in capsys.readouterr().err  # off by default


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
