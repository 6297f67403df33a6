"""benchmarks/encode_breakdown.py: its arithmetic by hand, and a smoke run (tiny BERT, tiny BEIR)
whose tables come from its own numbers. No timing is asserted (only that rates are positive)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("encode_breakdown")


def test_flop_counts_by_hand(bench) -> None:
    # hidden 4, intermediate 8, 2 layers: qkv 2*4*12 = 96 per layer; other 2*(16+32+32) = 160
    assert bench.linear_flops_per_token(4, 8, 2) == {"qkv": 192, "other": 320}
    # QKᵀ and A·V: 2 products × 2 FLOPs × rows × L² × hidden, per layer
    assert bench.attention_flops([(2, 3), (1, 5)], hidden=4, layers=2) == 2 * (
        4 * 2 * 9 * 4 + 4 * 1 * 25 * 4
    )
    assert bench.speedup_bound(12.0, 8.0) == 1.5


def test_profile_and_torch_grouping(bench) -> None:
    events = [
        {"cat": "Node", "name": "mm1_kernel_time", "dur": 2_000_000, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "mm2_kernel_time", "dur": 500_000, "args": {"op_name": "MatMul"}},
        {"cat": "Node", "name": "att_fence_before", "dur": 9, "args": {"op_name": "Attention"}},
        {"cat": "Node", "name": "att_kernel_time", "dur": 1_000_000, "args": {"op_name": "Attention"}},
        {"cat": "Session", "name": "model_run", "dur": 9_000_000},
    ]  # fmt: skip
    assert bench.aggregate_ort_profile(events) == {"MatMul": 2.5, "Attention": 1.0}
    groups = bench.torch_groups(
        {"aten::addmm": 3.0, "aten::_scaled_dot_product_flash_attention_for_cpu": 1.0,
         "aten::gelu": 0.5, "aten::copy_": 0.25}
    )  # fmt: skip
    assert groups == {
        "matrix products (linear layers)": 3.0,
        "attention (SDPA)": 1.0,
        "everything else": 0.75,
    }


def test_fp32_headroom_by_hand(bench) -> None:
    # peer 30 s; goal 1.5x -> 20 s; best bound 2.0x -> matrix products 15 s; 5 s left;
    # onnxruntime's operators other than MatMul and Attention: 2 + 1 = 3 s
    result = {
        "seconds_per_pass": {"st": 30.0},
        "bounds_vs_st": {"fp32_at_best_gemm": 1.5, "fp32_at_onnxruntime_graph_rate": 2.0},
        "operators_seconds": {
            "ort_fp32": {"MatMul": 9.0, "Attention": 4.0, "SkipLayerNormalization": 2.0,
                         "BiasGelu": 1.0}
        },
    }  # fmt: skip
    text = bench.fp32_headroom(result)
    assert "may take 20.00 s" in text and "takes 15.00 s" in text
    assert "leaves 5.00 s" in text and "alone took 3.00 s" in text


def test_rounds_rotate_the_columns(bench) -> None:
    assert bench.rotated(["a", "b", "c"], 2) == ["c", "a", "b"]


def test_smoke_run_reports_its_own_numbers(
    bench, tiny_st_dir: Path, tiny_beir_dir: Path, tmp_path_factory
) -> None:
    out = tmp_path_factory.mktemp("results") / "encode_breakdown"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MAGRETRIEVE_CACHE", str(tmp_path_factory.mktemp("cache")))
        result = bench.main(
            ["--model", str(tiny_st_dir), "--data", str(tiny_beir_dir), "--docs", "40",
             "--rounds", "2", "--threads", "1", "--lock", "", "--out", str(out)],
            standalone_mode=False,  # click: return the result instead of exiting
        )  # fmt: skip
    from magretrieve.serving.openvino_session import bf16_native

    expected = set(bench.COLUMNS) - (set() if bf16_native() else {"ov_bf16"})
    assert set(result["columns"]) == set(result["seconds_per_pass"]) == expected
    assert all(len(v) == 2 for v in result["per_round_seconds"].values())
    assert result["vs_st"]["st"] == pytest.approx(1.0)
    # the ONNX columns run the library's default budget, as encode_documents does
    from magretrieve.core.batching import DEFAULT_BATCH_TOKENS

    assert result["max_batch_tokens"] == DEFAULT_BATCH_TOKENS
    # the same fused graph on two runtimes computes the same vectors
    assert result["openvino_vs_onnxruntime_max_abs_diff"] < 1e-4
    fp32_ops, int8_ops = (
        result["operators_seconds"]["ort_fp32"],
        result["operators_seconds"]["ort_int8"],
    )
    assert "Attention" in fp32_ops and "MatMul" in fp32_ops
    assert "DynamicQuantizeMatMul" in int8_ops and "Attention" in int8_ops
    assert all(r > 0 for r in result["gemm_gflops"].values())
    flops = result["flops"]
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(str(tiny_st_dir))
    per_token = bench.linear_flops_per_token(
        cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    )
    assert flops["qkv"] == per_token["qkv"] * result["tokens_padded"]
    assert flops["other_linear"] == per_token["other"] * result["tokens_padded"]
    st = result["seconds_per_pass"]["st"]
    total = sum(flops.values())
    assert result["bounds_vs_st"]["fp32_at_best_gemm"] == pytest.approx(
        st / (total / max(result["gemm_gflops"].values()) / 1e9)
    )
    assert (
        json.loads(out.with_suffix(".json").read_text())["bounds_vs_st"] == result["bounds_vs_st"]
    )
    text = out.with_suffix(".md").read_text()
    assert result["command"] in text
    for key, label in result["columns"].items():
        assert f"| {label} | {result['vs_st'][key]:.2f}× |" in text
    assert f"{result['bounds_vs_st']['int8_attention_fp32']:.2f}×" in text
