"""benchmarks/serve_load.py end to end on the tiny export (no peer), its goal arithmetic, and how
it runs Infinity's engines (options, command lines, the faster engine, an engine that fails)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import click
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
    # each cell says how much of the CPU other processes took meanwhile (a share of the machine)
    assert all(
        0 <= r[key][c]["other_cpu"] <= 1
        for key in ("batching", "no_batching")
        for c in ("query@1", "documents@2")
    )
    assert "| other CPU |" in stem.with_suffix(".md").read_text()
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
        "infinity_torch": {"query@8": cell(200), "query@32": cell(500), "documents@8": cell(150)},
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
    r["infinity_torch"]["documents@8"] = cell(0.0)  # no answer in time: a ratio, not a crash
    assert bench.goals(r, [8, 32], 8)["documents_vs_infinity"] == float("inf")
    assert g["met"] == {
        "≥ 0.8× ceiling at 32 clients": True,
        "p99 ≤ 3.0× p50 at 8 clients": True,
        "zero errors": False,
        "≥ 1.5× Infinity at 32 clients (its faster engine: torch)": True,
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


def _cell(tps: float) -> dict:
    return {"texts_per_s": tps, "p50_ms": 10.0, "p95_ms": 15.0, "p99_ms": 20.0, "errors": 0}


def _query_run(**peers: dict) -> dict:
    return {
        "command": "serve_load.py", "machine": "m", "threads": 2, "model": "x", "mode": "qnorm",
        "data": "d", "cells": "queries", "warmup": 1, "seconds_per_cell": 2, "wall_seconds": 60,
        "ceiling": {"query": 1000.0},
        "batching": {"query@8": _cell(600), "query@32": _cell(850), "exit_code": 0},
        "infinity_engines": ["optimum", "torch"], "infinity_version": "0.0.78 2.13.0+cpu",
        **peers,
    }  # fmt: skip


def test_engine_options_parse_and_refuse_bad_values(bench) -> None:
    assert bench.parse_engines("optimum,torch") == ["optimum", "torch"]
    assert bench.parse_engines(" torch , optimum ") == ["torch", "optimum"]
    for bad in ("onnx", "torch,torch", "", ","):
        with pytest.raises(click.BadParameter, match="optimum, torch"):
            bench.parse_engines(bad)
    assert bench.parse_model_dirs("") == {}
    assert bench.parse_model_dirs("optimum=onnx-folder, torch=st") == {
        "optimum": Path("onnx-folder"),
        "torch": Path("st"),
    }
    for bad in ("optimum", "optimum=", "gpu=x", "optimum=a,optimum=b"):
        with pytest.raises(click.BadParameter, match="ENGINE=FOLDER"):
            bench.parse_model_dirs(bad)
    # on the command line: refused before any data is read or server started
    result = CliRunner().invoke(
        bench.main, ["--infinity-engines", "onnx", "--data", "no-such-folder"]
    )
    assert result.exit_code == 2 and "--infinity-engines" in result.output
    result = CliRunner().invoke(
        bench.main, ["--infinity-model-dirs", "optimum", "--data", "no-such-folder"]
    )
    assert result.exit_code == 2 and "--infinity-model-dirs" in result.output


def test_each_engine_gets_its_own_command_line(bench, tmp_path) -> None:
    python = str(tmp_path / "venv" / "bin" / "python")
    cli = str(tmp_path / "venv" / "bin" / "infinity_emb")
    cmd, cwd = bench.infinity_command(python, tmp_path / "st", "torch")
    assert cmd[:3] == [cli, "v2", "--model-id"] and cmd[3] == str(tmp_path / "st") and cwd is None
    assert cmd[cmd.index("--engine") + 1] == "torch" and "--pooling-method" not in cmd
    # the ONNX engine: started inside its folder as `.`, mean-pooled
    cmd, cwd = bench.infinity_command(python, tmp_path / "onnx", "optimum")
    assert cmd[3] == "." and cwd == tmp_path / "onnx"
    assert cmd[cmd.index("--engine") + 1] == "optimum"
    assert cmd[cmd.index("--pooling-method") + 1] == "mean"
    with pytest.raises(ValueError, match="unknown Infinity engine 'onnx'"):
        bench.infinity_command(python, tmp_path, "onnx")
    env = bench.infinity_env(2, tmp_path / "hf")
    assert env["HF_HUB_OFFLINE"] == "1" and env["OMP_NUM_THREADS"] == "2"
    assert env["HF_HOME"] == str(tmp_path / "hf")
    assert bench.infinity_env(2).get("HF_HOME") == os.environ.get("HF_HOME")


def test_the_recorded_command_names_the_venv_not_a_machine_path(bench) -> None:
    assert bench.peer_command("python benchmarks/serve_load.py --lock ''", None) == (
        "python benchmarks/serve_load.py --lock ''"
    )
    assert bench.peer_command(
        "python b.py --infinity-python /x/venv/bin/python --cells queries", "/x/venv/bin/python"
    ) == ("python b.py --infinity-python VENV/bin/python --cells queries")
    assert bench.peer_command("python b.py --infinity-python=/x/p", "/x/p") == (
        "python b.py --infinity-python=VENV/bin/python"
    )
    # given through $MAGRETRIEVE_INFINITY_PYTHON: the option is added
    assert (
        bench.peer_command("python b.py", "/x/p") == "python b.py --infinity-python VENV/bin/python"
    )


def test_the_goal_is_stated_against_the_faster_engine(bench, tmp_path) -> None:
    r = _query_run(
        infinity_optimum={"query@8": _cell(300), "query@32": _cell(500), "exit_code": 0, "cosine_to_ours": 0.9999991},
        infinity_torch={"query@8": _cell(100), "query@32": _cell(200), "exit_code": 0, "cosine_to_ours": 1.0},
        infinity_onnx={"provider": "CPUExecutionProvider", "fused": {"Attention": 6},
                       "versions": {"onnxruntime": "1.32.0"}, "onnxruntime_threads": "2"},
    )  # fmt: skip
    r["goals"] = g = bench.goals(r, [8, 32], 8)
    assert g["infinity_faster"] == "optimum"
    assert g["vs_infinity"] == pytest.approx(850 / 500)
    assert g["vs_infinity_engines"] == pytest.approx({"optimum": 1.7, "torch": 4.25})
    assert g["met"]["≥ 1.5× Infinity at 32 clients (its faster engine: optimum)"] is True
    bench.write(r, tmp_path / "e")
    md = (tmp_path / "e.md").read_text()
    assert (
        "| batch-1 queries × 32 clients | Infinity 0.0.78, optimum engine (ONNX, onnxruntime 1.32.0, fused graph) | 500 |"
        in md
    )
    assert (
        "| batch-1 queries × 32 clients | Infinity 0.0.78, torch engine (torch 2.13.0+cpu) | 200 |"
        in md
    )
    assert "**1.70×** Infinity's faster engine (optimum; 4.25× torch)" in md
    assert "(fused: 6 Attention)" in md
    assert (
        "lowest cosine between Infinity's and our query vectors over 16 queries: optimum 0.999999, torch 1.000000"
        in md
    )
    # the other way round: 850 / 640 = 1.33, below the goal, even though 4.25× optimum
    r["infinity_torch"]["query@32"] = _cell(640)
    r["infinity_optimum"]["query@32"] = _cell(200)
    g = bench.goals(r, [8, 32], 8)
    assert g["infinity_faster"] == "torch" and g["vs_infinity"] == pytest.approx(850 / 640)
    assert g["met"]["≥ 1.5× Infinity at 32 clients (its faster engine: torch)"] is False


def test_a_failed_engine_is_named_in_the_goals_and_the_results(bench, tmp_path) -> None:
    r = _query_run(
        infinity_torch={"query@8": _cell(100), "query@32": _cell(200), "exit_code": 0},
        infinity_failures={"optimum": {"stage": "start", "exit_code": 3,
                                       "error": "ValueError: No onnx files found for . and revision None"}},
    )  # fmt: skip
    r["goals"] = g = bench.goals(r, [8, 32], 8)
    assert g["infinity_faster"] == "torch" and g["vs_infinity"] == pytest.approx(4.25)
    assert (
        g["met"]["≥ 1.5× Infinity at 32 clients (its faster engine: torch; optimum did not run)"]
        is True
    )
    bench.write(r, tmp_path / "f")
    md = (tmp_path / "f.md").read_text()
    assert (
        "**Infinity's optimum engine did not run**: it failed at start (exit code 3) with "
        "`ValueError: No onnx files found for . and revision None`"
    ) in md
    # no engine served: the goal is not measured, and says so
    del r["infinity_torch"]
    r["goals"] = g = bench.goals(r, [8, 32], 8)
    assert "vs_infinity" not in g
    assert g["met"]["≥ 1.5× Infinity at 32 clients (optimum did not run)"] is None
    bench.write(r, tmp_path / "f")
    assert (
        "| ≥ 1.5× Infinity at 32 clients (optimum did not run) | **not measured** |"
        in (tmp_path / "f.md").read_text()
    )


def test_other_cpu_is_the_machine_busy_time_not_spent_by_this_benchmark(bench, monkeypatch) -> None:
    # 2 cores for 2 s: 4 CPU-seconds; the machine was busy 3 of them, this benchmark 1
    busy, ours, clock = iter([10.0, 13.0]), iter([5.0, 6.0]), iter([100.0, 102.0])
    monkeypatch.setattr(bench, "_busy", lambda: next(busy))
    monkeypatch.setattr(bench, "_tree_cpu", lambda: next(ours))
    monkeypatch.setattr(bench.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(bench.os, "cpu_count", lambda: 2)
    with bench.OtherCpu() as other:
        pass
    assert other.share == pytest.approx(0.5)


def test_the_error_line_is_the_exception_an_engine_died_on(bench) -> None:
    log = """INFO     starting
Traceback (most recent call last):
  File "x/utils_optimum.py", line 253, in get_onnx_files
    raise ValueError(f"No onnx files found for {model_name_or_path} and revision {revision}")
ValueError: No onnx files found for /m and revision None

ERROR:    Application startup failed. Exiting.
"""
    assert bench.error_line(log) == "ValueError: No onnx files found for /m and revision None"
    assert (
        bench.error_line("optimum.x.SomeError: bad\nERROR: exiting\n") == "optimum.x.SomeError: bad"
    )
    assert bench.error_line("Killed\n\n") == "Killed"
    assert bench.error_line("") == "(no output)"


def test_an_error_line_is_kept_without_machine_paths(bench, tmp_path) -> None:
    python = str(tmp_path / "venv" / "bin" / "python")
    line = f"ValueError: No onnx files found for {bench.REPO}/.cache/m in {tmp_path}/venv/lib and {bench.REPO.parent}/x"
    assert bench.portable_text(line, python) == (
        "ValueError: No onnx files found for ./.cache/m in VENV/lib and ../x"
    )


def _script(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_failing_engine_is_recorded_and_the_others_still_run(bench, tmp_path) -> None:
    """A fake Infinity venv: its python cannot make the ONNX folder (no optimum) and its
    ``infinity_emb`` serves ``/health``; the ONNX engine is recorded with the line it died on,
    the torch engine is measured."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    python = _script(
        venv / "python",
        "#!/bin/sh\necho 'Traceback (most recent call last):' >&2\n"
        "echo \"ModuleNotFoundError: No module named 'optimum'\" >&2\nexit 1\n",
    )
    _script(
        venv / "infinity_emb",
        f"#!{sys.executable}\n"
        "import http.server, sys\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers(); self.wfile.write(b'ok')\n"
        "    def log_message(self, *a): pass\n"
        "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n",
    )
    onnx = tmp_path / "my-onnx"
    onnx.mkdir()
    measured = []

    def measure(server) -> dict:
        measured.append(server.port)
        return {"query@1": _cell(50)}

    out = bench.run_infinity(
        str(python), ["optimum", "torch"], {"optimum": onnx}, tmp_path / "st", 1, tmp_path,
        tmp_path / "cache", measure,
    )  # fmt: skip
    assert out["infinity_engines"] == ["optimum", "torch"]
    assert out["infinity_version"] == "unknown"
    assert out["infinity_failures"] == {
        "optimum": {"stage": "prepare", "error": "ModuleNotFoundError: No module named 'optimum'"}
    }
    assert "infinity_optimum" not in out and len(measured) == 1
    assert out["infinity_torch"]["query@1"]["texts_per_s"] == 50
    assert "exit_code" in out["infinity_torch"]


def test_an_engine_that_exits_at_start_is_recorded_with_its_exit_code(bench, tmp_path) -> None:
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    python = _script(venv / "python", "#!/bin/sh\nexit 1\n")
    _script(
        venv / "infinity_emb",
        "#!/bin/sh\necho '  File \"modeling.py\", line 292, in _infer_file_path' >&2\n"
        "echo 'FileNotFoundError: Could not find any ONNX files with target file name x/model.onnx' >&2\n"
        "echo 'ERROR:    Application startup failed. Exiting.' >&2\nexit 3\n",
    )
    out = bench.run_infinity(
        str(python), ["torch"], {}, tmp_path / "st", 1, tmp_path, tmp_path / "cache",
        lambda server: pytest.fail("an engine that did not start was measured"),
    )  # fmt: skip
    assert out["infinity_failures"] == {
        "torch": {
            "stage": "start",
            "exit_code": 3,
            "error": "FileNotFoundError: Could not find any ONNX files with target file name x/model.onnx",
        }
    }
    assert "infinity_torch" not in out
