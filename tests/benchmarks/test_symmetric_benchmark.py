"""Smoke run of benchmarks/studies/symmetric.py on the tiny BERT: one-sided modes show asymmetry, cosine/dot none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration


def _load_main():
    return load_benchmark("studies/symmetric").main


def _write_sts(folder: Path) -> None:
    folder.mkdir()
    topics = [
        "statins heart risk",
        "wing flow pressure",
        "lung cancer smoking",
        "vitamin dose blood",
        "brain protein gene",
    ]
    rows = []
    for i, a in enumerate(topics):
        for j, b in enumerate(topics):
            rows.append(
                {
                    "sentence1": f"the {a} study",
                    "sentence2": f"a {b} trial",
                    "score": 5.0 if i == j else float(abs(i - j)),
                }
            )
    for name in ("train", "test"):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_symmetric_benchmark_reports_both_orders(tiny_model_dir: Path, tmp_path: Path) -> None:
    _write_sts(tmp_path / "sts")
    result = CliRunner().invoke(
        _load_main(),
        [
            "--model",
            str(tiny_model_dir),
            "--data",
            str(tmp_path / "sts"),
            "--modes",
            "cosine,qnorm",
            "--batch-size",
            "4",
            "--lr",
            "1e-3",
            "--out",
            str(tmp_path / "out"),
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = {
        r["run"]: r for r in json.loads((tmp_path / "out" / "symmetric.json").read_text())["rows"]
    }
    assert set(rows) == {"zero-shot cosine", "fine-tuned cosine", "fine-tuned qnorm (forced)"}
    assert rows["fine-tuned cosine"]["mean_asymmetry"] < 1e-5
    assert rows["fine-tuned qnorm (forced)"]["mean_asymmetry"] > 1e-3
    assert "| fine-tuned qnorm (forced) |" in (tmp_path / "out" / "symmetric.md").read_text()
