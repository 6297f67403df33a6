"""Token-budget batching, thread and device knobs, and graph fusion with its fallbacks.

Speed itself is measured in benchmarks/encode_speed.py; these tests check behaviour: which
batches are formed, that vectors do not depend on them, what the manifest says was fused,
and that a graph that cannot be fused (or whose fusion misses parity) still exports.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from magretrieve.core.errors import ConfigError

TEXTS = [
    "what does statin cause",
    "a",
    "Brain protein levels in mice lacking the gene: a study of 20 patients " * 8,
    "Wing flow, boundary layer & pressure?",
    "lung",
    "vitamin dose and cancer cell risk in human trial data",
    "heart " * 30,
]


# ---------------------------------------------------------------- token_budget_batches


def test_token_budget_batches_by_hand() -> None:
    from magretrieve.core.batching import token_budget_batches

    lengths = [5, 100, 30, 30, 7, 100, 2]
    # longest first (stable): 1, 5 (100); 2, 3 (30); 4 (7); 0 (5); 6 (2)
    batches = token_budget_batches(lengths, max_tokens=200, max_rows=8)
    # 100-token rows: 200 // 100 = 2 → [1, 5]; then 30: 200 // 30 = 6 rows → [2, 3, 4, 0, 6]
    assert [b.tolist() for b in batches] == [[1, 5], [2, 3, 4, 0, 6]]
    # the row cap closes a batch before the budget does
    assert [b.tolist() for b in token_budget_batches(lengths, 200, max_rows=3)] == [
        [1, 5],
        [2, 3, 4],
        [0, 6],
    ]
    # a text longer than the budget is a batch of its own; every index appears exactly once
    lone = token_budget_batches(lengths, max_tokens=50, max_rows=8)
    assert [b.tolist() for b in lone] == [[1], [5], [2], [3], [4, 0, 6]]
    # None: fixed-size batches over the same sorted order
    fixed = token_budget_batches(lengths, max_tokens=None, max_rows=3)
    assert [b.tolist() for b in fixed] == [[1, 5, 2], [3, 4, 0], [6]]
    assert token_budget_batches([], 10, 4) == []


def test_token_budget_batches_padded_tokens_stay_within_budget() -> None:
    from magretrieve.core.batching import token_budget_batches

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 257, size=500).tolist()
    batches = token_budget_batches(lengths, max_tokens=4096, max_rows=64)
    assert sorted(np.concatenate(batches).tolist()) == list(range(500))
    for b in batches:
        padded = len(b) * max(lengths[i] for i in b)
        assert padded <= 4096 or len(b) == 1
        assert len(b) <= 64


@pytest.mark.parametrize(("tokens", "rows"), [(0, 4), (10, 0)])
def test_token_budget_batches_refuse_bad_limits(tokens: int, rows: int) -> None:
    from magretrieve.core.batching import token_budget_batches

    with pytest.raises(ConfigError, match="at least 1"):
        token_budget_batches([3, 4], max_tokens=tokens, max_rows=rows)


# ---------------------------------------------------------------- OnnxEncoder knobs


@pytest.fixture(scope="module")
def fused_export(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The default export (TorchScript, fused) of a qnorm tiny BERT, and its torch encoder."""
    from magretrieve.export import export_model
    from magretrieve.train.encoder import Encoder

    encoder = Encoder.load(tiny_model_dir, mode="qnorm", max_document_length=64, device="cpu")
    out = export_model(encoder, tmp_path_factory.mktemp("speed") / "export")
    return out, encoder


def test_batches_follow_the_token_budget_and_vectors_do_not_depend_on_it(fused_export) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    folder, encoder = fused_export
    onnx = OnnxEncoder.load(folder)
    session = onnx.session("document")
    shapes: list[tuple[int, int]] = []

    class Spy:
        def run(self, outputs, feed):
            shapes.append(feed["input_ids"].shape)
            return session.run(outputs, feed)

    onnx._sessions["document"] = Spy()
    lengths = [len(e.ids) for e in onnx.tokenize(TEXTS, "document")]
    budget = 2 * max(lengths)
    vectors = onnx.encode_documents(TEXTS, batch_size=100, max_batch_tokens=budget)
    assert all(rows * width <= budget or rows == 1 for rows, width in shapes)
    assert sum(rows for rows, _ in shapes) == len(TEXTS)
    # widths fall: longest first, each batch padded only to its own longest text
    assert [w for _, w in shapes] == sorted((w for _, w in shapes), reverse=True)
    assert shapes[0] == (2, max(lengths))
    # input order restored, and the same vectors as one-at-a-time and as PyTorch
    single = onnx.encode_documents(TEXTS, batch_size=1)
    np.testing.assert_allclose(vectors, single, atol=1e-5)
    np.testing.assert_allclose(vectors, encoder.encode_documents(TEXTS), atol=1e-4)
    with pytest.raises(ConfigError, match="max_batch_tokens must be at least 1"):
        onnx.encode_documents(TEXTS, max_batch_tokens=0)


def test_torch_encoder_batches_by_tokens_too(fused_export) -> None:
    _, encoder = fused_export
    budgeted = encoder.encode_documents(TEXTS, batch_size=64)
    np.testing.assert_allclose(budgeted, encoder.encode_documents(TEXTS, batch_size=1), atol=1e-5)
    np.testing.assert_allclose(
        encoder.embed(TEXTS, "document", 64, False, max_batch_tokens=8),
        encoder.embed(TEXTS, "document", 64, False, max_batch_tokens=None),
        atol=1e-5,
    )


def test_threads_default_to_the_process_cores_and_the_env_knob(
    fused_export, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    from magretrieve.serving.onnx_encoder import THREADS_ENV, OnnxEncoder, available_cores

    folder, _ = fused_export
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert available_cores() == len(os.sched_getaffinity(0))
    assert OnnxEncoder.load(folder).threads == available_cores()
    assert OnnxEncoder.load(folder, threads=1).threads == 1
    monkeypatch.setenv(THREADS_ENV, "3")
    assert OnnxEncoder.load(folder).threads == 3
    assert OnnxEncoder.load(folder, threads=2).threads == 2  # an explicit value wins
    monkeypatch.setenv(THREADS_ENV, "many")
    with pytest.raises(ConfigError, match="MAGRETRIEVE_ONNX_THREADS='many': not an integer"):
        OnnxEncoder.load(folder)
    monkeypatch.setenv(THREADS_ENV, "0")
    with pytest.raises(ConfigError, match="at least 1"):
        OnnxEncoder.load(folder)


def test_unknown_device_refused(fused_export) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    folder, _ = fused_export
    with pytest.raises(ConfigError, match="unknown device 'tpu'"):
        OnnxEncoder.load(folder, device="tpu")


# ---------------------------------------------------------------- fusion and its fallbacks


def _fusions(folder: Path) -> dict[str, int]:
    import onnx

    ops: dict[str, int] = {}
    for node in onnx.load(str(folder / "document.onnx")).graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
    return ops


def test_default_export_is_fused_and_says_so(fused_export, tiny_model_dir: Path) -> None:
    from magretrieve.core.manifest import Manifest

    folder, encoder = fused_export
    manifest = Manifest.load(folder)
    optimizer = manifest.exporter["optimizer"]
    assert manifest.exporter["attention"] == "eager"
    assert optimizer["applied"] and optimizer["attention_fused"]
    ops = _fusions(folder)
    for op, count in optimizer["fused_operators"].items():
        assert ops[op] == count  # the manifest describes the graph that was written
    assert "Softmax" not in ops  # attention really is one operator now
    assert manifest.parity["max_abs_diff"] <= 1e-4
    # exporting traced eager attention; the user's encoder keeps its own setting
    from magretrieve.train.encoder import Encoder

    fresh = Encoder.load(tiny_model_dir, mode="qnorm", device="cpu")
    assert fresh.transformer.config._attn_implementation != "eager"  # transformers 5: sdpa
    assert (
        encoder.transformer.config._attn_implementation
        == fresh.transformer.config._attn_implementation
    )


def test_no_optimize_exports_plain_graphs(tiny_model_dir: Path, tmp_path: Path) -> None:
    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model

    out = export_model(tiny_model_dir, tmp_path / "plain", mode="qnorm", optimize=False)
    manifest = Manifest.load(out)
    assert manifest.exporter["optimizer"] == {
        "applied": False,
        "reason": "not requested (--no-optimize)",
    }
    ops = _fusions(out)
    assert "Attention" not in ops and "SkipLayerNormalization" not in ops


def test_model_the_optimizer_does_not_know_exports_unfused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model
    from magretrieve.train.encoder import Encoder

    encoder = Encoder.load(tiny_model_dir, mode="qnorm", device="cpu")
    encoder.transformer.config.model_type = "gpt2"  # as if the encoder were not BERT-like
    said: list[str] = []
    out = export_model(encoder, tmp_path / "unfused", echo=said.append)
    optimizer = Manifest.load(out).exporter["optimizer"]
    assert optimizer["applied"] is False
    assert "'gpt2' is not BERT-like" in optimizer["reason"]
    assert any(msg.startswith("not fusing:") for msg in said)
    assert "Attention" not in _fusions(out)
    assert Manifest.load(out).parity["max_abs_diff"] <= 1e-4


def test_fused_graph_that_misses_parity_falls_back_to_unfused(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnx
    from onnx import numpy_helper

    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model, quantize
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    real = quantize.optimize_bert

    def broken_fusion(src, dst, **kw):
        facts = real(src, dst, **kw)
        model = onnx.load(str(dst))
        # perturb the largest weight of the fused graph: parity must catch it
        init = max(model.graph.initializer, key=lambda i: int(np.prod(i.dims)))
        arr = numpy_helper.to_array(init).copy()
        init.CopyFrom(numpy_helper.from_array(arr * 1.5 + 0.1, init.name))
        onnx.save(model, str(dst))
        return facts

    monkeypatch.setattr(quantize, "optimize_bert", broken_fusion)
    out = export_model(tiny_model_dir, tmp_path / "fallback", mode="qnorm")
    manifest = Manifest.load(out)
    optimizer = manifest.exporter["optimizer"]
    assert optimizer["applied"] is False
    assert optimizer["reason"].startswith("fused graphs missed parity")
    assert "Attention" not in _fusions(out)
    assert manifest.parity["max_abs_diff"] <= 1e-4
    OnnxEncoder.load(out).encode_queries(["still loads and verifies"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fallback"]  # no backups left


def test_optimizer_crash_still_exports(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model, quantize

    def crash(src, dst, **kw):
        raise RuntimeError("simulated optimizer bug")

    monkeypatch.setattr(quantize, "optimize_bert", crash)
    out = export_model(tiny_model_dir, tmp_path / "crash", mode="qnorm")
    optimizer = Manifest.load(out).exporter["optimizer"]
    assert optimizer["applied"] is False
    assert "simulated optimizer bug" in optimizer["reason"]


# ---------------------------------------------------------------- accelerators


def _cuda_ready() -> bool:
    import onnxruntime as ort
    import torch

    return torch.cuda.is_available() and "CUDAExecutionProvider" in ort.get_available_providers()


def test_cuda_refused_in_one_line_when_absent(fused_export) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    if _cuda_ready():
        pytest.skip("a CUDA GPU is present: the refusal path does not apply")
    folder, _ = fused_export
    with pytest.raises(ConfigError, match="--device cuda: this onnxruntime has no"):
        OnnxEncoder.load(folder, device="cuda")


@pytest.mark.skipif(not _cuda_ready(), reason="no CUDA GPU with onnxruntime's CUDA provider")
def test_cuda_onnx_matches_cpu(fused_export) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    folder, _ = fused_export
    cpu = OnnxEncoder.load(folder).encode_documents(TEXTS)
    gpu = OnnxEncoder.load(folder, device="cuda")
    assert gpu.session("document").get_providers()[0] == "CUDAExecutionProvider"
    np.testing.assert_allclose(gpu.encode_documents(TEXTS), cpu, atol=1e-3)


def _torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _invoke(*args: object):
    from click.testing import CliRunner

    from magretrieve.cli import main

    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def test_cli_device_cuda_refused_in_one_line_without_a_gpu(
    fused_export, tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    """index / eval / export / train --device cuda on a machine without CUDA: one line, exit 1,
    nothing written. (With a GPU the same commands run: test_cli_device_cuda_on_a_gpu.)"""
    if _cuda_ready() or _torch_cuda():
        pytest.skip("a CUDA GPU is present: the refusal path does not apply")
    folder, _ = fused_export
    store = tmp_path / "ix"
    runs = {
        "index": _invoke(
            "index",
            folder,
            tiny_beir_dir / "corpus.jsonl",
            "--store",
            f"faiss:{store}",
            "--device",
            "cuda",
        ),
        "eval onnx": _invoke(
            "eval", "--model", folder, "--data", f"{tiny_beir_dir}:test", "--device", "cuda"
        ),
        "eval torch": _invoke(
            "eval",
            "--model",
            tiny_model_dir,
            "--data",
            f"{tiny_beir_dir}:test",
            "--mode",
            "qnorm",
            "--device",
            "cuda",
        ),
        "export": _invoke(
            "export", tiny_model_dir, tmp_path / "exp", "--mode", "qnorm", "--device", "cuda"
        ),
        "train": _invoke(
            "train",
            "--model",
            tiny_model_dir,
            "--train",
            f"{tiny_beir_dir}:train",
            "--out",
            tmp_path / "run",
            "--device",
            "cuda",
            "--max-steps",
            "1",
        ),
    }
    for name, res in runs.items():
        assert res.exit_code == 1, (name, res.output)
        assert "Traceback" not in res.output, name
        assert "--device cuda:" in res.output, (name, res.output)
    assert "CUDAExecutionProvider" in runs["index"].output
    assert "torch.cuda.is_available() is False" in runs["eval torch"].output
    assert not store.exists() and not (tmp_path / "exp").exists()
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(
    not (_cuda_ready() and _torch_cuda()), reason="no CUDA GPU (torch and onnxruntime)"
)
def test_cli_device_cuda_on_a_gpu(
    fused_export, tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    """export parity, index, eval and train on the GPU agree with the CPU path."""
    import json

    from magretrieve.core.manifest import Manifest
    from magretrieve.stores import open_store

    folder, _ = fused_export
    res = _invoke("export", tiny_model_dir, tmp_path / "exp", "--mode", "qnorm", "--device", "cuda")
    assert res.exit_code == 0, res.output
    assert Manifest.load(tmp_path / "exp").parity["cuda"]["max_abs_diff"] <= 1e-4
    for device in ("cpu", "cuda"):
        res = _invoke(
            "index",
            folder,
            tiny_beir_dir / "corpus.jsonl",
            "--store",
            f"faiss:{tmp_path / device}",
            "--device",
            device,
            "--no-progress",
        )
        assert res.exit_code == 0, res.output
    cpu, gpu = open_store(f"faiss:{tmp_path / 'cpu'}"), open_store(f"faiss:{tmp_path / 'cuda'}")
    ids = sorted(cpu.iter_ids())
    np.testing.assert_allclose(gpu.get_vectors(ids), cpu.get_vectors(ids), atol=1e-3)
    scores = {}
    for device in ("cpu", "cuda"):
        res = _invoke(
            "eval",
            "--model",
            folder,
            "--data",
            f"{tiny_beir_dir}:test",
            "--device",
            device,
            "--json",
        )
        assert res.exit_code == 0, res.output
        scores[device] = json.loads(res.output)["ndcg_at_10"]
    assert scores["cuda"] == pytest.approx(scores["cpu"], abs=1e-3)
    res = _invoke(
        "train",
        "--model",
        tiny_model_dir,
        "--train",
        f"{tiny_beir_dir}:train",
        "--out",
        tmp_path / "run",
        "--device",
        "cuda",
        "--max-steps",
        "2",
        "--epochs",
        "1",
    )
    assert res.exit_code == 0, res.output
