"""The quickstart example runs end to end (tiny BERT, tiny BEIR laid out as 'scifact')."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.server import start_server

#: Integration lane: runs examples/quickstart.py end to end in a subprocess.
pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


@pytest.mark.parametrize(
    ("model_fixture", "mode", "prior"),
    [
        ("tiny_model_dir", "qnorm", False),  # plain folder: the side predictor's default
        ("tiny_st_dir", "cosine", True),  # ends in Normalize: cosine + the corpus prior
    ],
)
def test_quickstart_runs_every_step(
    model_fixture: str,
    mode: str,
    prior: bool,
    tiny_beir_dir: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    tiny_model_dir = request.getfixturevalue(model_fixture)
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
    for n in range(1, 9):
        assert f"=== {n}." in out
    assert f"recommended: {mode}" in out
    assert "12 documents stored" in out
    # the final table compares measured NDCG@10 values: zero-shot, fine-tuned (+ prior)
    values = [
        float(x)
        for x in re.findall(
            rf"^\s+(?:zero-shot cosine|fine-tuned {mode}, 2 steps|\+ [^\n]+?)"
            r"\s+([01]\.\d{4})",
            out,
            re.M,
        )
    ]
    assert len(values) == (3 if prior else 2), out[-2000:]
    assert all(0.0 <= v <= 1.0 for v in values)
    assert ("rescaled copy:" in out) == prior
    if prior:  # chosen on training queries; "no prior" (cosine) is always a candidate
        assert re.search(r"chosen: .+ \(training-query NDCG@10 [01]\.\d{4}, \d+ candidates", out)
        assert (tmp_path / "out" / "index-prior").is_dir()
    # score decomposition rows: score == ‖q‖·‖d‖·cos + offset (to the printed precision)
    number = r"\s+(-?\d+\.\d{3})"
    rows = re.findall(r"^" + number * 5 + r"\s", out, re.M)
    assert len(rows) == 6
    for score, qn, dn, cos, offset in (tuple(map(float, row)) for row in rows):
        assert abs(score - (qn * dn * cos + offset)) < 0.01
    assert (tmp_path / "out" / "exported" / "magretrieve.json").is_file()
    check_the_closing_hint_serves_magnitude(out, tmp_path, prior)


def check_the_closing_hint_serves_magnitude(out: str, tmp_path: Path, prior: bool) -> None:
    """The printed serve commands run as printed (on a free port): key-less, the page and
    its API docs open, and the store the hint says shows magnitude does."""
    hint = out[out.index("serve the best store") :].splitlines()
    # the program is the magretrieve script beside the Python that ran the example
    commands = [shlex.split(line) for line in hint if line.startswith("  ") and " serve " in line]
    assert commands, hint
    assert "API docs" in "\n".join(hint)
    for command in commands:
        assert Path(command[0]).name == "magretrieve" and Path(command[0]).is_file()
        assert command[1] == "serve" and command[-2] == "--port"
        assert "--api-key" not in command
        export, args = command[2], command[3:-2]
        server = start_server(Path(export), *args, key=None, log_dir=tmp_path)
        try:
            assert httpx.get(server.url + "/", timeout=30).status_code == 200
            assert httpx.get(server.url + "/docs", timeout=30).status_code == 200  # no 401
            hits = server.post("/search", {"query": "statins heart", "k": 12}).json()["hits"]
        finally:
            server.stop()
        norms = {round(h["doc_norm"], 6) for h in hits}
        offsets = {round(h["offset"], 6) for h in hits}
        shows = len(norms) > 1 or offsets != {0.0}
        spec = args[args.index("--store") + 1]
        if spec.endswith("index-prior"):  # the prior's m(d), unless "no prior" won
            assert shows or "none (cosine)" in out, hits
        elif not prior:  # a magnitude mode: the document norms themselves
            assert shows, hits
