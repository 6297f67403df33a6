"""benchmarks/serve_load.py end to end on the tiny export (no peer), and its goal arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("serve_load")


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory, tiny_model_dir) -> Path:
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("serve-load") / "export"
    export_model(tiny_model_dir, out, mode="qnorm", exporter="torchscript", overwrite=True)
    return out


def test_a_short_run_writes_results_with_no_error_and_no_lost_write(
    bench, tiny_export, tiny_beir_dir, tmp_path
) -> None:
    stem = tmp_path / "serve_load"
    result = CliRunner().invoke(
        bench.main,
        ["--export", str(tiny_export), "--data", str(tiny_beir_dir), "--clients", "1,4",
         "--doc-clients", "2", "--doc-requests", "2", "--seconds", "1.5", "--warmup", "0.5", "--soak-seconds", "4",
         "--soak-clients", "4", "--upsert-every", "2", "--lock", "", "--out", str(stem)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    r = json.loads(stem.with_suffix(".json").read_text())
    for key in ("batching", "no_spinning", "one_worker", "no_batching"):
        assert set(r[key]) == {"query@1", "query@4", "documents@2", "exit_code"}
        assert r[key]["exit_code"] == 0
        for cell in ("query@1", "query@4", "documents@2"):
            assert r[key][cell]["requests"] > 0 and r[key][cell]["errors"] == 0
    # the document cell is a fixed amount of work: 2 clients x 2 requests x 32 documents
    assert r["batching"]["documents@2"]["requests"] == 4
    assert r["batching"]["documents@2"]["texts"] == 128
    soak = r["soak"]
    assert soak["writes_acknowledged"] > 0 and soak["lost_writes"] == 0
    assert soak["server_errors"] == 0 and soak["exit_code"] == 0
    # the seeded documents (the tiny corpus has 12) plus every id written (4 slots of 4 ids at most)
    assert soak["store_count_after"] == 12 + soak["ids_written"]
    assert 0 < soak["ids_written"] <= 4 * 4 * bench.SOAK_SLOTS
    md = stem.with_suffix(".md").read_text()
    assert "| batch-1 queries × 4 clients | serve, batching on |" in md
    assert "## Goals" in md and "Infinity" not in md.split("## Goals")[1]


def test_goal_arithmetic(bench) -> None:
    def cell(tps: float, p50: float = 10.0, p99: float = 20.0, errors: int = 0) -> dict:
        return {"texts_per_s": tps, "p50_ms": p50, "p99_ms": p99, "errors": errors}

    r = {
        "ceiling": {"query": 1000.0, "documents": 400.0},
        "batching": {"query@8": cell(600, 10, 25), "query@32": cell(850), "documents@8": cell(300)},
        "no_batching": {"query@8": cell(300), "query@32": cell(425, errors=2), "documents@8": cell(280), "exit_code": 0},
        "infinity": {"query@8": cell(200), "query@32": cell(500), "documents@8": cell(150)},
        "soak": {"lost_writes": 0, "server_errors": 0, "errors": 0, "rss_growth": 0.06},
    }  # fmt: skip
    g = bench.goals(r, [8, 32], 8)
    assert g["vs_ceiling"] == pytest.approx(0.85)
    assert g["vs_infinity"] == pytest.approx(1.7)
    assert g["batching_vs_off"] == pytest.approx(2.0)
    assert g["documents_vs_ceiling"] == pytest.approx(0.75)
    assert g["documents_vs_infinity"] == pytest.approx(2.0)
    assert g["p99_over_p50"] == pytest.approx(2.5)
    assert g["errors"] == 2
    r["infinity"]["documents@8"] = cell(0.0)  # no answer in time: a ratio, not a crash
    assert bench.goals(r, [8, 32], 8)["documents_vs_infinity"] == float("inf")
    assert g["met"] == {
        "≥ 0.8× ceiling at 32 clients": True,
        "p99 ≤ 3.0× p50 at 8 clients": True,
        "zero errors": False,
        "≥ 1.5× Infinity at 32 clients": True,
        "soak: no lost write, no 5xx": True,
        "soak: RSS growth < 5%": False,
    }


def test_goals_and_table_of_a_query_only_run(bench, tmp_path) -> None:
    def cell(tps: float) -> dict:
        return {"texts_per_s": tps, "p50_ms": 10.0, "p95_ms": 15.0, "p99_ms": 20.0, "errors": 0}

    r = {
        "command": "serve_load.py --cells queries", "machine": "m", "threads": 2, "model": "x",
        "mode": "qnorm", "data": "d", "cells": "queries", "warmup": 1, "seconds_per_cell": 2, "wall_seconds": 60,
        "ceiling": {"query": 200.0, "query_batched": 150.0, "query_one_at_a_time": 200.0},
        "batching": {"query@8": cell(170), "query@32": cell(180), "exit_code": 0},
        "no_batching": {"query@8": cell(160), "query@32": cell(150), "exit_code": 0},
    }  # fmt: skip
    r["goals"] = g = bench.goals(r, [8, 32], 8)
    assert g["vs_ceiling"] == pytest.approx(0.9)
    assert g["batching_vs_off"] == pytest.approx(1.2)
    assert "documents_vs_ceiling" not in g
    bench.write(r, tmp_path / "q")
    md = (tmp_path / "q.md").read_text()
    assert "query 200 texts/s (batched as the library does 150, one text per call 200)" in md
    assert "| batch-1 queries × 32 clients | serve, batching on | 180 | 0.90 |" in md
    assert "32-document" not in md and "(no document cell, no soak in this run)" in md
