"""ONNX export: parity for every mode, vector contracts, int8, and nothing written on failure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from magretrieve.core.errors import ConfigError, MagRetrieveError
from magretrieve.core.manifest import model_fingerprint

TEXTS = [
    "statins heart mortality",
    "a",
    "what does smoking cause in the lung and liver of patients " * 3,
    "wing",
    "cancer cell protein gene brain blood",
]
# (mode, γq, γd): learnable uses *trained* logits set below, so γ is not in {0, 1}.
MODES = [
    ("cosine", 1.0, 1.0),
    ("dot", 0.0, 0.0),
    ("qnorm", 1.0, 0.0),
    ("dnorm", 0.0, 1.0),
    ("learnable", None, None),
]


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def _cli(*args: str):
    from magretrieve.cli import main

    return CliRunner().invoke(main, ["export", *args], catch_exceptions=False)


@pytest.mark.parametrize(("mode", "gamma_q", "gamma_d"), MODES)
def test_parity_and_contract_every_mode(
    tiny_model_dir: Path, tmp_path: Path, mode, gamma_q, gamma_d
):
    import torch

    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model
    from magretrieve.serving.onnx_encoder import OnnxEncoder
    from magretrieve.train.encoder import Encoder

    encoder = Encoder.load(tiny_model_dir, mode=mode, device="cpu")
    if mode == "learnable":
        with torch.no_grad():  # as if training had moved γ: sigmoid(-0.85)≈0.30, sigmoid(1.4)≈0.80
            encoder.gamma_logits.copy_(torch.tensor([-0.85, 1.4]))
        gamma_q, gamma_d = (float(g.detach()) for g in encoder.gammas())
        assert 0.25 < gamma_q < 0.35 and 0.75 < gamma_d < 0.85
    out = export_model(encoder, tmp_path / "exp", exporter="torchscript")
    manifest = Manifest.load(out)
    assert manifest.mode == mode
    assert manifest.gamma_q == pytest.approx(gamma_q, abs=1e-6)
    assert manifest.gamma_d == pytest.approx(gamma_d, abs=1e-6)
    assert manifest.parity["max_abs_diff"] <= 1e-4
    assert manifest.parity["max_rel_norm_err"] <= 1e-5
    data = json.loads((out / "magretrieve.json").read_text())
    assert manifest.model_fingerprint == model_fingerprint(data)  # graphs, tokenizer, settings
    assert manifest.graphs["document"].head is None
    assert _listing(out) == sorted(
        [
            "document.onnx",
            "magretrieve.json",
            "query.onnx",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    )

    onnx = OnnxEncoder.load(out)
    assert [i.name for i in onnx.session("query").get_inputs()] == manifest.graphs["query"].inputs
    assert [o.name for o in onnx.session("document").get_outputs()] == ["sentence_embedding"]
    q, d = onnx.encode_queries(TEXTS), onnx.encode_documents(TEXTS)
    np.testing.assert_allclose(q, encoder.encode_queries(TEXTS), atol=1e-4)
    np.testing.assert_allclose(d, encoder.encode_documents(TEXTS), atol=1e-4)

    # ‖x / ‖x‖^γ‖ = ‖x‖^(1−γ): unit norm for γ = 1, raw norm kept for γ = 0.
    raw_q = np.linalg.norm(encoder.embed(TEXTS, "query"), axis=1)
    raw_d = np.linalg.norm(encoder.embed(TEXTS, "document"), axis=1)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), raw_q ** (1 - gamma_q), rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), raw_d ** (1 - gamma_d), rtol=1e-5)
    assert manifest.query_contract == ("unit_norm" if gamma_q == 1.0 else "magnitude_keeping")
    assert manifest.document_contract == ("unit_norm" if gamma_d == 1.0 else "magnitude_keeping")
    if gamma_q == 1.0:
        np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(raw_d, 1.0, atol=1e-2)  # the fixture's raw norms are not trivially 1


@pytest.mark.slow  # the default (dynamo) exporter: slow by nature
def test_cli_default_exporter_and_overwrite(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The default (auto → TorchScript, fused) path through the CLI; an existing target needs
    --overwrite."""
    from magretrieve.core.manifest import Manifest

    dest = tmp_path / "exported" / "qnorm"  # parent does not exist yet
    result = _cli(str(tiny_model_dir), str(dest), "--mode", "qnorm")
    assert result.exit_code == 0, result.output
    manifest = Manifest.load(dest)
    assert manifest.exporter["name"] == "torch.onnx (torchscript)"
    assert manifest.exporter["opset"] == 17
    optimizer = manifest.exporter["optimizer"]
    assert optimizer["applied"] and optimizer["attention_fused"]
    # the tiny BERT has 2 layers: one Attention, two SkipLayerNorm per layer, one embedding
    assert optimizer["fused_operators"] == {
        "EmbedLayerNormalization": 1,
        "Attention": 2,
        "BiasGelu": 2,
        "SkipLayerNormalization": 4,
    }
    assert manifest.parity["max_abs_diff"] <= 1e-4  # the fused graphs are what parity checked
    assert "fp32 parity vs PyTorch" in result.output
    assert "fused: 2 Attention" in result.output
    before = (dest / "magretrieve.json").read_text()

    again = _cli(str(tiny_model_dir), str(dest), "--mode", "dot")
    assert again.exit_code == 1
    assert "already exists; pass --overwrite" in again.output
    assert (dest / "magretrieve.json").read_text() == before

    replaced = _cli(
        str(tiny_model_dir), str(dest), "--mode", "dot", "--overwrite", "--exporter", "dynamo"
    )
    assert replaced.exit_code == 0, replaced.output
    manifest = Manifest.load(dest)
    assert manifest.mode == "dot"
    assert manifest.exporter["name"] == "torch.onnx (dynamo)" and manifest.exporter["opset"] == 18
    assert "onnxscript" in manifest.versions
    # dynamo's graph fuses layer norm and GELU but not attention; it still exports
    assert manifest.exporter["optimizer"]["applied"]
    assert not manifest.exporter["optimizer"]["attention_fused"]
    assert _listing(dest.parent) == ["qnorm"]  # no staging folders left behind


def test_cli_model_without_weights_writes_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    broken = shutil.copytree(tiny_model_dir, tmp_path / "no_weights")
    (broken / "model.safetensors").unlink()
    out_parent = tmp_path / "out"
    out_parent.mkdir()
    result = _cli(str(broken), str(out_parent / "exp"), "--mode", "qnorm")
    assert result.exit_code == 1
    assert "cannot load the transformer" in result.output
    assert "Traceback" not in result.output
    assert _listing(out_parent) == []


def test_cli_unwritable_target_writes_nothing(tiny_model_dir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    result = _cli(str(tiny_model_dir), str(blocker / "exp"), "--mode", "qnorm")
    assert result.exit_code == 1
    assert "cannot write there" in result.output
    assert _listing(tmp_path) == ["a_file"]
    assert blocker.read_text() == "not a folder"


def test_parity_failure_writes_nothing_and_keeps_old_export(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model, parity
    from magretrieve.train.encoder import Encoder

    encoder = Encoder.load(tiny_model_dir, mode="qnorm", device="cpu")
    target = tmp_path / "exp"
    export_model(encoder, target, exporter="torchscript")
    fingerprint = Manifest.load(target).model_fingerprint

    monkeypatch.setattr(parity, "MAX_ABS_DIFF", 0.0)  # no real graph is bit-exact
    with pytest.raises(parity.ParityError, match="differs from PyTorch"):
        export_model(encoder, target, exporter="torchscript", overwrite=True)
    assert _listing(tmp_path) == ["exp"]
    assert Manifest.load(target).model_fingerprint == fingerprint  # old export intact


@pytest.mark.slow  # the dynamo exporter: slow by nature
def test_auto_falls_back_when_torchscript_fails(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model, graphs, parity
    from magretrieve.train.encoder import Encoder

    original = graphs.export_side

    def torchscript_breaks(encoder, side, path, exporter="dynamo"):
        if exporter == "torchscript":
            raise RuntimeError("simulated torchscript failure")
        return original(encoder, side, path, exporter=exporter)

    monkeypatch.setattr(graphs, "export_side", torchscript_breaks)
    encoder = Encoder.load(tiny_model_dir, mode="dnorm", device="cpu")
    manifest = Manifest.load(export_model(encoder, tmp_path / "auto", exporter="auto"))
    assert manifest.exporter["name"] == "torch.onnx (dynamo)"
    assert "simulated torchscript failure" in manifest.exporter["failed_attempts"][0]["error"]

    monkeypatch.setattr(parity, "MAX_ABS_DIFF", 0.0)
    with pytest.raises(MagRetrieveError, match="no exporter produced a graph that passes parity"):
        export_model(encoder, tmp_path / "none", exporter="auto")
    assert _listing(tmp_path) == ["auto"]


def test_bad_options_refused_before_work(tiny_model_dir: Path, tmp_path: Path) -> None:
    from magretrieve.export import export_model

    with pytest.raises(ConfigError, match="unknown quantization"):
        export_model(tiny_model_dir, tmp_path / "x", quantize="int4")
    with pytest.raises(ConfigError, match="together with --quantize"):
        export_model(tiny_model_dir, tmp_path / "x", eval_data=tmp_path)
    with pytest.raises(ConfigError, match="unknown exporter"):
        export_model(tiny_model_dir, tmp_path / "x", exporter="optimum")
    (tmp_path / "not_export").mkdir()
    (tmp_path / "not_export" / "precious.txt").write_text("keep")
    with pytest.raises(ConfigError, match="not an export folder"):
        export_model(tiny_model_dir, tmp_path / "not_export", overwrite=True)
    assert (tmp_path / "not_export" / "precious.txt").read_text() == "keep"


def test_int8_with_optimizer_reports_agreement_and_ndcg(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    import onnx

    from magretrieve.core.manifest import Manifest
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    dest = tmp_path / "int8"
    result = _cli(
        str(tiny_model_dir),
        str(dest),
        "--mode",
        "qnorm",
        "--quantize",
        "int8",
        "--optimize",
        "--exporter",
        "torchscript",
        "--eval-data",
        f"{tiny_beir_dir}:test",
    )
    assert result.exit_code == 0, result.output
    manifest = Manifest.load(dest)
    assert manifest.quantization == "int8"
    assert manifest.exporter["optimizer"]["fused_operators"]  # fusions did apply to BERT
    report = manifest.quantization_report
    for side in ("query", "document"):
        assert 0.5 < report[side]["mean_cosine"] <= 1.0 + 1e-6
    ev = report["eval"]
    assert ev["data"].endswith(":test")
    for key in ("fp32", "int8"):
        assert 0.0 <= ev[key]["ndcg@10"] <= 1.0
    assert ev["ndcg@10_delta"] == pytest.approx(ev["int8"]["ndcg@10"] - ev["fp32"]["ndcg@10"])
    assert "NDCG@10 on" in result.output and "int8 query vs fp32" in result.output
    ops = {node.op_type for node in onnx.load(str(dest / "document.onnx")).graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul", "DynamicQuantizeLinear"}
    # the fused attention stays fp32 (QAttention cost ~1 NDCG@10 point on scifact), the
    # embedding table is quantized, and the manifest says which operators were
    assert "Attention" in ops and "QAttention" not in ops
    assert "QEmbedLayerNormalization" in ops and "EmbedLayerNormalization" not in ops
    assert manifest.exporter["quantizer"]["operators"] == [
        "MatMul",
        "EmbedLayerNormalization",
        "Gather",
    ]
    q = OnnxEncoder.load(dest).encode_queries(TEXTS)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-4)  # still unit-norm


def test_manifest_json_printed(tiny_model_dir: Path, tmp_path: Path) -> None:
    result = _cli(
        str(tiny_model_dir),
        str(tmp_path / "e"),
        "--mode",
        "cosine",
        "--exporter",
        "torchscript",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{") :])
    assert data["index_metric"] == "inner_product"
    assert data["graphs"]["query"]["contract"] == "unit_norm"


@pytest.mark.slow
def test_minilm_qnorm_export_parity(tmp_path: Path) -> None:
    """The real all-MiniLM-L6-v2 (packaged, offline), zero-shot qnorm, default exporter."""
    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    out = export_model("all-MiniLM-L6-v2", tmp_path / "minilm", mode="qnorm")
    manifest = Manifest.load(out)
    assert manifest.dimension == 384 and manifest.max_document_length == 256
    # parity is checked on the fused graphs: 6 layers → 6 Attention, 12 SkipLayerNorm, 6 GELU
    assert manifest.parity["max_abs_diff"] <= 1e-4 and manifest.parity["max_rel_norm_err"] <= 1e-5
    assert manifest.exporter["name"] == "torch.onnx (torchscript)"
    assert manifest.exporter["optimizer"]["fused_operators"] == {
        "EmbedLayerNormalization": 1,
        "Attention": 6,
        "BiasGelu": 6,
        "SkipLayerNormalization": 12,
    }
    q = OnnxEncoder.load(out).encode_queries(["does aspirin reduce heart attack risk?"])
    assert q.shape == (1, 384)
    np.testing.assert_allclose(np.linalg.norm(q), 1.0, atol=1e-5)
