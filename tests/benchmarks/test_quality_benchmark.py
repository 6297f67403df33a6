"""benchmarks/quality.py at smoke size: 2 configurations × 2 seeds, 1 epoch, on the tiny BERT
and tiny BEIR. It must write the markdown table, the JSON summary and a readable PNG, aggregate
the per-run results it cached, and resume from that cache without training again."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tests.support.benchmarks import load_benchmark

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def quality():
    return load_benchmark("quality")


@pytest.fixture(scope="module")
def smoke(quality, tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("quality")
    args = [
        "--model", str(tiny_model_dir),
        "--train", f"{tiny_beir_dir}:train",
        "--eval", f"{tiny_beir_dir}:test",
        "--configs", "cosine,qnorm",
        "--seeds", "1,2",
        "--epochs", "1",
        "--batch-size", "3",
        "--lr", "1e-4",
        "--work", str(root / "work"),
        "--out", str(root / "out"),
        "--name", "smoke",
    ]  # fmt: skip
    result = CliRunner().invoke(quality.main, args, catch_exceptions=False)
    return {"root": root, "args": args, "result": result}


def test_smoke_run_writes_table_json_and_png(smoke: dict) -> None:
    result, root = smoke["result"], smoke["root"]
    assert result.exit_code == 0, result.output
    out = root / "out"
    assert sorted(p.name for p in out.iterdir()) == ["smoke.json", "smoke.md", "smoke.png"]
    results = root / "work" / "results"
    assert sorted(p.name for p in results.iterdir()) == [
        "cosine-s1.json",
        "cosine-s2.json",
        "qnorm-s1.json",
        "qnorm-s2.json",
    ]
    assert (root / "work" / "runs" / "qnorm-s2" / "train_log.json").is_file()
    for tag in ("cosine-s1", "qnorm-s2"):
        record = json.loads((results / f"{tag}.json").read_text())
        assert record["train"]["steps"] == 2  # 6 training pairs, batches of 3, 1 epoch
        (key,) = record["eval"]
        assert key.endswith(":test") and 0 <= record["eval"][key]["ndcg_at_10"] <= 1

    table = (out / "smoke.md").read_text()
    assert table == result.stdout.rstrip("\n") + "\n" or table in result.stdout
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| configuration | seeds |") and "NDCG@10" in rows[0]
    body = {r.split(" | ")[0].lstrip("| "): r.split(" | ") for r in rows[1:]}
    assert set(body) == {"cosine (baseline)", "qnorm (paper recipe)"}
    assert body["cosine (baseline)"][1] == "1,2" and body["qnorm (paper recipe)"][1] == "1,2"

    summary = json.loads((out / "smoke.json").read_text())["summary"]
    assert list(summary) == ["cosine", "qnorm"]
    for name in ("cosine", "qnorm"):
        per_run = [json.loads((results / f"{name}-s{s}.json").read_text())["eval"] for s in (1, 2)]
        (key,) = per_run[0]
        ndcgs = [r[key]["ndcg_at_10"] for r in per_run]
        assert summary[name]["seeds"] == [1, 2]
        assert summary[name][key]["ndcg"] == pytest.approx(np.mean(ndcgs))
        assert summary[name][key]["spread"] == pytest.approx((max(ndcgs) - min(ndcgs)) / 2)
        cell = f"{np.mean(ndcgs):.4f} ± {(max(ndcgs) - min(ndcgs)) / 2:.4f}"
        assert cell in body[f"{name} ({'baseline' if name == 'cosine' else 'paper recipe'})"]
    delta = 100 * (summary["qnorm"][key]["ndcg"] / summary["cosine"][key]["ndcg"] - 1)
    assert f"{delta:+.1f}%" in body["qnorm (paper recipe)"]


def test_png_is_a_readable_chart(smoke: dict) -> None:
    import matplotlib.image

    path = smoke["root"] / "out" / "smoke.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    height, width = image.shape[:2]
    assert width >= 700 and height >= 400
    assert image[..., :3].std() > 0.05  # bars and text, not a blank canvas


def test_rerun_resumes_from_the_cache(quality, smoke: dict) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in (smoke["root"] / "work" / "results").iterdir()}
    again = CliRunner().invoke(quality.main, smoke["args"], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert again.output.count(": cached") == 4 and ": running" not in again.output
    after = {p.name: p.stat().st_mtime_ns for p in (smoke["root"] / "work" / "results").iterdir()}
    assert after == before
    first = json.loads((smoke["root"] / "out" / "smoke.json").read_text())["summary"]
    assert first == json.loads(json.dumps(first))  # the rewritten summary parses the same


def test_unknown_config_is_refused(quality, smoke: dict) -> None:
    args = list(smoke["args"])
    args[args.index("--configs") + 1] = "cosine,qnrom"
    result = CliRunner().invoke(quality.main, args)
    assert result.exit_code == 2 and "unknown configs ['qnrom']" in result.output


def test_markdown_handles_a_zero_baseline_and_missing_cohens_d(quality) -> None:
    """A cosine baseline at NDCG 0 (e.g. a smoke run) must not crash the table."""
    records = [
        {"config": "cosine", "mode": "cosine", "seed": 1, "describe": "baseline",
         "eval": {"x:test": {"ndcg_at_10": 0.0, "cohens_d": math.nan}}},
        {"config": "qnorm", "mode": "qnorm", "seed": 1, "describe": "paper recipe",
         "eval": {"x:test": {"ndcg_at_10": 0.25, "cohens_d": 0.4}}},
    ]  # fmt: skip
    sets, summary = quality.aggregate(records, ["cosine", "qnorm"])
    table = quality.markdown(sets, summary, "cmd", {"epochs": 1})
    cosine_row, qnorm_row = table.strip().splitlines()[-2:]
    assert "0.0000 ± 0.0000" in cosine_row and "| – |" in cosine_row  # no Cohen's d
    assert "0.2500 ± 0.0000" in qnorm_row and "+0.40" in qnorm_row


def test_cosine_plus_prior_reuses_the_cosine_run(
    quality, tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    """cosine+prior scores the trained cosine model of the same seed (no second training)
    with the corpus prior whose β was chosen on the training queries."""
    from magretrieve.data.readers import load_beir
    from magretrieve.evaluation.retrieval import evaluate_retrieval
    from magretrieve.priors import prior_from_dict
    from magretrieve.priors.fit import WithPrior
    from magretrieve.train.encoder import Encoder

    args = [
        "--model", str(tiny_model_dir),
        "--train", f"{tiny_beir_dir}:train",
        "--eval", f"{tiny_beir_dir}:test",
        "--configs", "cosine,cosine+prior",
        "--seeds", "1",
        "--epochs", "1",
        "--batch-size", "3",
        "--work", str(tmp_path / "work"),
        "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    result = CliRunner().invoke(quality.main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    results = tmp_path / "work" / "results"
    cosine = json.loads((results / "cosine-s1.json").read_text())
    record = json.loads((results / "cosine+prior-s1.json").read_text())
    assert record["train"]["reused"].endswith("cosine-s1")
    assert record["train"]["steps"] == cosine["train"]["steps"]
    assert not (tmp_path / "work" / "runs" / "cosine+prior-s1").exists()  # nothing trained
    prior = prior_from_dict(record["prior"])
    assert prior.method in ("hub", "none")  # β of the hub prior, or cosine when β = 0 wins
    assert record["prior"]["chosen_on"].endswith(":train")
    assert "none (cosine)" in record["prior"]["grid"]
    encoder = Encoder.load(tmp_path / "work" / "runs" / "cosine-s1")
    data = load_beir(f"{tiny_beir_dir}:test")
    expected = evaluate_retrieval(WithPrior(encoder, prior), data, progress=False)
    (key,) = record["eval"]
    assert record["eval"][key]["ndcg_at_10"] == pytest.approx(expected.ndcg_at_10, abs=1e-9)
    assert (
        "cosine+prior (fine-tuned cosine + corpus prior"
        in (tmp_path / "out" / "quality.md").read_text()
    )
