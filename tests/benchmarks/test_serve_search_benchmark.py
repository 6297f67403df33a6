"""benchmarks/serve_search.py end to end on the tiny export and a few thousand vectors, and its
goal arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration

#: The in-process rates with the goal cell's client count of queries in hand; the ceiling is
#: the fastest (``search_batch`` of every text at once is measured beside them, not in it).
QPS_KEYS = ("qps_one_at_a_time", "qps_concurrent", "qps_chunks")


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("serve_search")


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory, tiny_model_dir) -> Path:
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("serve-search") / "export"
    export_model(tiny_model_dir, out, mode="qnorm", exporter="torchscript", overwrite=True)
    return out


def test_a_tiny_run_serves_every_cell_with_recall_and_keeps_every_write(
    bench, tiny_export, tiny_beir_dir, tmp_path
) -> None:
    stem = tmp_path / "serve_search"
    args = ["--sizes", "3000", "--stores", "faiss-hnsw,scann", "--export", str(tiny_export),
            "--source", "export", "--data", str(tiny_beir_dir), "--clusters", "3",
            "--clients", "1,4", "--seconds", "1", "--warmup", "0.3", "--write-clients", "2",
            "--write-requests", "1", "--write-search-clients", "2", "--lock", "",
            "--cache", str(tmp_path / "cache"), "--out", str(stem)]  # fmt: skip
    result = CliRunner().invoke(bench.main, args)
    assert result.exit_code == 0, result.output
    r = json.loads(stem.with_suffix(".json").read_text())
    assert set(r["runs"]) == {"faiss-hnsw@3000", "scann@3000"}
    for run in r["runs"].values():
        assert run["serve"]["exit_code"] == 0
        for cell in ("search@1", "search@4"):
            s = run["serve"][cell]
            assert s["requests"] > 0 and s["errors"] == 0
            assert 0.0 <= s["recall"] <= 1.0 and s["answers_checked"] > 0
        # in-process and served hits come from the same store and export
        assert run["serve"]["search@1"]["recall"] == pytest.approx(
            run["ceiling"]["recall"], abs=0.05
        )
        # the ceiling is measured before and after the cells; the ratio uses their mean
        c = run["ceiling"]
        assert c["qps"] == pytest.approx((c["before"]["qps"] + c["after"]["qps"]) / 2)
        assert run["goals"]["vs_ceiling"] == pytest.approx(
            run["serve"]["search@4"]["qps"] / c["qps"]
        )
        # the goal cell's client count of threads called Retriever.search at once
        assert c["concurrency"] == 4 and c["before"]["concurrency"] == 4
        assert 0 < c["qps_concurrent"] <= c["qps"]
        assert c["qps"] == pytest.approx(
            (max(c["before"][k] for k in QPS_KEYS) + max(c["after"][k] for k in QPS_KEYS)) / 2
        )
        assert c["recall_concurrent"] == pytest.approx(c["recall"], abs=0.05)
        assert c["recall_chunks"] == pytest.approx(c["recall"], abs=0.05)
        # all texts at once is reported beside the ceiling, with its own ratio
        assert c["qps_batched"] > 0 and c["qps_chunks"] > 0
        assert run["goals"]["vs_all_at_once"] == pytest.approx(
            run["serve"]["search@4"]["qps"] / c["qps_batched"]
        )
        assert run["goals"]["vs_same_concurrency"] == pytest.approx(
            run["serve"]["search@4"]["qps"] / c["qps_concurrent"]
        )
        w = run["writes"]
        # a fixed amount of work: 2 clients x 1 request x 64 documents, all acknowledged
        assert w["http"]["documents"] == 128 and w["acknowledged"] == 128
        assert w["missing_after"] == 0 and w["in_process_missing_after"] == 0
        assert w["count_after"] == 3000 + 128 + 128
        assert w["exit_code"] == 0
        # searches ran beside the writes, with the key the write server needs
        sw = w["search_during_writes"]
        assert sw["errors"] == 0 and sw["qps"] > 0 and 0.0 <= sw["recall"] <= 1.0
        assert run["goals"]["met"]["zero errors"] is True
    # the built stores are cached and a second run reuses them; its rows merge into the file
    assert (tmp_path / "cache" / "stores-3000" / "scann.json").is_file()
    again = CliRunner().invoke(
        bench.main, [*args[:2], "--stores", "scann", *args[4:], "--write-clients", "0"]
    )
    assert again.exit_code == 0, again.output
    r2 = json.loads(stem.with_suffix(".json").read_text())
    assert r2["runs"]["scann@3000"]["build"]["cached"] is True
    assert "writes" not in r2["runs"]["scann@3000"] and "writes" in r2["runs"]["faiss-hnsw@3000"]
    md = stem.with_suffix(".md").read_text()
    assert "## `scann:` scann at 3,000 vectors" in md and "PASS: zero errors" in md
    assert md.count(" before the cells and ") == 2  # each store's ceiling says how it was taken
    assert md.count("4 threads calling it at once") == 2
    assert md.count("calling `Retriever.search` from 4 threads") == 2
    assert md.count("`search_batch` of 4 texts at a time") == 2
    assert md.count("; not in it: `search_batch` of all ") == 2
    assert md.count("at once (not a goal: a server with 4 requests in flight") == 2


def test_goal_arithmetic(bench) -> None:
    def cell(
        qps: float, p50: float = 10.0, p99: float = 20.0, errors: int = 0, recall: float = 0.99
    ) -> dict:
        return {"qps": qps, "p50_ms": p50, "p99_ms": p99, "errors": errors, "recall": recall}

    run = {
        "ceiling": {"qps": 100.0},
        "raw_bytes": 1000 * 2**20,
        "model_bytes": 100 * 2**20,
        "serve": {"search@8": cell(70, 10, 35), "search@32": cell(85, recall=0.98), "rss_max_mb": 2050.0},
        "writes": {"http": {"errors": 1}, "search_during_writes": {"errors": 0}, "missing_after": 0},
    }  # fmt: skip
    g = bench.goals(run, [8, 32])
    assert g["vs_ceiling"] == pytest.approx(0.85)
    assert g["vs_same_concurrency"] is None  # a ceiling taken without threads
    run["ceiling"]["qps_concurrent"] = 50.0
    assert bench.goals(run, [8, 32])["vs_same_concurrency"] == pytest.approx(1.7)
    assert g["vs_all_at_once"] is None  # nor with every text at once
    run["ceiling"]["qps_batched"] = 170.0
    assert bench.goals(run, [8, 32])["vs_all_at_once"] == pytest.approx(0.5)
    assert bench.goal_clients([1, 8, 32, 128]) == 32 and bench.goal_clients([1, 4]) == 4
    assert g["p99_over_p50"] == pytest.approx(3.5)
    assert g["rss_budget_mb"] == pytest.approx(2100.0)
    assert g["errors"] == 1
    assert g["met"] == {
        "≥ 0.8× the in-process ceiling at 32 clients": True,
        "served recall@10 ≥ 0.985 at 32 clients": False,
        "p99 ≤ 3.0× p50 at 8 clients": False,
        "zero errors": False,
        "RSS ≤ 2× the raw vectors plus the model": True,
        "every acknowledged write found afterwards": True,
    }


def test_recall_of_counts_overlap_of_the_top_ten(bench) -> None:
    import numpy as np

    truth = np.arange(20).reshape(2, 10)
    # query 0: 7 of its 10 found (order does not matter); query 1: all 10
    found = {0: [9, 8, 7, 6, 5, 4, 3, 100, 101, 102], 1: list(range(10, 20))}
    assert bench.recall_of(found, truth) == pytest.approx((0.7 + 1.0) / 2)
    assert np.isnan(bench.recall_of({}, truth))
