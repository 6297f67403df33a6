"""benchmarks/batch_budget.py at smoke size (tiny BERT, tiny BEIR): every runtime runs at every
budget, the ratios, the best budget, the table and the plot come from the run's own numbers.
No timing is asserted (only that rates are positive)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from magretrieve.core.batching import DEFAULT_BATCH_TOKENS
from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("batch_budget")


@pytest.fixture(scope="module")
def smoke(bench, tiny_st_dir: Path, tiny_beir_dir: Path, tmp_path_factory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("results") / "batch_budget"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MAGRETRIEVE_CACHE", str(tmp_path_factory.mktemp("cache")))
        result = bench.main(
            ["--model", str(tiny_st_dir), "--data", str(tiny_beir_dir),
             "--calibration-data", str(tiny_beir_dir), "--docs", "30", "--rounds", "2",
             "--budgets", "16,64", "--threads", "1", "--lock", "", "--out", str(out)],
            standalone_mode=False,  # click: return the result instead of exiting
        )  # fmt: skip
    return result, out


def test_every_runtime_at_every_budget(bench, smoke) -> None:
    result, out = smoke
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["budgets"] == [16, 64] and data["default_budget"] == DEFAULT_BATCH_TOKENS
    assert {"eager", "ort_fp32", "ort_int8", "ov_fp32", "ov_int8"} <= set(data["runtimes"])
    assert set(data["runtimes"]) <= set(bench.RUNTIMES)
    for runtime in data["runtimes"]:
        for budget in (16, 64):
            rate = data["docs_s"][f"{runtime}@{budget}"]
            assert rate > 0
            # each cell is the column's rate over the peer's, from the same run
            assert data["vs_st"][runtime][str(budget)] == pytest.approx(rate / data["docs_s"]["st"])
        row = data["vs_st"][runtime]
        assert row[str(data["best_budget"][runtime])] == max(row.values())


def test_table_and_plot_show_the_runs_numbers(smoke) -> None:
    result, out = smoke
    md = out.with_suffix(".md").read_text()
    assert md.count("\n| ") == 1 + len(result["runtimes"])  # header + one row per runtime
    for runtime, label in result["runtimes"].items():
        line = next(line for line in md.splitlines() if line.startswith(f"| {label} |"))
        best = result["best_budget"][runtime]
        assert f"**{result['vs_st'][runtime][str(best)]:.2f}×**" in line  # the best is bold
        assert line.count("**") == 2
    assert f"```\n{result['command']}\n```" in md
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
