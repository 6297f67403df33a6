"""The similarity family against hand-computed numbers, and numpy against its torch twin.

Hand-made vectors: q = (3, 4) with ‖q‖ = 5; d1 = (1, 0) with ‖d1‖ = 1; d2 = (0, 2) with
‖d2‖ = 2; d3 = (6, 8) with ‖d3‖ = 10. Raw dot products: q·d1 = 3, q·d2 = 8, q·d3 = 50.
cos(q, d1) = 3/5 = 0.6, cos(q, d2) = 8/10 = 0.8, cos(q, d3) = 50/50 = 1.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from magretrieve.core import similarity as sim
from magretrieve.core.errors import ConfigError, MagRetrieveError
from magretrieve.train import torch_similarity

Q = np.array([[3.0, 4.0]], dtype=np.float32)
D = np.array([[1.0, 0.0], [0.0, 2.0], [6.0, 8.0]], dtype=np.float32)

# score = ‖q‖^(1−γq) · ‖d‖^(1−γd) · cos θ, written out per mode:
EXPECTED = {
    # cos θ: 0.6, 0.8, 1
    "cosine": [0.6, 0.8, 1.0],
    # raw q·d: 3, 8, 50
    "dot": [3.0, 8.0, 50.0],
    # q̂·d = ‖d‖cos θ: 1·0.6, 2·0.8, 10·1
    "qnorm": [0.6, 1.6, 10.0],
    # q·d̂ = ‖q‖cos θ: 5·0.6, 5·0.8, 5·1
    "dnorm": [3.0, 4.0, 5.0],
}


@pytest.mark.parametrize("mode", list(EXPECTED))
def test_each_fixed_mode_matches_hand_computed_scores(mode: str) -> None:
    scores = sim.score_matrix(Q, D, sim.resolve(mode))
    assert scores.shape == (1, 3)
    np.testing.assert_allclose(scores[0], EXPECTED[mode], rtol=1e-6)


def test_learnable_half_gammas_hand_computed() -> None:
    # γq = γd = 0.5: score = √‖q‖ · √‖d‖ · cos θ = √5·(1·0.6, √2·0.8, √10·1)
    s = sim.score_matrix(Q, D, sim.resolve("learnable", 0.5, 0.5))[0]
    r5 = math.sqrt(5.0)
    expected = [r5 * 1.0 * 0.6, r5 * math.sqrt(2.0) * 0.8, r5 * math.sqrt(10.0) * 1.0]
    np.testing.assert_allclose(s, expected, rtol=1e-6)
    # learnable default starts at the paper's 0.5
    assert sim.resolve("learnable").gamma_q == 0.5
    assert sim.resolve("learnable").gamma_d == 0.5


@pytest.mark.parametrize(
    ("gammas", "mode"),
    [((1.0, 0.0), "qnorm"), ((1.0, 1.0), "cosine"), ((0.0, 0.0), "dot"), ((0.0, 1.0), "dnorm")],
)
def test_learnable_at_corner_equals_fixed_mode(gammas: tuple[float, float], mode: str) -> None:
    rng = np.random.default_rng(3)
    q = rng.normal(size=(4, 8)).astype(np.float32) * 3
    d = rng.normal(size=(7, 8)).astype(np.float32) * 2
    learn = sim.score_matrix(q, d, sim.resolve("learnable", *gammas))
    fixed = sim.score_matrix(q, d, sim.resolve(mode))
    np.testing.assert_allclose(learn, fixed, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        sim.score_matrix(Q, D, sim.resolve("learnable", *gammas))[0], EXPECTED[mode], rtol=1e-6
    )


def test_ranking_equivalences_for_a_fixed_query() -> None:
    rng = np.random.default_rng(0)
    q = rng.normal(size=(5, 16)).astype(np.float32)
    # documents with widely different norms so magnitude matters for dot/qnorm
    d = rng.normal(size=(40, 16)).astype(np.float32) * rng.uniform(0.1, 10, size=(40, 1)).astype(
        np.float32
    )
    s = {m: sim.score_matrix(q, d, sim.resolve(m)) for m in sim.FIXED_GAMMAS}
    for i in range(len(q)):
        np.testing.assert_array_equal(np.argsort(-s["cosine"][i]), np.argsort(-s["dnorm"][i]))
        np.testing.assert_array_equal(np.argsort(-s["qnorm"][i]), np.argsort(-s["dot"][i]))
    # and the two families really differ on these data (otherwise the test proves nothing)
    assert any(
        not np.array_equal(np.argsort(-s["cosine"][i]), np.argsort(-s["dot"][i])) for i in range(5)
    )


def test_hand_example_ranking_differs_between_families() -> None:
    # cosine orders d3 > d2 > d1 (1 > 0.8 > 0.6); so does dot here, but with d2 scaled
    # down to (0, 0.1) dot gives q·d2 = 0.4 < 3 = q·d1, while cosine keeps 0.8 > 0.6.
    d = np.array([[1.0, 0.0], [0.0, 0.1]], dtype=np.float32)
    assert list(np.argsort(-sim.score_matrix(Q, d, sim.resolve("cosine"))[0])) == [1, 0]
    assert list(np.argsort(-sim.score_matrix(Q, d, sim.resolve("dnorm"))[0])) == [1, 0]
    assert list(np.argsort(-sim.score_matrix(Q, d, sim.resolve("dot"))[0])) == [0, 1]
    assert list(np.argsort(-sim.score_matrix(Q, d, sim.resolve("qnorm"))[0])) == [0, 1]


@pytest.mark.parametrize("gamma", [0.0, 0.25, 0.5, 0.8, 1.0])
def test_partial_normalize_norm_is_power(gamma: float) -> None:
    x = np.array([[3.0, 4.0], [0.0, 0.5], [6.0, 8.0]], dtype=np.float32)
    out = sim.partial_normalize(x, gamma)
    norms = np.array([5.0, 0.5, 10.0])
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), norms ** (1 - gamma), rtol=1e-6)
    # direction unchanged: out is a positive multiple of x
    np.testing.assert_allclose(
        out / np.linalg.norm(out, axis=1, keepdims=True), x / norms[:, None], rtol=1e-6
    )
    # input untouched
    assert x[0, 0] == 3.0


def test_partial_normalize_hand_value() -> None:
    # (3,4)/5^0.5 = (3/√5, 4/√5) = (1.3416.., 1.7888..)
    out = sim.partial_normalize(np.array([3.0, 4.0]), 0.5)
    np.testing.assert_allclose(out, [3 / math.sqrt(5), 4 / math.sqrt(5)], rtol=1e-6)
    assert out.dtype == np.float32


def test_document_and_query_vectors_follow_their_own_side() -> None:
    s = sim.resolve("qnorm")  # γq = 1, γd = 0
    np.testing.assert_allclose(sim.query_vectors(Q, s), [[0.6, 0.8]], rtol=1e-6)
    np.testing.assert_allclose(sim.document_vectors(D, s), D)
    s = sim.resolve("dnorm")  # γq = 0, γd = 1
    np.testing.assert_allclose(sim.query_vectors(Q, s), Q)
    np.testing.assert_allclose(sim.document_vectors(D, s), [[1, 0], [0, 1], [0.6, 0.8]], rtol=1e-6)
    # score_matrix is exactly the inner product of these stored vectors
    for mode in sim.MODES:
        r = sim.resolve(mode)
        np.testing.assert_allclose(
            sim.score_matrix(Q, D, r),
            sim.query_vectors(Q, r) @ sim.document_vectors(D, r).T,
            rtol=1e-6,
        )


def test_decompose_reconstructs_score() -> None:
    r = sim.resolve("qnorm")
    qv = sim.query_vectors(Q, r)[0]  # (0.6, 0.8), norm 1
    dv = sim.document_vectors(D, r)  # raw, norms 1, 2, 10
    parts = sim.decompose(qv, dv)
    np.testing.assert_allclose(parts["score"], [0.6, 1.6, 10.0], rtol=1e-6)
    np.testing.assert_allclose(parts["query_norm"], [1.0, 1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(parts["doc_norm"], [1.0, 2.0, 10.0], rtol=1e-6)
    np.testing.assert_allclose(parts["cosine"], [0.6, 0.8, 1.0], rtol=1e-6)
    np.testing.assert_allclose(
        parts["query_norm"] * parts["doc_norm"] * parts["cosine"], parts["score"], rtol=1e-6
    )
    # random vectors too
    rng = np.random.default_rng(1)
    qv, dv = rng.normal(size=8), rng.normal(size=(6, 8)) * 4
    p = sim.decompose(qv, dv)
    np.testing.assert_allclose(p["query_norm"] * p["doc_norm"] * p["cosine"], p["score"], rtol=1e-5)
    np.testing.assert_allclose(p["score"], dv @ qv, rtol=1e-5)


def test_is_symmetric() -> None:
    assert sim.is_symmetric("cosine") and sim.is_symmetric("dot")
    assert not sim.is_symmetric("qnorm") and not sim.is_symmetric("dnorm")
    assert sim.is_symmetric(sim.resolve("learnable", 0.3, 0.3))
    assert not sim.is_symmetric(sim.resolve("learnable", 0.3, 0.7))
    assert sim.resolve("learnable").is_symmetric  # 0.5 / 0.5


def test_contracts_and_ranks_like() -> None:
    assert sim.resolve("qnorm").query_contract == "unit_norm"
    assert sim.resolve("qnorm").document_contract == "magnitude_keeping"
    assert sim.resolve("dnorm").document_contract == "unit_norm"
    assert sim.resolve("dnorm").ranks_like == "cosine"
    assert sim.resolve("qnorm").ranks_like == "dot"
    assert sim.resolve("learnable", 0.2, 0.4).ranks_like == "learnable"
    assert sim.resolve("dot").to_dict() == {"mode": "dot", "gamma_q": 0.0, "gamma_d": 0.0}


def test_resolve_accepts_matching_gammas_and_case() -> None:
    assert sim.resolve("qnorm", 1.0, 0.0) == sim.Similarity("qnorm", 1.0, 0.0)
    assert sim.resolve("COSINE").mode == "cosine"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("euclid",), "unknown mode 'euclid'"),
        (("",), "unknown mode"),
        ((None,), "unknown mode"),
        (("learnable", 1.5, 0.5), "gamma_q must lie in [0, 1], got 1.5"),
        (("learnable", 0.5, -0.1), "gamma_d must lie in [0, 1], got -0.1"),
        (("learnable", float("nan"), 0.5), "gamma_q must lie in [0, 1], got nan"),
        (("learnable", 0.5, float("inf")), "gamma_d must lie in [0, 1]"),
        (("learnable", "abc", 0.5), "gamma_q must be a number"),
        (("qnorm", 0.0, None), "mode 'qnorm' fixes gamma_q=1.0"),
        (("cosine", None, 0.5), "mode 'cosine' fixes gamma_d=1.0"),
        (("dot", 2.0, None), "gamma_q must lie in [0, 1]"),
    ],
)
def test_resolve_errors(args: tuple, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        sim.resolve(*args)
    assert needle in str(info.value)
    assert isinstance(info.value, MagRetrieveError)


def test_unknown_mode_lists_choices() -> None:
    with pytest.raises(ConfigError, match="cosine, dot, qnorm, dnorm, learnable"):
        sim.resolve("l2")


@pytest.mark.parametrize("mode", sim.MODES)
def test_zero_vectors_do_not_produce_nan(mode: str) -> None:
    r = sim.resolve(mode, 0.3, 0.6) if mode == "learnable" else sim.resolve(mode)
    q = np.zeros((2, 4), dtype=np.float32)
    q[1] = [1, 2, 3, 4]
    d = np.zeros((3, 4), dtype=np.float32)
    d[2] = [1, 0, 0, 0]
    s = sim.score_matrix(q, d, r)
    assert np.isfinite(s).all()
    # a zero vector scores 0 against everything
    assert (s[0] == 0).all() and (s[:, :2] == 0).all()
    assert np.isfinite(sim.partial_normalize(d, 1.0)).all()
    p = sim.decompose(np.zeros(4), d)
    for v in p.values():
        assert np.isfinite(v).all()
    t = torch_similarity.score_matrix_torch(
        torch.from_numpy(q), torch.from_numpy(d), r.gamma_q, r.gamma_d
    )
    assert torch.isfinite(t).all()


# ----------------------------------------------------------------------------- torch twins


@pytest.mark.parametrize("mode", sim.MODES)
def test_numpy_and_torch_agree(mode: str) -> None:
    r = sim.resolve(mode, 0.35, 0.8) if mode == "learnable" else sim.resolve(mode)
    rng = np.random.default_rng(7)
    q = (rng.normal(size=(6, 12)) * 3).astype(np.float32)
    d = (rng.normal(size=(9, 12)) * rng.uniform(0.2, 5, size=(9, 1))).astype(np.float32)
    expected = sim.score_matrix(q, d, r)
    got = torch_similarity.score_matrix_torch(
        torch.from_numpy(q), torch.from_numpy(d), r.gamma_q, r.gamma_d
    )
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5, atol=1e-6)
    # γ as a tensor gives the same numbers
    got_t = torch_similarity.score_matrix_torch(
        torch.from_numpy(q),
        torch.from_numpy(d),
        torch.tensor(r.gamma_q),
        torch.tensor(r.gamma_d),
    )
    np.testing.assert_allclose(got_t.numpy(), expected, rtol=1e-5, atol=1e-6)
    for g in (r.gamma_q, torch.tensor(r.gamma_q)):
        np.testing.assert_allclose(
            torch_similarity.partial_normalize_torch(torch.from_numpy(q), g).numpy(),
            sim.partial_normalize(q, r.gamma_q),
            rtol=1e-5,
            atol=1e-6,
        )


def test_torch_hand_values() -> None:
    s = torch_similarity.score_matrix_torch(
        torch.tensor([[3.0, 4.0]]), torch.from_numpy(D), 1.0, 0.0
    )
    np.testing.assert_allclose(s.numpy()[0], EXPECTED["qnorm"], rtol=1e-6)


def test_gradient_wrt_gamma_is_minus_log_norm_times_score() -> None:
    # ∂s/∂γq = −ln‖q‖·s and ∂s/∂γd = −ln‖d‖·s (method.md). q = (3,4), d = (0,2), γ = 0.5 each:
    # s = √5·√2·0.8 = 2.5298; ∂s/∂γq = −ln5·s = −4.0716; ∂s/∂γd = −ln2·s = −1.7535.
    q = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    d = torch.tensor([[0.0, 2.0]], dtype=torch.float64)
    gq = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    gd = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)
    s = torch_similarity.score_matrix_torch(q, d, gq, gd)[0, 0]
    s.backward()
    s_val = math.sqrt(5) * math.sqrt(2) * 0.8
    assert s.item() == pytest.approx(s_val, rel=1e-9)
    assert gq.grad.item() == pytest.approx(-math.log(5) * s_val, rel=1e-9)
    assert gd.grad.item() == pytest.approx(-math.log(2) * s_val, rel=1e-9)
    assert gq.grad.item() == pytest.approx(-4.0716, abs=1e-4)
    assert gd.grad.item() == pytest.approx(-1.7535, abs=1e-4)


def test_gradient_wrt_gamma_batch_sums() -> None:
    # for a batch, ∂(Σ s_ij)/∂γd = Σ −ln‖d_j‖·s_ij
    rng = np.random.default_rng(5)
    q = torch.tensor(rng.normal(size=(3, 6)) * 2, dtype=torch.float64)
    d = torch.tensor(rng.normal(size=(4, 6)) * 3, dtype=torch.float64)
    gq = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    gd = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    s = torch_similarity.score_matrix_torch(q, d, gq, gd)
    s.sum().backward()
    ln_q = torch.log(torch.linalg.vector_norm(q, dim=1))[:, None]
    ln_d = torch.log(torch.linalg.vector_norm(d, dim=1))[None, :]
    sd = s.detach()
    assert gq.grad.item() == pytest.approx((-ln_q * sd).sum().item(), rel=1e-9)
    assert gd.grad.item() == pytest.approx((-ln_d * sd).sum().item(), rel=1e-9)
