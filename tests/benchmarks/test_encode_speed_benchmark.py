"""benchmarks/encode_speed.py at smoke size on the tiny sentence-transformers folder and tiny
BEIR: every column runs, each text is encoded once per column across the rounds, the table,
JSON and goals agree with each other, and NDCG comes from the timed vectors. No timing is
asserted (only that rates are positive numbers)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("encode_speed")


@pytest.fixture(scope="module")
def smoke(bench, tiny_st_dir: Path, tiny_beir_dir: Path, tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("encode_speed") / "encode_speed"
    result = bench.main(
        [
            "--model",
            str(tiny_st_dir),
            "--data",
            str(tiny_beir_dir),
            "--calibration-data",
            str(tiny_beir_dir),
            "--rounds",
            "2",
            "--threads",
            "1",
            "--lock",
            "",
            "--out",
            str(out),
        ],
        standalone_mode=False,  # click: return the result instead of exiting
    )
    return result, out


def test_rotated_and_ratio_by_hand(bench) -> None:
    assert bench.rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert bench.rotated(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert bench.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    rows = {"x": {"docs_s": 30.0, "p50": 2.0}, "y": {"docs_s": 10.0, "p50": 8.0}}
    assert bench.ratio(rows, "x", "y", "docs_s") == 3.0  # throughput: higher is faster
    assert bench.ratio(rows, "x", "y", "p50") == 4.0  # latency: lower is faster


def test_corpus_slices_keep_lines_and_split_by_id(bench, tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    lines = [json.dumps({"_id": f"d{i}", "text": f"t{i}"}) for i in range(5)]
    corpus.write_text("\n".join(lines) + "\n\n")
    paths = bench.write_corpus_slices(corpus, [["d0", "d3"], ["d4", "d1"]], tmp_path)
    assert paths[0].read_text() == lines[0] + "\n" + lines[3] + "\n"
    assert paths[1].read_text() == lines[1] + "\n" + lines[4] + "\n"  # file order kept


def rows_ndcg(data: dict, key: str) -> float:
    return data["rows"][key]["ndcg@10"]


def test_every_column_runs_and_outputs_agree(bench, smoke, tiny_beir_dir: Path) -> None:
    result, out = smoke
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["rows"] == json.loads(json.dumps(result["rows"]))
    n_docs = sum(1 for line in (tiny_beir_dir / "corpus.jsonl").open() if line.strip())
    assert data["documents"] == n_docs and data["rounds"] == 2
    assert set(data["columns"]) <= set(bench.COLUMNS)
    assert {"st", "eager", "fp32", "int8", "index", "ov_fp32", "ov_int8"} <= set(data["columns"])
    for key in data["columns"]:
        assert data["rows"][key]["docs_s"] > 0
        assert len(data["per_round_docs_s"][key]) == 2
    for key in set(bench.QUERY_COLUMNS) & set(data["columns"]):
        assert 0 < data["rows"][key]["p50"] <= data["rows"][key]["p95"]
    # OpenVINO runs the same fp32 files: same ranking quality (the tiny corpus's NDCG)
    assert rows_ndcg(data, "ov_fp32") == pytest.approx(rows_ndcg(data, "fp32"), abs=1e-9)
    rows = data["rows"]
    assert data["ratios"]["fp32"]["docs_vs_st"] == pytest.approx(
        rows["fp32"]["docs_s"] / rows["st"]["docs_s"]
    )
    assert data["ratios"]["int8"]["p50_vs_eager"] == pytest.approx(
        rows["eager"]["p50"] / rows["int8"]["p50"]
    )
    goals = {g["goal"]: g for g in data["goals"]}
    e2e = goals["end-to-end index vs ONNX fp32 encoding"]
    assert e2e["ratio"] == pytest.approx(rows["index"]["docs_s"] / rows["fp32"]["docs_s"])
    assert e2e["met"] == (e2e["ratio"] >= 0.9)
    for what, column in (
        ("int8 NDCG@10 loss vs fp32 (points)", "int8"),
        ("static int8 NDCG@10 loss vs fp32 (points)", "ov_int8"),
    ):
        loss = goals[what]
        assert loss["loss_points"] == pytest.approx(
            (rows["fp32"]["ndcg@10"] - rows[column]["ndcg@10"]) * 100
        )
        assert loss["met"] == (loss["loss_points"] <= 0.5)
    static = goals["documents: static int8 on OpenVINO vs sentence-transformers"]
    assert static["ratio"] == pytest.approx(rows["ov_int8"]["docs_s"] / rows["st"]["docs_s"])
    assert data["calibration_data"] == tiny_beir_dir.name
    assert data["exporter"]["optimizer"]["applied"]  # the benchmark measures fused graphs
    md = out.with_suffix(".md").read_text()
    assert data["command"].startswith("python ") and data["command"] in md
    assert data["machine"] in md
    assert f"{data['ratios']['int8']['docs_vs_st']:.2f}×" in md
    assert "/tmp/" not in data["machine"]


def test_ndcg_comes_from_the_timed_vectors(smoke, tiny_beir_dir: Path) -> None:
    """Re-encode with a fresh export of the same model: the NDCG must be the same number."""
    from magretrieve.core.metrics import retrieval_metrics
    from magretrieve.data.readers import load_beir
    from magretrieve.evaluation.retrieval import exact_run
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    result, _ = smoke
    folder = Path(result["_export_dirs"]["fp32"])
    dataset = load_beir(f"{tiny_beir_dir}:test")
    enc = OnnxEncoder.load(folder)
    qids, dids = list(dataset.queries), list(dataset.corpus)
    docs = enc.encode_documents([dataset.corpus[d].full_text for d in dids], batch_size=1)
    queries = enc.encode_queries([dataset.queries[q] for q in qids], batch_size=1)
    assert np.isfinite(docs).all()
    want = retrieval_metrics(dataset.qrels, exact_run(queries, docs, qids, dids))["ndcg@10"]
    assert result["rows"]["fp32"]["ndcg@10"] == pytest.approx(want, abs=1e-6)
