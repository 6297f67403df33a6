"""The trainer on tiny random BERTs: the InfoNCE loss against hand-computed values, in-batch
duplicate handling, length-bucketed batching, validation splits and mined negatives that never
leak relevance, and what training does under each mode (loss goes down, the qnorm "relevance
counter", cosine's blindness to norms, learnable γ and its own learning rate, best-checkpoint
keeping, the run log, seed control)."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from magretrieve.core import similarity
from magretrieve.core.errors import ConfigError, DataError, SymmetryError
from magretrieve.data.readers import Document, RetrievalDataset, TrainingPair, load_beir
from magretrieve.evaluation import retrieval as evaluate_module
from magretrieve.train import torch_similarity
from magretrieve.train.encoder import CONFIG_NAME, Encoder
from magretrieve.train.losses import InfoNCE, text_keys
from magretrieve.train.mining import mine_hard_negatives
from magretrieve.train.trainer import (
    LOG_NAME,
    TrainConfig,
    length_bucketed_batches,
    split_validation,
    train,
)

WORDS = (
    "the a of and to in is for on with statin cancer cell protein gene brain blood drug trial "
    "patients effect study air speed plane engine heat low high dose vitamin aspirin smoking "
    "lung liver kidney mouse mice human model data"
).split()
POPULAR = "statins reduce heart mortality"  # positive for many queries
NEVER = "wing boundary layer flow pressure"  # positive for none (only ever a negative)


def toy_pairs(seed: int = 0, n_popular: int = 8, n_other: int = 16) -> list[TrainingPair]:
    """Queries of three random words; one document is the positive of ``n_popular`` of them,
    the others have a positive each; NEVER is every pair's hard negative."""
    rng = random.Random(seed)

    def words(n: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(n))

    pairs = [TrainingPair(words(3), POPULAR, [NEVER]) for _ in range(n_popular)]
    pairs += [TrainingPair(words(3), words(4), [NEVER]) for _ in range(n_other)]
    return pairs


def batch_loss(enc: Encoder, pairs: list[TrainingPair], scale: float, hard: int = 0) -> float:
    """The training loss of ``pairs`` as one batch, without dropout."""
    enc.eval()
    positives = [p.positive for p in pairs]
    columns = positives + [n for p in pairs for n in p.negatives[:hard]]
    with torch.no_grad():
        q = enc.side_vectors(
            enc(**enc.tokenize([p.query for p in pairs], "query"), side="query"), "query"
        )
        d = enc.side_vectors(enc(**enc.tokenize(columns, "document"), side="document"), "document")
        loss = info_nce(q, d, scale, positives, columns)
    return float(loss)


def doc_norms(enc: Encoder, texts: list[str]) -> np.ndarray:
    return np.linalg.norm(enc.embed(texts, "document"), axis=1)


# ----------------------------------------------------------------------------- the loss


def info_nce(
    q: torch.Tensor,
    d: torch.Tensor,
    scale: float,
    positives: list[str] | None = None,
    columns: list[str] | None = None,
    symmetric: bool = False,
) -> torch.Tensor:
    """The trainer's loss in one process: columns holding a row's positive text are masked."""
    keys = {}
    if positives is not None and columns is not None:
        keys = {"positive_keys": text_keys(positives), "column_keys": text_keys(columns)}
    return InfoNCE(scale, symmetric=symmetric, gather=False)(q, d, **keys)


def test_info_nce_matches_hand_computation_2x2() -> None:
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    d = torch.tensor([[1.0, 0.0], [0.5, 1.0]])
    # logits = 2·q·dᵀ = [[2, 1], [0, 2]]; row 0 targets column 0, row 1 column 1
    # loss_0 = −log(e²/(e²+e¹)) = log(1+e⁻¹); loss_1 = −log(e²/(e⁰+e²)) = log(1+e⁻²)
    expected = (math.log(1 + math.exp(-1)) + math.log(1 + math.exp(-2))) / 2
    assert float(info_nce(q, d, 2.0)) == pytest.approx(expected, rel=1e-6)
    # the reverse direction uses logitsᵀ = [[2, 0], [1, 2]]: log(1+e⁻²) and log(1+e⁻¹) —
    # the same two terms here, so use an asymmetric example for the symmetric loss below
    assert float(info_nce(q, d, 2.0, symmetric=True)) == pytest.approx(expected, rel=1e-6)


def _cross_entropy(logits: np.ndarray) -> float:
    """Mean −log softmax of the diagonal, computed in float64 with numpy."""
    rows = []
    for i, row in enumerate(logits):
        finite = row[np.isfinite(row)]
        m = finite.max()
        rows.append(-(row[i] - m - math.log(np.exp(finite - m).sum())))
    return float(np.mean(rows))


def test_symmetric_loss_is_the_mean_of_both_directions() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, 6, generator=gen)
    d = torch.randn(7, 6, generator=gen)  # 4 positives + 3 hard negatives
    logits = 3.0 * (q @ d.T).double().numpy()
    forward = _cross_entropy(logits)
    backward = _cross_entropy(logits[:, :4].T)  # documents → queries, positives only
    assert forward != pytest.approx(backward, rel=1e-3)  # the example is not degenerate
    assert float(info_nce(q, d, 3.0)) == pytest.approx(forward, rel=1e-5)
    assert float(info_nce(q, d, 3.0, symmetric=True)) == pytest.approx(
        (forward + backward) / 2, rel=1e-5
    )


def test_repeated_positives_are_masked_and_nothing_else() -> None:
    positives = ["a", "b", "a"]
    columns = positives + ["a", "c", "b"]  # hard negatives after the positives
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(3, 4, generator=gen)
    d = torch.randn(6, 4, generator=gen)
    logits = 2.0 * (q @ d.T).double().numpy()
    masked = logits.copy()
    masked[0, [2, 3]] = -np.inf  # row 0's positive "a" repeats in columns 2 and 3
    masked[1, 5] = -np.inf  # row 1's positive "b" repeats as a hard negative
    masked[2, [0, 3]] = -np.inf  # a row's own positive (the diagonal) is never masked
    got = float(info_nce(q, d, 2.0, positives, columns))
    assert got == pytest.approx(_cross_entropy(masked), rel=1e-5)
    assert got != pytest.approx(_cross_entropy(logits), rel=1e-3)


def test_duplicates_in_a_batch_keep_the_loss_finite_and_exact() -> None:
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, 5, generator=gen)
    doc = torch.randn(1, 5, generator=gen)
    d = torch.cat([doc, doc, doc])  # all three queries share one positive
    texts = ["same", "same", "same"]
    loss = info_nce(q, d, 20.0, texts, texts)
    # every column but a row's own is masked: each row is certain of its positive
    assert torch.isfinite(loss)
    assert float(loss) == pytest.approx(0.0, abs=1e-7)
    loss_sym = info_nce(q, d, 20.0, texts, texts, symmetric=True)
    assert torch.isfinite(loss_sym)

    # two of four share a positive: the masked loss equals the loss without the duplicate column
    q = torch.randn(4, 5, generator=gen)
    d = torch.randn(4, 5, generator=gen)
    d[2] = d[0]
    texts = ["x", "y", "x", "z"]
    masked = float(info_nce(q, d, 5.0, texts, texts))
    logits = 5.0 * (q @ d.T).double().numpy()
    logits[0, 2] = logits[2, 0] = -np.inf
    assert masked == pytest.approx(_cross_entropy(logits), rel=1e-5)
    unmasked = float(info_nce(q, d, 5.0))
    assert unmasked > masked  # unmasked, a duplicate counts as its own negative


def test_cosine_gives_documents_no_radial_gradient() -> None:
    """Normalization removes the gradient along d: cosine cannot learn magnitude, qnorm can."""
    gen = torch.Generator().manual_seed(2)
    q_raw = torch.randn(4, 8, generator=gen)
    d_raw = (torch.randn(4, 8, generator=gen) + 0.5).requires_grad_(True)
    for mode, expect_radial in (("cosine", False), ("qnorm", True)):
        sim = similarity.resolve(mode)
        q = torch_similarity.partial_normalize_torch(q_raw, sim.gamma_q)
        d = torch_similarity.partial_normalize_torch(d_raw, sim.gamma_d)
        (grad,) = torch.autograd.grad(info_nce(q, d, 20.0), d_raw)
        radial = (grad * d_raw.detach()).sum(dim=1) / d_raw.detach().norm(dim=1)
        if expect_radial:
            assert radial.abs().max() > 1e-2
        else:
            assert radial.abs().max() < 1e-5


# ----------------------------------------------------------------------------- batching


def test_length_bucketed_batches_cover_every_index_once_with_similar_lengths() -> None:
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in rng.integers(1, 200, size=8 * 20 * 3 + 1)]  # last chunk: 1 item
    batches = length_bucketed_batches(lengths, 8, random.Random(3))
    seen = Counter(i for b in batches for i in b)
    assert max(seen.values()) == 1  # nothing twice
    missing = set(range(len(lengths))) - set(seen)
    assert len(missing) == 1  # the singleton batch (no negatives) is dropped, nothing else
    assert all(2 <= len(b) <= 8 for b in batches)
    assert sum(len(b) == 8 for b in batches) == len(batches)  # chunks of 160 cut evenly

    spread = np.mean([np.ptp([lengths[i] for i in b]) for b in batches])
    shuffled = list(range(len(lengths)))
    random.Random(4).shuffle(shuffled)
    random_spread = np.mean(
        [np.ptp([lengths[i] for i in shuffled[s : s + 8]]) for s in range(0, len(shuffled), 8)]
    )
    assert spread < 0.2 * random_spread  # similar lengths inside a batch

    # batches come in random order (not sorted by length) and are reproducible from the rng
    firsts = [lengths[b[0]] for b in batches]
    assert firsts != sorted(firsts) and firsts != sorted(firsts, reverse=True)
    assert length_bucketed_batches(lengths, 8, random.Random(3)) == batches
    assert length_bucketed_batches(lengths, 8, random.Random(5)) != batches


def test_length_bucketed_batches_small_inputs() -> None:
    assert length_bucketed_batches([5], 4, random.Random(0)) == []
    batches = length_bucketed_batches([3, 1, 2, 9, 9], 4, random.Random(0))
    covered = sorted(i for b in batches for i in b)
    # one batch of 4 plus a dropped singleton: one of the two longest (the tie at 9)
    assert covered in ([0, 1, 2, 3], [0, 1, 2, 4])


# ----------------------------------------------------------------------------- validation split


def beir_like(n_queries: int = 10) -> RetrievalDataset:
    corpus = {f"d{i}": Document(f"d{i}", f"document {i} text", f"title {i}") for i in range(20)}
    queries = {f"q{i}": f"query number {i}" for i in range(n_queries)}
    queries["q9"] = queries["q8"]  # two ids, one text: holding out one must not leak the other
    qrels = {f"q{i}": {f"d{i}": 1, f"d{i + 10}": 2 if i % 2 else 0} for i in range(n_queries)}
    return RetrievalDataset("toy", "train", corpus, queries, qrels)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_split_validation_holds_out_whole_queries(seed: int) -> None:
    data = beir_like()
    pairs = data.training_pairs()
    train_pairs, val = split_validation(pairs, data, 0.3, seed)
    assert val is not None and val.split == "train-validation"
    held = set(val.qrels)
    assert len(held) == 3
    assert set(val.queries) == held and val.corpus is data.corpus
    assert all(val.qrels[q] == data.qrels[q] for q in held)
    held_texts = {data.queries[q] for q in held}
    assert not {p.query for p in train_pairs} & held_texts  # no held query leaks into training
    kept = [p for p in pairs if p.query not in held_texts]
    assert train_pairs == kept  # every other pair is kept, in order
    again, val2 = split_validation(pairs, data, 0.3, seed)
    assert again == train_pairs and set(val2.qrels) == held


def test_split_validation_seeds_differ_and_bad_inputs() -> None:
    data = beir_like()
    pairs = data.training_pairs()
    helds = {frozenset(split_validation(pairs, data, 0.3, s)[1].qrels) for s in range(4)}
    assert len(helds) > 1
    assert split_validation(pairs, data, 0.0, 0) == (pairs, None)
    assert split_validation(pairs, None, 0.0, 0) == (pairs, None)
    with pytest.raises(ConfigError, match="BEIR"):
        split_validation(pairs, None, 0.2, 0)
    for bad in (1.0, 1.5):
        with pytest.raises(ConfigError, match="fraction"):
            split_validation(pairs, data, bad, 0)


# ----------------------------------------------------------------------------- mined negatives


def test_mined_hard_negatives_are_never_relevant(tiny_model_dir: Path) -> None:
    enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    words = WORDS
    corpus = {
        f"d{i}": Document(f"d{i}", " ".join(words[(3 * i + k) % len(words)] for k in range(5)))
        for i in range(14)
    }
    corpus["d13"] = Document("d13", corpus["d2"].text)  # same text as a relevant document
    queries = {"qa": "statin trial patients", "qb": "statin trial patients", "qc": "lung liver"}
    qrels = {"qa": {"d0": 1, "d1": 2, "d5": 0}, "qb": {"d2": 1}, "qc": {"d3": 1}}
    data = RetrievalDataset("toy", "train", corpus, queries, qrels)
    pairs = data.training_pairs()
    mined = mine_hard_negatives(enc, data, pairs, count=20, top=30, progress=False)
    assert [(p.query, p.positive, p.positive_id) for p in mined] == [
        (p.query, p.positive, p.positive_id) for p in pairs
    ]
    relevant_texts = {
        "statin trial patients": {corpus[d].full_text for d in ("d0", "d1", "d2")},
        "lung liver": {corpus["d3"].full_text},
    }
    all_texts = {d.full_text for d in corpus.values()}
    for p in mined:
        assert p.negatives, "every query has non-relevant documents to mine"
        assert set(p.negatives) <= all_texts
        assert not set(p.negatives) & relevant_texts[p.query], p
    # judged non-relevant (score 0) is a fine negative
    assert corpus["d5"].full_text in mined[0].negatives
    few = mine_hard_negatives(enc, data, pairs, count=2, top=30, progress=False)
    assert all(len(p.negatives) == 2 for p in few)


# ----------------------------------------------------------------------------- training behaviour


@pytest.fixture(scope="module")
def toy_runs(tiny_model_dir: Path) -> dict[str, dict]:
    """qnorm and cosine trained identically on the popular-document toy task."""
    pairs = toy_pairs(seed=0)
    others = [p.positive for p in pairs if p.positive != POPULAR]
    runs = {}
    for mode in ("qnorm", "cosine"):
        enc = Encoder.load(tiny_model_dir, mode, device="cpu")
        probe = [POPULAR, NEVER] + others
        before = doc_norms(enc, probe)
        loss_before = batch_loss(enc, pairs, 5.0, hard=1)
        cfg = TrainConfig(
            epochs=3, batch_size=8, lr=1e-3, warmup_ratio=0.0, scale=5.0, hard_negatives=1, seed=0
        )
        result = train(enc, pairs, cfg, progress=False)
        runs[mode] = {
            "encoder": enc,
            "before": before,
            "after": doc_norms(enc, probe),
            "loss_before": loss_before,
            "loss_after": batch_loss(enc, pairs, 5.0, hard=1),
            "log": result.log,
        }
    return runs


@pytest.mark.parametrize("mode", ["qnorm", "cosine"])
def test_training_lowers_the_loss(toy_runs: dict, mode: str) -> None:
    run = toy_runs[mode]
    assert run["loss_after"] < 0.9 * run["loss_before"]
    losses = [s["loss"] for s in run["log"]["steps"]]
    assert len(losses) == run["log"]["total_steps"] == 9
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_qnorm_relevance_counter(toy_runs: dict) -> None:
    """Under qnorm the document positive for many queries ends with a larger raw norm than the
    one positive for none; they start almost equal."""
    run = toy_runs["qnorm"]
    before, after = run["before"][0] / run["before"][1], run["after"][0] / run["after"][1]
    assert before == pytest.approx(1.0, abs=0.05)
    assert after > 1.2 and after > before * 1.15
    # the popular document also outgrows the documents that are positive for one query each
    assert run["after"][0] > np.mean(run["after"][2:])
    # cosine gives norms no gradient: its norms drift only through shared weights, less so
    cos = toy_runs["cosine"]
    assert after > cos["after"][0] / cos["after"][1] + 0.05


def test_cosine_scores_and_ranking_ignore_norms(toy_runs: dict) -> None:
    enc = toy_runs["cosine"]["encoder"]
    pairs = toy_pairs(seed=0)
    queries = [p.query for p in pairs[:6]]
    docs = sorted({p.positive for p in pairs} | {NEVER})
    q = enc.encode_queries(queries)
    raw = enc.embed(docs, "document")
    factors = np.random.default_rng(0).uniform(0.1, 10.0, size=(len(docs), 1)).astype(np.float32)
    for mode, invariant in (("cosine", True), ("qnorm", False)):
        sim = similarity.resolve(mode)
        qv = similarity.query_vectors(enc.embed(queries, "query"), sim)
        plain = qv @ similarity.document_vectors(raw, sim).T
        scaled = qv @ similarity.document_vectors(raw * factors, sim).T
        same_order = (np.argsort(-plain, axis=1) == np.argsort(-scaled, axis=1)).all()
        if invariant:
            np.testing.assert_allclose(scaled, plain, rtol=1e-5, atol=1e-6)
            assert same_order
        else:
            assert not same_order  # control: under qnorm the same rescaling reorders results
    # the trained cosine encoder stores unit vectors: its scores are plain cosines
    stored = enc.encode_documents(docs)
    np.testing.assert_allclose(np.linalg.norm(stored, axis=1), 1.0, rtol=1e-5)
    unit_raw = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    np.testing.assert_allclose(q @ stored.T, q @ unit_raw.T, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def tiny_pairs(tiny_beir_dir: Path) -> list[TrainingPair]:
    return load_beir(f"{tiny_beir_dir}:train").training_pairs()


def test_learnable_gamma_moves_with_its_own_rate_only(
    tiny_model_dir: Path, tiny_pairs: list[TrainingPair]
) -> None:
    moved = {}
    for gamma_lr in (0.5, 2e-5):
        enc = Encoder.load(tiny_model_dir, "learnable", device="cpu")
        assert enc.similarity.gamma_q == enc.similarity.gamma_d == pytest.approx(0.5)
        cfg = TrainConfig(epochs=2, batch_size=3, lr=2e-5, gamma_lr=gamma_lr, seed=0)
        result = train(enc, tiny_pairs, cfg, progress=False)
        gammas = [(s["gamma_q"], s["gamma_d"]) for s in result.log["steps"]]
        moved[gamma_lr] = max(
            abs(result.log["final_gamma_q"] - 0.5), abs(result.log["final_gamma_d"] - 0.5)
        )
        assert (result.log["final_gamma_q"], result.log["final_gamma_d"]) == gammas[-1]
        assert enc.config.gamma_q == pytest.approx(gammas[-1][0])  # synced into the config
    assert moved[0.5] > 0.05
    # at the encoder's tiny rate γ stays at its start: the paper's failure
    assert moved[2e-5] < 1e-3


def test_best_checkpoint_is_restored_and_saved(
    tiny_model_dir: Path,
    tiny_beir_dir: Path,
    tiny_pairs: list[TrainingPair],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Validation NDCG@10 peaks at step 2 of 4: the final weights are exactly step 2's."""
    real = evaluate_module.evaluate_retrieval
    scripted = iter([0.2, 0.7, 0.4, 0.1])
    snapshots: list[dict[str, torch.Tensor]] = []

    def scored(encoder, data, **kwargs):
        res = real(encoder, data, **kwargs)
        res.ndcg_at_10 = next(scripted)  # a later step is worse, deterministically
        snapshots.append({k: v.detach().clone() for k, v in encoder.state_dict().items()})
        return res

    monkeypatch.setattr(evaluate_module, "evaluate_retrieval", scored)
    enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    validation = load_beir(f"{tiny_beir_dir}:test")
    cfg = TrainConfig(epochs=3, batch_size=2, lr=1e-3, eval_every=1, max_steps=4, seed=0)
    result = train(
        enc, tiny_pairs, cfg, validation=validation, out_dir=tmp_path / "run", progress=False
    )
    assert [e["step"] for e in result.log["evaluations"]] == [1, 2, 3, 4]
    assert result.best_step == 2 and result.best_score == 0.7
    assert result.log["best_step"] == 2 and result.log["best_validation_ndcg@10"] == 0.7
    assert [e["validation"]["ndcg_at_10"] for e in result.evaluations] == [0.2, 0.7, 0.4, 0.1]
    final = enc.state_dict()
    assert all(torch.equal(final[k], snapshots[1][k]) for k in final)
    assert not all(torch.equal(snapshots[3][k], snapshots[1][k]) for k in final)  # weights moved
    saved = Encoder.load(tmp_path / "run", device="cpu").state_dict()
    assert all(torch.equal(saved[k], snapshots[1][k]) for k in final)


def test_last_step_is_validated_when_eval_every_does_not_divide(
    tiny_model_dir: Path, tiny_beir_dir: Path, tiny_pairs: list[TrainingPair]
) -> None:
    enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    validation = load_beir(f"{tiny_beir_dir}:test")
    cfg = TrainConfig(epochs=3, batch_size=2, lr=1e-3, eval_every=3, max_steps=4, seed=0)
    result = train(enc, tiny_pairs, cfg, validation=validation, progress=False)
    # the final weights are judged too before a checkpoint is preferred over them
    assert [e["step"] for e in result.log["evaluations"]] == [3, 4]


def test_epoch_end_validation_and_report_sets(
    tiny_model_dir: Path, tiny_beir_dir: Path, tiny_pairs: list[TrainingPair]
) -> None:
    enc = Encoder.load(tiny_model_dir, "dot", device="cpu")
    test = load_beir(f"{tiny_beir_dir}:test")
    cfg = TrainConfig(epochs=2, batch_size=3, lr=1e-4, seed=0)
    result = train(enc, tiny_pairs, cfg, report=[test], progress=False)
    assert [e["step"] for e in result.evaluations] == [2, 4]  # 2 batches an epoch
    for entry in result.evaluations:
        assert "validation" not in entry  # a report set never picks the checkpoint
        (key,) = [k for k in entry if k != "step"]
        assert key.endswith(":test")
        rep = entry[key]
        assert 0.0 <= rep["ndcg_at_10"] <= 1.0 and rep["n_queries"] == 6
    assert result.best_step is None


def test_train_log_json(
    tiny_model_dir: Path, tiny_pairs: list[TrainingPair], tmp_path: Path
) -> None:
    enc = Encoder.load(tiny_model_dir, "learnable", device="cpu")
    cfg = TrainConfig(epochs=2, batch_size=3, lr=1e-4, gamma_lr=0.3, seed=1)
    out = tmp_path / "run"
    result = train(enc, tiny_pairs, cfg, out_dir=out, progress=False)
    log = json.loads((out / LOG_NAME).read_text())
    assert log == json.loads(json.dumps(result.log))
    assert log["config"]["gamma_lr"] == 0.3 and log["encoder"]["mode"] == "learnable"
    assert log["n_pairs"] == 6 and log["total_steps"] == 4
    steps = log["steps"]
    assert [s["step"] for s in steps] == [1, 2, 3, 4]
    assert [s["epoch"] for s in steps] == [0, 0, 1, 1]
    for s in steps:
        assert math.isfinite(s["loss"]) and s["loss"] >= 0
        assert s["mean_query_norm"] > 0 and s["mean_doc_norm"] > 0
        assert 0 < s["gamma_q"] < 1 and 0 < s["gamma_d"] < 1
        assert s["grad_norm"] >= 0 and s["lr"] >= 0
    gq = [s["gamma_q"] for s in steps]
    assert len(set(gq)) == len(gq)  # γ over time: a new value every step
    assert log["final_gamma_q"] == gq[-1]
    saved = json.loads((out / CONFIG_NAME).read_text())
    assert saved["gamma_q"] == pytest.approx(gq[-1]) and saved["gamma_d"] == pytest.approx(
        steps[-1]["gamma_d"]
    )
    assert log["seconds"] > 0 and log["steps_per_second"] > 0


def test_same_seed_same_run_other_seed_other_run(
    tiny_model_dir: Path, tiny_pairs: list[TrainingPair]
) -> None:
    def run(seed: int) -> tuple[list[float], dict[str, torch.Tensor]]:
        enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
        cfg = TrainConfig(epochs=2, batch_size=3, lr=1e-3, seed=seed, max_steps=3)
        result = train(enc, tiny_pairs, cfg, progress=False)
        return [s["loss"] for s in result.log["steps"]], enc.state_dict()

    losses_a, state_a = run(7)
    losses_b, state_b = run(7)
    assert losses_a == losses_b
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    losses_c, _ = run(8)
    assert losses_c != losses_a


def test_train_refuses_bad_settings(tiny_model_dir: Path, tiny_pairs: list[TrainingPair]) -> None:
    enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    with pytest.raises(SymmetryError, match="--force"):
        train(enc, tiny_pairs, TrainConfig(task="symmetric"), progress=False)
    with pytest.raises(DataError, match="at least 2 pairs"):
        train(enc, tiny_pairs[:1], TrainConfig(), progress=False)
    for kwargs, needle in (
        ({"batch_size": 1}, "--batch-size must be >= 2, got 1"),
        ({"lr": 0.0}, "--lr must be > 0, got 0.0"),
        ({"gamma_lr": float("nan")}, "--gamma-lr must be a finite number"),
        ({"task": "sts"}, "--task must be one of retrieval, symmetric"),
        ({"warmup_ratio": 1.0}, r"warmup_ratio must lie in \[0, 1\)"),
    ):
        with pytest.raises(ConfigError, match=needle):
            train(enc, tiny_pairs, TrainConfig(**kwargs), progress=False)


def test_symmetric_task_with_force_trains_with_a_warning(
    tiny_model_dir: Path, tiny_pairs: list[TrainingPair], caplog: pytest.LogCaptureFixture
) -> None:
    enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    cfg = TrainConfig(task="symmetric", force=True, epochs=1, batch_size=3, seed=0)
    with caplog.at_level("WARNING", logger="magretrieve.train.trainer"):
        result = train(enc, tiny_pairs, cfg, progress=False)
    assert any("s(a, b) != s(b, a)" in r.getMessage() for r in caplog.records)
    assert result.log["total_steps"] == 2


# ----------------------------------------------------------------------------- precision


def test_autocast_context_runs_matmuls_in_bf16_only_when_asked() -> None:
    from magretrieve.train.trainer import autocast

    layer = torch.nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with autocast(torch.device("cpu"), "bf16"):
        assert layer(x).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert layer(x).dtype == torch.float32
    assert layer.weight.dtype == torch.float32


def test_bf16_training_moves_fp32_weights_and_saves_a_loadable_model(
    tiny_model_dir: Path, tiny_pairs: list[TrainingPair], tmp_path: Path
) -> None:
    def run(precision: str, out: Path | None = None) -> tuple[Encoder, dict]:
        enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
        cfg = TrainConfig(epochs=2, batch_size=3, lr=1e-3, seed=0, precision=precision)
        return enc, train(enc, tiny_pairs, cfg, out_dir=out, progress=False).log

    start = Encoder.load(tiny_model_dir, "qnorm", device="cpu").state_dict()
    enc, log = run("bf16", tmp_path / "run")
    _, log32 = run("fp32")
    assert log["precision"] == "bf16" and log["config"]["precision"] == "bf16"
    assert log32["precision"] == "fp32"
    losses = [s["loss"] for s in log["steps"]]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    # same weights, batch and dropout at step 1: bf16 changes the loss a little, not a lot
    first, first32 = losses[0], log32["steps"][0]["loss"]
    assert first != first32 and first == pytest.approx(first32, rel=0.05)
    state = enc.state_dict()
    assert all(v.dtype == start[k].dtype for k, v in state.items())  # master weights stay fp32
    moved = [
        k for k in start if start[k].is_floating_point() and not torch.equal(start[k], state[k])
    ]
    assert any("encoder.layer" in k for k in moved)

    loaded = Encoder.load(tmp_path / "run", device="cpu")
    assert loaded.config.mode == "qnorm"
    vectors = loaded.embed(["statins heart risk", "wing flow"], "document")
    assert vectors.dtype == np.float32 and np.isfinite(vectors).all()
    np.testing.assert_allclose(vectors, enc.embed(["statins heart risk", "wing flow"], "document"))


def test_bad_precision_is_refused_by_name(
    tiny_model_dir: Path, tiny_pairs: list[TrainingPair]
) -> None:
    enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    with pytest.raises(ConfigError, match="--precision must be one of fp32, bf16, got 'fp16'"):
        train(enc, tiny_pairs, TrainConfig(precision="fp16"), progress=False)
    with pytest.raises(ConfigError, match="fp32, bf16"):
        TrainConfig(precision="BF16").validate()


def test_step_records_count_real_and_padded_tokens(
    tiny_model_dir: Path, tiny_pairs: list[TrainingPair]
) -> None:
    enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    log = train(enc, tiny_pairs, TrainConfig(epochs=1, batch_size=3, seed=0), progress=False).log
    steps = log["steps"]
    assert len(steps) == 2  # 6 pairs in batches of 3: every pair exactly once
    real = sum(enc.token_lengths([p.query for p in tiny_pairs], "query")) + sum(
        enc.token_lengths([p.positive for p in tiny_pairs], "document")
    )
    assert sum(s["tokens"] for s in steps) == real
    assert all(s["padded_tokens"] >= s["tokens"] > 0 for s in steps)
    assert 0 < steps[0]["elapsed"] < steps[1]["elapsed"] <= log["seconds"]


def test_cli_trains_in_bf16(tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from magretrieve.cli import main

    out = tmp_path / "run"
    args = [
        "train", "--model", str(tiny_model_dir), "--train", f"{tiny_beir_dir}:train",
        "--mode", "qnorm", "--out", str(out), "--epochs", "1", "--batch-size", "3",
        "--lr", "1e-4", "--precision", "bf16", "--json",
    ]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["steps"] == 2 and math.isfinite(summary["final_loss"])
    log = json.loads((out / LOG_NAME).read_text())
    assert log["precision"] == "bf16" and log["config"]["precision"] == "bf16"
    vectors = Encoder.load(out, device="cpu").embed(["statins heart"], "query")
    assert np.isfinite(vectors).all()

    default = CliRunner().invoke(main, [*args[:-3], "--json", "--force"])
    assert default.exit_code == 0, default.output
    assert json.loads((out / LOG_NAME).read_text())["precision"] == "fp32"  # the default

    bad = CliRunner().invoke(main, [*args[:-2], "fp16"])
    assert bad.exit_code == 2 and "fp16" in bad.output  # click names the bad choice
