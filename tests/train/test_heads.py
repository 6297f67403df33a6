"""Norm heads: exactly cosine at init, trainable (joint and frozen encoder), saved and exported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from magretrieve.core.errors import ConfigError
from magretrieve.data.readers import load_beir
from magretrieve.train.encoder import CONFIG_NAME, Encoder
from magretrieve.train.heads import (
    HEAD_FILE,
    build_head,
    head_spec,
    log_magnitude_numpy,
    train_head_on_vectors,
)
from magretrieve.train.trainer import TrainConfig, train

TEXTS = [
    "statins reduce heart risk",
    "cancer cell protein",
    "wing flow over the plane",
    "vitamin dose and blood pressure",
    "smoking and lung cancer in patients",
]


def _randomize(head: torch.nn.Module, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)


@pytest.mark.parametrize("kind,bound", [("linear", 0.0), ("mlp", 0.0), ("linear", 0.5)])
def test_head_outputs_exactly_zero_at_init(kind: str, bound: float) -> None:
    head = build_head(16, kind, hidden=8, bound=bound)
    x = torch.nn.functional.normalize(torch.randn(7, 16), dim=1)
    g = head(x)
    assert g.shape == (7,)
    assert torch.equal(g, torch.zeros(7))
    # and the scaled vector is the unit vector itself: exp(0) = 1
    raw = torch.randn(7, 16) * 3
    assert torch.allclose(head.scale(raw), raw / raw.norm(dim=1, keepdim=True), atol=0, rtol=1e-6)


def test_step0_rankings_equal_cosine(tiny_model_dir: Path, tiny_beir_dir: Path) -> None:
    cosine = Encoder.load(tiny_model_dir, "cosine", device="cpu")
    headed = Encoder.load(tiny_model_dir, "qnorm", norm_head="linear", device="cpu")
    data = load_beir(f"{tiny_beir_dir}:test")
    docs = [d.full_text for d in data.corpus.values()]
    queries = list(data.queries.values())
    s_cos = cosine.encode_queries(queries) @ cosine.encode_documents(docs).T
    s_head = headed.encode_queries(queries) @ headed.encode_documents(docs).T
    np.testing.assert_allclose(s_head, s_cos, rtol=0, atol=1e-6)
    assert (
        np.argsort(-s_head, axis=1, kind="stable") == np.argsort(-s_cos, axis=1, kind="stable")
    ).all()
    # the stored document vectors are unit-norm at step 0
    np.testing.assert_allclose(
        np.linalg.norm(headed.encode_documents(docs), axis=1), 1.0, atol=1e-6
    )


def test_head_acts_on_documents_only(tiny_model_dir: Path) -> None:
    enc = Encoder.load(tiny_model_dir, "qnorm", norm_head="linear", device="cpu")
    _randomize(enc.norm_head)
    plain = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    np.testing.assert_allclose(enc.embed(TEXTS, "query"), plain.embed(TEXTS, "query"), atol=1e-6)
    raw = plain.embed(TEXTS, "document")
    unit = raw / np.linalg.norm(raw, axis=1, keepdims=True)
    w = {k: v.detach().numpy() for k, v in enc.norm_head.state_dict().items()}
    expected = unit * np.exp(log_magnitude_numpy(unit, w, "linear"))[:, None]
    np.testing.assert_allclose(enc.embed(TEXTS, "document"), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind,bound", [("linear", 0.0), ("mlp", 0.0), ("mlp", 0.3)])
def test_numpy_twin_matches_torch(kind: str, bound: float) -> None:
    head = build_head(12, kind, hidden=5, bound=bound)
    _randomize(head, seed=3)
    x = torch.nn.functional.normalize(torch.randn(9, 12), dim=1)
    w = {k: v.detach().numpy() for k, v in head.state_dict().items()}
    np.testing.assert_allclose(
        log_magnitude_numpy(x.numpy(), w, kind, bound),
        head(x).detach().numpy(),
        rtol=1e-5,
        atol=1e-6,
    )
    if bound:
        assert np.abs(log_magnitude_numpy(x.numpy() * 50, w, kind, bound)).max() <= bound


def test_head_needs_a_magnitude_keeping_mode(tiny_model_dir: Path) -> None:
    with pytest.raises(ConfigError, match="keeps document magnitude"):
        Encoder.load(tiny_model_dir, "cosine", norm_head="linear", device="cpu")
    with pytest.raises(ConfigError, match="unknown norm head"):
        Encoder.load(tiny_model_dir, "qnorm", norm_head="quadratic", device="cpu")
    with pytest.raises(ConfigError, match="norm_head_bound"):
        Encoder.load(tiny_model_dir, "qnorm", norm_head="linear", norm_head_bound=-1, device="cpu")


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_head_save_load_round_trip(tiny_model_dir: Path, tmp_path: Path, kind: str) -> None:
    enc = Encoder.load(tiny_model_dir, "qnorm", norm_head=kind, norm_head_hidden=6, device="cpu")
    _randomize(enc.norm_head, seed=1)
    out = enc.save(tmp_path / "run")
    assert (out / HEAD_FILE).is_file()
    cfg = json.loads((out / CONFIG_NAME).read_text())
    assert (cfg["norm_head"], cfg["norm_head_hidden"]) == (kind, 6)
    back = Encoder.load(out, device="cpu")
    for (k1, v1), (k2, v2) in zip(
        enc.norm_head.state_dict().items(), back.norm_head.state_dict().items(), strict=True
    ):
        assert k1 == k2 and torch.equal(v1, v2)
    np.testing.assert_array_equal(back.encode_documents(TEXTS), enc.encode_documents(TEXTS))
    assert np.linalg.norm(back.encode_documents(TEXTS), axis=1).std() > 1e-3  # a real magnitude
    assert back.head_manifest("document") == head_spec(kind, 6, 0.0)
    assert back.head_manifest("query") is None
    (out / HEAD_FILE).unlink()
    with pytest.raises(ConfigError, match=HEAD_FILE):
        Encoder.load(out, device="cpu")


def _train(model_dir: Path, beir: Path, freeze: bool, tmp_path: Path):
    enc = Encoder.load(model_dir, "qnorm", norm_head="linear", device="cpu")
    pairs = load_beir(f"{beir}:train").training_pairs()
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    # one batch holding every pair: each step sees the same batch, so losses are comparable
    cfg = TrainConfig(
        epochs=15,
        batch_size=len(pairs),
        lr=1e-3,
        head_lr=5e-2,
        warmup_ratio=0.0,
        trainable=["norm_head"] if freeze else None,
    )
    result = train(enc, pairs, cfg, out_dir=tmp_path / "run", progress=False)
    return enc, before, [s["loss"] for s in result.log["steps"]]


def test_frozen_encoder_trains_only_the_head(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    enc, before, losses = _train(tiny_model_dir, tiny_beir_dir, True, tmp_path)
    assert losses[-1] < losses[0] - 1e-3
    after = enc.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.startswith("norm_head.") for k in changed)
    assert not torch.equal(
        after["norm_head.out.weight"], torch.zeros_like(after["norm_head.out.weight"])
    )


def test_joint_training_moves_encoder_and_head(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    enc, before, losses = _train(tiny_model_dir, tiny_beir_dir, False, tmp_path)
    assert losses[-1] < losses[0] - 1e-3
    after = enc.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any(k.startswith("norm_head.") for k in changed)
    assert any(k.startswith("transformer.") for k in changed)
    # the saved run reloads with the trained head
    back = Encoder.load(tmp_path / "run", device="cpu")
    np.testing.assert_allclose(back.encode_documents(TEXTS), enc.encode_documents(TEXTS), atol=1e-6)


def test_train_head_on_vectors_learns_a_prior() -> None:
    """Documents that are positives get larger magnitudes than distractors near the queries."""
    rng = np.random.default_rng(0)
    dim = 8
    good_dir = np.eye(dim)[0]
    docs = rng.normal(size=(40, dim))
    docs[:20] += 2 * good_dir  # relevant-looking documents
    docs[20:] += 2.2 * (np.eye(dim)[1] + 0.3 * good_dir)  # hubs near every query
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = docs[:20] + rng.normal(scale=0.6, size=(20, dim)) + 1.5 * np.eye(dim)[1]
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    positives = [(i, i) for i in range(20)]
    negatives = {i: list(range(20, 40)) for i in range(20)}
    head, losses = train_head_on_vectors(
        queries,
        docs,
        positives,
        negatives,
        kind="linear",
        epochs=40,
        batch_size=10,
        lr=1e-2,
        seed=1,
    )
    assert losses[-1] < losses[0]
    with torch.no_grad():
        g = head(torch.from_numpy(docs.astype(np.float32))).numpy()
    assert g[:20].mean() > g[20:].mean()


def test_head_exports_into_the_document_graph(tiny_model_dir: Path, tmp_path: Path) -> None:
    from magretrieve.core.manifest import Manifest
    from magretrieve.export.build import export_model
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    enc = Encoder.load(tiny_model_dir, "qnorm", norm_head="mlp", norm_head_hidden=4, device="cpu")
    _randomize(enc.norm_head, seed=2)
    out = export_model(enc, tmp_path / "exp", exporter="torchscript")
    onnx = OnnxEncoder.load(out)
    np.testing.assert_allclose(onnx.encode_documents(TEXTS), enc.encode_documents(TEXTS), atol=1e-4)
    np.testing.assert_allclose(onnx.encode_queries(TEXTS), enc.encode_queries(TEXTS), atol=1e-4)
    manifest = Manifest.load(out)
    assert manifest.graphs["document"].head == head_spec("mlp", 4, 0.0)
    assert manifest.graphs["query"].head is None


def test_train_cli_head_flags(tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from magretrieve.cli import main

    out = tmp_path / "cli_run"
    args = ["train", "--model", str(tiny_model_dir), "--train", f"{tiny_beir_dir}:train"]
    args += ["--mode", "qnorm", "--out", str(out), "--epochs", "1", "--batch-size", "3"]
    res = CliRunner().invoke(
        main, [*args, "--norm-head", "linear", "--freeze-encoder", "--calibrate-scale"]
    )
    assert res.exit_code == 0, res.output
    assert "norm calibration: raw vectors divided by c =" in res.output
    cfg = json.loads((out / CONFIG_NAME).read_text())
    assert cfg["norm_head"] == "linear" and cfg["extra"]["frozen_encoder"] is True
    assert cfg["norm_scale"] != 1.0
    assert (out / HEAD_FILE).is_file()
    # the transformer is the one loaded (frozen), the head moved
    base = Encoder.load(tiny_model_dir, "qnorm", device="cpu").transformer.state_dict()
    run = Encoder.load(out, device="cpu")
    assert all(torch.equal(v, run.transformer.state_dict()[k]) for k, v in base.items())
    assert run.norm_head.out.weight.abs().sum() > 0
    # the frozen path trains on cached fp32 vectors: bf16 is said to have no effect
    res = CliRunner().invoke(
        main,
        [*args[:-4], "--out", str(tmp_path / "bf16"), "--norm-head", "linear"]
        + ["--freeze-encoder", "--precision", "bf16"],
    )
    assert res.exit_code == 0, res.output
    assert "--precision bf16 has no effect with --freeze-encoder" in res.output
    # refusals are one-line errors
    res = CliRunner().invoke(main, [*args[:-4], "--out", str(tmp_path / "x"), "--freeze-encoder"])
    assert res.exit_code == 1 and "nothing to train" in res.output
    res = CliRunner().invoke(
        main,
        ["train", "--model", str(tiny_model_dir), "--train", f"{tiny_beir_dir}:train"]
        + ["--mode", "cosine", "--out", str(tmp_path / "y"), "--norm-head", "mlp"],
    )
    assert res.exit_code == 1 and "keeps document magnitude" in res.output


def test_train_frozen_head_from_pairs(tiny_model_dir: Path, tiny_beir_dir: Path) -> None:
    from magretrieve.train.heads import train_frozen_head
    from magretrieve.train.mining import mine_hard_negatives

    enc = Encoder.load(tiny_model_dir, "qnorm", norm_head="linear", device="cpu")
    data = load_beir(f"{tiny_beir_dir}:train")
    pairs = mine_hard_negatives(enc, data, data.training_pairs(), 3, progress=False)
    assert all(p.negatives for p in pairs)
    before = {k: v.clone() for k, v in enc.transformer.state_dict().items()}
    cfg = TrainConfig(epochs=20, batch_size=3, head_lr=5e-2, hard_negatives=3)
    losses = train_frozen_head(enc, pairs, cfg, progress=False)
    assert losses[-1] < losses[0]
    assert all(torch.equal(v, enc.transformer.state_dict()[k]) for k, v in before.items())
    assert enc.norm_head.out.weight.abs().sum() > 0
    # the head now changes document norms (and only those)
    norms = np.linalg.norm(enc.encode_documents(TEXTS), axis=1)
    assert norms.std() > 1e-4
    np.testing.assert_allclose(np.linalg.norm(enc.encode_queries(TEXTS), axis=1), 1.0, atol=1e-6)


def test_train_frozen_is_what_the_cli_runs(tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path):
    """The library's frozen-head run (trainer.train_frozen) gives the CLI's model and log."""
    from click.testing import CliRunner

    from magretrieve.cli import main
    from magretrieve.train.trainer import train_frozen

    data = load_beir(f"{tiny_beir_dir}:train")
    enc = Encoder.load(tiny_model_dir, "qnorm", norm_head="linear", device="cpu")
    cfg = TrainConfig(epochs=5, batch_size=3, head_lr=5e-2, seed=7)
    result = train_frozen(enc, data.training_pairs(), cfg, out_dir=tmp_path / "lib", progress=False)
    log = json.loads((tmp_path / "lib" / "train_log.json").read_text())
    assert log["frozen_encoder"] is True and log["world_size"] == 1
    assert log["epoch_losses"] == result.log["epoch_losses"] and len(log["epoch_losses"]) == 5
    res = CliRunner().invoke(
        main,
        ["train", "--model", str(tiny_model_dir), "--train", f"{tiny_beir_dir}:train",
         "--mode", "qnorm", "--out", str(tmp_path / "cli"), "--norm-head", "linear",
         "--freeze-encoder", "--epochs", "5", "--batch-size", "3", "--head-lr", "5e-2",
         "--seed", "7"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    cli_log = json.loads((tmp_path / "cli" / "train_log.json").read_text())
    np.testing.assert_allclose(cli_log["epoch_losses"], log["epoch_losses"], rtol=1e-6)
    with pytest.raises(ConfigError, match="needs an encoder with a norm head"):
        train_frozen(Encoder.load(tiny_model_dir, "qnorm", device="cpu"), data.training_pairs())
