"""The quickstart example runs end to end (tiny BERT, tiny BEIR laid out as 'scifact')."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart.py"


def test_quickstart_runs_every_step(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    shutil.copytree(tiny_beir_dir, data / "scifact")
    proc = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--data",
            str(data),
            "--model",
            str(tiny_model_dir),
            "--work",
            str(tmp_path / "out"),
            "--steps",
            "2",
            "--store",
            "faiss",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for n in range(1, 8):
        assert f"=== {n}." in out
    assert "12 documents stored" in out
    # the final table compares two measured NDCG@10 values
    zero, tuned = (
        float(x)
        for x in re.findall(
            r"^\s+(?:zero-shot cosine|fine-tuned \w+, 2 steps)\s+([01]\.\d{4})", out, re.M
        )
    )
    assert 0.0 <= zero <= 1.0 and 0.0 <= tuned <= 1.0
    # score decomposition rows: score == ‖q‖·‖d‖·cos (to the printed precision)
    rows = re.findall(
        r"^\s+(-?\d+\.\d{3})\s+(\d+\.\d{3})\s+(\d+\.\d{3})\s+(-?\d+\.\d{3})\s", out, re.M
    )
    assert len(rows) == 6
    for score, qn, dn, cos in ((float(a), float(b), float(c), float(d)) for a, b, c, d in rows):
        assert abs(score - qn * dn * cos) < 0.01
    assert (tmp_path / "out" / "exported" / "magretrieve.json").is_file()
