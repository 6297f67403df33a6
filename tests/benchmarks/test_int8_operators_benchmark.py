"""benchmarks/studies/int8_operators.py at smoke size (tiny BERT, tiny BEIR): each variant is a valid
int8 export whose graphs hold exactly the quantized operators it names, and the table's
losses and ratios are computed from its own rows. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def smoke(tiny_st_dir: Path, tiny_beir_dir: Path, tmp_path_factory) -> tuple[dict, Path, Path]:
    bench = load_benchmark("studies/int8_operators")
    cache = tmp_path_factory.mktemp("cache")
    out = tmp_path_factory.mktemp("results") / "int8_operators"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MAGRETRIEVE_CACHE", str(cache))
        result = bench.main(
            ["--model", str(tiny_st_dir), "--data", str(tiny_beir_dir), "--threads", "1",
             "--lock", "", "--out", str(out)],
            standalone_mode=False,  # click: return the result instead of exiting
        )  # fmt: skip
    return result, out, cache / "int8_operators" / "qnorm"


def _ops(folder: Path) -> set[str]:
    return {n.op_type for n in onnx.load(str(folder / "document.onnx")).graph.node}


def test_variants_are_valid_exports_with_the_operators_they_name(smoke) -> None:
    from magretrieve.core.manifest import Manifest

    _, _, work = smoke
    fp32 = _ops(work / "fp32")
    assert "Attention" in fp32  # the tiny BERT fuses, so the variants differ
    every, shipped, matmul = (_ops(work / f"int8-{n}") for n in range(3))
    assert "QAttention" in every and "QEmbedLayerNormalization" in every
    assert "Attention" in shipped and "QAttention" not in shipped
    assert "QEmbedLayerNormalization" in shipped
    assert "EmbedLayerNormalization" in matmul and "QEmbedLayerNormalization" not in matmul
    for n in range(3):
        manifest = Manifest.load(work / f"int8-{n}")  # hashes and seal verified
        assert manifest.quantization == "int8"
    assert Manifest.load(work / "int8-1").exporter["quantizer"]["operators"] == [
        "MatMul",
        "EmbedLayerNormalization",
        "Gather",
    ]


def test_rows_losses_and_table_agree(smoke) -> None:
    result, out, _ = smoke
    rows = result["rows"]
    assert list(rows) == ["fp32", *load_benchmark("studies/int8_operators").VARIANTS]
    for row in rows.values():
        assert 0.0 <= row["ndcg@10"] <= 1.0 and row["docs_s"] > 0
        assert row["ndcg_loss_points"] == pytest.approx(
            (rows["fp32"]["ndcg@10"] - row["ndcg@10"]) * 100
        )
        assert row["speed_vs_fp32"] == pytest.approx(row["docs_s"] / rows["fp32"]["docs_s"])
    assert rows["fp32"]["speed_vs_fp32"] == 1.0
    assert rows["all (QAttention too)"]["graph_mb"] < rows["fp32"]["graph_mb"]
    assert json.loads(out.with_suffix(".json").read_text())["rows"] == rows
    text = out.with_suffix(".md").read_text()
    for key, row in rows.items():
        assert f"| {key} |" in text and f"{row['ndcg@10']:.4f}" in text
