"""benchmarks/train_speed.py at smoke size on the tiny sentence-transformers folder and tiny BEIR:
the four configurations run, the table and JSON agree, and the token counts that measure padding
are exact. No timing is asserted (only that rates are positive numbers)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from magretrieve.data.readers import load_training_data
from magretrieve.train.encoder import Encoder
from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration

LABELS = ["ours fp32", "sentence-transformers fp32", "ours bf16", "sentence-transformers bf16"]
KEYS = ["ours-fp32", "st-fp32", "ours-bf16", "st-bf16"]


@pytest.fixture(scope="module")
def speed():
    return load_benchmark("train_speed")


@pytest.fixture(scope="module")
def smoke(speed, tiny_st_dir: Path, tiny_beir_dir: Path, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("train_speed")
    args = [
        "--model", str(tiny_st_dir),
        "--train", f"{tiny_beir_dir}:train",
        "--batch-size", "3",
        "--lr", "1e-4",
        "--max-doc-length", "48",
        "--steps", "2",
        "--warmup-steps", "1",
        "--rounds", "1",
        "--threads", "1",
        "--out", str(out),
        "--name", "smoke",
    ]  # fmt: skip
    result = CliRunner().invoke(speed.main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    table = (out / "smoke.md").read_text()
    rows = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if cells[0] in LABELS:
            rows[cells[0]] = cells
    return {"out": out, "table": table, "rows": rows, "stdout": result.stdout}


def test_table_has_four_rows_and_ours_are_numbers(smoke: dict) -> None:
    assert list(smoke["rows"]) == LABELS
    assert smoke["table"] in smoke["stdout"]
    assert "Command: `python " in smoke["table"] and "torch threads" in smoke["table"]
    for label in ("ours fp32", "ours bf16"):
        _, median, rounds, ratio, real, padded, waste = smoke["rows"][label]
        assert float(median) > 0 and float(rounds) == float(median)  # one round
        assert float(padded) >= float(real) > 0
        assert 0 <= float(waste.rstrip("%")) < 100
        assert ratio == "–" or float(ratio.rstrip("x")) > 0


def test_json_matches_the_table_and_counts_tokens_exactly(
    smoke: dict, tiny_st_dir: Path, tiny_beir_dir: Path
) -> None:
    data = json.loads((smoke["out"] / "smoke.json").read_text())
    assert data["settings"]["steps"] == 2 and data["threads"] == 1
    assert [r["config"] for r in data["runs"]] == KEYS
    summary = data["summary"]
    for key, label in zip(KEYS, LABELS, strict=True):
        if "error" in summary[key]:
            assert smoke["rows"][label][1] == f"error: {summary[key]['error']}"
            continue
        assert smoke["rows"][label][1] == f"{summary[key]['median']:.3f}"

    # 6 pairs in batches of 3: the first two batches hold every pair exactly once, so their
    # real tokens equal the token lengths of all queries and positives (limit 48 on both sides).
    pairs = load_training_data(f"{tiny_beir_dir}:train")
    enc = Encoder.load(tiny_st_dir, "cosine", max_query_length=48, max_document_length=48)
    expected = sum(enc.token_lengths([p.query for p in pairs], "query")) + sum(
        enc.token_lengths([p.positive for p in pairs], "document")
    )
    for run in data["runs"]:
        if "error" in run:
            continue
        assert len(run["tokens"]) == len(run["padded_tokens"]) == 3  # warm-up + timed steps
        assert sum(run["tokens"][:2]) == expected, run["config"]
        assert all(p >= t for p, t in zip(run["padded_tokens"], run["tokens"], strict=True))


def test_sentence_transformers_rows(smoke: dict) -> None:
    # Only a missing package skips; an installed sentence-transformers that fails in fp32 fails.
    if importlib.util.find_spec("sentence_transformers") is None:
        pytest.skip("sentence-transformers is not installed (extra magretrieve[peer])")
    rows = smoke["rows"]
    st32 = rows["sentence-transformers fp32"]
    assert not st32[1].startswith("error:"), f"sentence-transformers fp32 failed: {st32[1]}"
    assert float(st32[1]) > 0 and st32[3] == "1.00x"
    for label in ("ours fp32", "ours bf16"):
        ratio = float(rows[label][3].rstrip("x"))
        assert ratio == pytest.approx(float(rows[label][1]) / float(st32[1]), rel=0.01)
    st16 = rows["sentence-transformers bf16"]
    assert st16[1].startswith("error: ") or float(st16[1]) > 0


def test_timed_rate_skips_warmup_steps(speed) -> None:
    ends = [1.0, 2.0, 3.0, 5.0]  # ends of steps 1..4
    assert speed.timed_rate(ends, warmup=2) == pytest.approx(2 / 3)  # steps 3-4 in 5 - 2 s
    assert speed.timed_rate(ends, warmup=0, start=0.5) == pytest.approx(4 / 4.5)
    assert math.isnan(speed.timed_rate([1.0, 1.0], warmup=1))
    with pytest.raises(ValueError, match="none to time"):
        speed.timed_rate([1.0, 2.0], warmup=2)


def test_padding_stats_and_error_rows(speed) -> None:
    stats = speed.padding_stats([30, 50], [40, 60])
    assert stats == pytest.approx({"tokens": 40.0, "padded_tokens": 50.0, "waste": 0.2})
    records = [
        {"config": "ours-fp32", "steps_per_second": 2.0, "tokens": [30], "padded_tokens": [40]},
        {"config": "ours-fp32", "steps_per_second": 4.0, "tokens": [50], "padded_tokens": [60]},
        {"config": "st-fp32", "steps_per_second": 1.0, "tokens": [30], "padded_tokens": [60]},
        {"config": "st-bf16", "error": "ValueError: bf16 needs a GPU"},
    ]
    summary = speed.summarize(records)
    assert summary["ours-fp32"]["median"] == 3.0 and summary["ours-fp32"]["vs_st_fp32"] == 3.0
    assert summary["st-fp32"]["waste"] == pytest.approx(0.5)
    meta = {
        "command": "cmd",
        "cpu": {"model": "cpu", "bf16_units": []},
        "threads": 2,
        "versions": {"torch": "t", "transformers": "x", "sentence_transformers": "s"},
        "settings": {
            k: 1
            for k in (
                "model", "train", "batch_size", "lr", "scale", "max_doc_length", "steps",
                "warmup_steps", "rounds",
            )
        },
    }  # fmt: skip
    table = speed.markdown(summary, meta)
    assert "| ours fp32 | 3.000 | 2.000, 4.000 | 3.00x | 40 | 50 | 20.0% |" in table
    assert "| sentence-transformers bf16 | error: ValueError: bf16 needs a GPU |" in table
    assert "bf16 units: none" in table
