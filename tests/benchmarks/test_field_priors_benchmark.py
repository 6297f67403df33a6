"""benchmarks/field_priors.py: paired Cohen's d by hand, and a tiny end-to-end run whose
store-served deal equals the numpy one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.support.benchmarks import load_benchmark
from tests.support.tiny_models import write_tiny_beir

pytestmark = pytest.mark.integration

bench = load_benchmark("field_priors")


def test_paired_cohens_d_by_hand() -> None:
    a = np.array([0.5, 0.7, 0.9, 1.0])
    b = np.array([0.4, 0.7, 0.6, 0.8])
    diff = np.array([0.1, 0.0, 0.3, 0.2])  # mean 0.15, sample sd sqrt(0.05/3)
    assert bench.paired_d(a, b) == pytest.approx(diff.mean() / np.sqrt(0.05 / 3))
    assert bench.paired_d(a, a) == 0.0


def one_split_beir(folder: Path) -> Path:
    """The tiny BEIR set, only its train split judged, with a ``views`` field."""
    write_tiny_beir(folder)
    (folder / "qrels" / "test.tsv").unlink()
    docs = [json.loads(line) for line in (folder / "corpus.jsonl").read_text().splitlines()]
    for doc in docs:
        doc["views"] = 40 if doc["_id"].endswith("0") else 3
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    return folder


def test_tiny_end_to_end_run(tiny_st_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MAGRETRIEVE_CACHE", str(tmp_path / "cache"))
    beir = one_split_beir(tmp_path / "beir")
    out = tmp_path / "results"
    args = ["--model", str(tiny_st_dir), "--data", f"{beir}:train", "--seeds", "2"]
    args += ["--folds", "3", "--fields", "views", "--lock", "", "--out", str(out)]
    res = CliRunner().invoke(bench.main, args)
    assert res.exit_code == 0, res.output
    data = json.loads((out / "field_priors.json").read_text())
    rows = data["rows"]
    assert list(rows) == [
        "cosine (no prior)",
        "field: views",
        "field chosen on the folds",
        "geometric: hub",
        "hub + field chosen on the folds",
        "auto (fit-prior default)",
    ]
    cosine = rows["cosine (no prior)"]
    assert cosine["delta_vs_cosine"] == pytest.approx(0.0) and cosine["cohens_d"] == 0.0
    for row in rows.values():
        # deal 0 served through a rescaled memory store ranks as the numpy scoring does
        assert row["store_ndcg_seed0"] == pytest.approx(row["numpy_ndcg_seed0"], abs=1e-6)
        assert len(row["per_seed"]) == 2 and len(row["per_query"]) == 6
        assert sum(row["chosen_on_folds"].values()) == 2 * 3
    # the field is what ranks the judged document first: the folds choose it
    assert rows["field: views"]["ndcg"] > cosine["ndcg"]
    assert any(k.startswith("field(views") for k in rows["field: views"]["chosen_on_folds"])
    text = (out / "field_priors.md").read_text()
    assert "## The plain answer" in text and "| field: views |" in text
