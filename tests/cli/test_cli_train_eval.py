"""`magretrieve train` and `magretrieve eval` end to end on the tiny BERT and tiny BEIR, and the
user errors each command must turn into one clear line (exit code ≠ 0, no traceback)."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from magretrieve.cli import main
from magretrieve.data.readers import load_beir
from magretrieve.evaluation.retrieval import evaluate_retrieval
from magretrieve.train.encoder import CONFIG_NAME, Encoder
from magretrieve.train.trainer import LOG_NAME
from tests.support.tiny_models import write_tiny_beir


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=True)


def user_error(result: Result, *needles: str, code: int = 1) -> str:
    """Assert a clean user error: exit code, SystemExit (no traceback), message content."""
    assert result.exit_code == code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)
    return result.output


def strict_json(text: str) -> dict:
    def refuse(token: str) -> None:
        raise AssertionError(f"non-standard JSON token {token}")

    obj = json.loads(text, parse_constant=refuse)
    assert isinstance(obj, dict)
    return obj


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path_factory) -> tuple[Path, Result]:
    out = tmp_path_factory.mktemp("cli") / "run"
    result = cli(
        "train",
        "--model", tiny_model_dir,
        "--train", f"{tiny_beir_dir}:train",
        "--mode", "qnorm",
        "--out", out,
        "--eval", f"{tiny_beir_dir}:test",
        "--epochs", "2",
        "--batch-size", "3",
        "--lr", "1e-4",
        "--seed", "0",
    )  # fmt: skip
    return out, result


# ----------------------------------------------------------------------------- happy paths


def test_train_writes_a_run_folder_and_reports(trained: tuple[Path, Result]) -> None:
    out, result = trained
    assert result.exit_code == 0, result.output
    assert (out / CONFIG_NAME).is_file() and (out / LOG_NAME).is_file()
    assert (out / "model.safetensors").is_file()
    assert json.loads((out / CONFIG_NAME).read_text())["mode"] == "qnorm"
    log = json.loads((out / LOG_NAME).read_text())
    assert log["total_steps"] == 4 and len(log["steps"]) == 4
    assert log["config"]["batch_size"] == 3 and log["config"]["lr"] == 1e-4
    assert [e["step"] for e in log["evaluations"]] == [2, 4]  # --eval after each epoch
    assert f"saved {out}" in result.stdout and "mode qnorm" in result.stdout
    assert "NDCG@10" in result.stdout and ":test" in result.stdout


def test_eval_table_and_json_agree_with_python(trained, tiny_beir_dir: Path) -> None:
    out, _ = trained
    table = cli("eval", "--model", out, "--data", f"{tiny_beir_dir}:test")
    assert table.exit_code == 0, table.output
    lines = table.stdout.strip().splitlines()
    assert lines[0].split()[:3] == ["data", "mode", "NDCG@10"]
    assert set(lines[1]) <= {"-", " "}
    row = lines[2].split()
    assert row[0].endswith(":test") and row[1] == "qnorm" and row[-3:] == ["6", "0", "12"]

    as_json = cli("eval", "--model", out, "--data", f"{tiny_beir_dir}:test", "--json")
    assert as_json.exit_code == 0, as_json.output
    obj = strict_json(as_json.stdout)  # stdout is exactly one JSON object
    expected = evaluate_retrieval(
        Encoder.load(out, device="cpu"), load_beir(f"{tiny_beir_dir}:test"), progress=False
    )
    assert obj["model"] == str(out) and obj["mode"] == "qnorm"
    assert obj["ndcg_at_10"] == pytest.approx(expected.ndcg_at_10, abs=1e-6)
    assert obj["cohens_d"] == pytest.approx(expected.cohens_d, abs=1e-5)
    assert obj["n_queries"] == 6 and obj["n_documents"] == 12
    assert row[2] == f"{expected.ndcg_at_10:.4f}"  # the table shows the same number


def test_eval_several_sets_zero_shot_mode_and_sts(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    sts = tmp_path / "sts.jsonl"
    sts.write_text(
        "".join(
            json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n"
            for a, b, s in [
                ("statins heart", "heart risk of statins", 4.5),
                ("wing flow", "lung cancer", 0.5),
                ("vitamin dose", "high dose vitamin trial", 4.0),
            ]
        )
    )
    result = cli(
        "eval", "--model", tiny_model_dir, "--mode", "qnorm",
        "--data", f"{tiny_beir_dir}:test", "--data", f"{tiny_beir_dir}:train", "--data", sts,
        "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    obj = strict_json(result.stdout)
    assert obj["model"] == str(tiny_model_dir)
    test, train, pairs = obj["results"]
    assert test["dataset"].endswith(":test") and train["dataset"].endswith(":train")
    assert test["mode"] == train["mode"] == pairs["mode"] == "qnorm"
    assert pairs["dataset"] == "sts" and pairs["n_pairs"] == 3
    assert pairs["mean_asymmetry"] > 0  # qnorm scores s(a,b) and s(b,a) differently
    table = cli("eval", "--model", tiny_model_dir, "--mode", "cosine", "--data", sts)
    assert table.exit_code == 0, table.output
    assert "Spearman s(a,b)" in table.stdout and "cosine" in table.stdout
    cosine_row = table.stdout.strip().splitlines()[-1].split()
    assert float(cosine_row[4]) == pytest.approx(0.0, abs=1e-4)  # mean |s(a,b) − s(b,a)|


def test_train_from_pair_file_with_json_summary(tiny_model_dir: Path, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps({"query": q, "positive": p, "negatives": ["wing flow pressure"]}) + "\n"
            for q, p in [
                ("statins heart", "statins reduce heart risk"),
                ("lung cancer", "smoking causes lung cancer"),
                ("vitamin dose", "high dose vitamin trial"),
                ("brain protein", "protein in the brain"),
            ]
        )
    )
    out = tmp_path / "run"
    result = cli(
        "train", "--model", tiny_model_dir, "--train", pairs, "--mode", "learnable",
        "--out", out, "--epochs", "1", "--batch-size", "2", "--hard-negatives", "1",
        "--gamma-lr", "0.2", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = strict_json(result.stdout)
    assert summary["mode"] == "learnable" and summary["steps"] == 2
    assert summary["out"] == str(out) and summary["best_step"] is None
    saved = json.loads((out / CONFIG_NAME).read_text())
    assert saved["gamma_q"] == pytest.approx(summary["gamma_q"])
    assert summary["gamma_q"] != pytest.approx(0.5, abs=1e-3)  # γ trained at its own rate
    log = json.loads((out / LOG_NAME).read_text())
    assert log["config"]["hard_negatives"] == 1 and log["config"]["gamma_lr"] == 0.2


def test_symmetric_task_with_force_trains_and_warns_once(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        result = cli(
            "train", "--model", tiny_model_dir, "--train", f"{tiny_beir_dir}:train",
            "--mode", "qnorm", "--task", "symmetric", "--force", "--out", out,
            "--max-steps", "1", "--batch-size", "3",
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    warnings = [r.getMessage() for r in caplog.records if "s(a, b) != s(b, a)" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert json.loads((out / LOG_NAME).read_text())["config"]["task"] == "symmetric"


# ----------------------------------------------------------------------------- user errors


def test_malformed_pair_line_names_file_and_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"query": "a", "positive": "b"}\n{"query": "c", "positive": \n')
    out = tmp_path / "run"
    result = cli("train", "--model", tiny_model_dir, "--train", pairs, "--out", out)
    user_error(result, f"{pairs}:2", "malformed JSON")
    assert not out.exists()  # nothing written on failure
    pairs.write_text('{"query": "a", "positive": "b"}\n\n{"query": "c"}\n')
    user_error(
        cli("train", "--model", tiny_model_dir, "--train", pairs, "--out", out),
        f"{pairs}:3",
        "'positive'",
    )


def test_malformed_corpus_line_names_file_and_line(tiny_model_dir: Path, tmp_path: Path) -> None:
    beir = write_tiny_beir(tmp_path / "beir")
    corpus = beir / "corpus.jsonl"
    lines = corpus.read_text().splitlines()
    lines[2] = lines[2][:-1]  # drop the closing brace of line 3
    corpus.write_text("\n".join(lines) + "\n")
    user_error(cli("eval", "--model", tiny_model_dir, "--data", f"{beir}:test"), f"{corpus}:3")
    out = tmp_path / "run"
    user_error(
        cli("train", "--model", tiny_model_dir, "--train", f"{beir}:train", "--out", out),
        f"{corpus}:3",
    )
    assert not out.exists()


@pytest.mark.parametrize("side", ["corpus", "queries"])
def test_qrels_id_missing_is_named(tiny_model_dir: Path, tmp_path: Path, side: str) -> None:
    beir = write_tiny_beir(tmp_path / "beir")
    qrels = beir / "qrels" / "test.tsv"
    row = "t0\tghost-doc\t1\n" if side == "corpus" else "ghost-query\td00\t1\n"
    qrels.write_text(qrels.read_text() + row)
    needle = "'ghost-doc'" if side == "corpus" else "'ghost-query'"
    for cmd in (
        ["eval", "--model", tiny_model_dir, "--data", f"{beir}:test"],
        ["train", "--model", tiny_model_dir, "--train", f"{beir}:test", "--out", tmp_path / "r"],
    ):
        user_error(cli(*cmd), needle, str(qrels))


def test_empty_corpus(tiny_model_dir: Path, tmp_path: Path) -> None:
    beir = write_tiny_beir(tmp_path / "beir")
    (beir / "corpus.jsonl").write_text("\n")
    user_error(cli("eval", "--model", tiny_model_dir, "--data", f"{beir}:test"), "corpus is empty")
    user_error(
        cli(
            "train", "--model", tiny_model_dir, "--train", f"{beir}:train", "--out", tmp_path / "r"
        ),
        "corpus is empty",
    )


def test_unknown_mode(tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path) -> None:
    for cmd in (
        ["eval", "--model", tiny_model_dir, "--data", tiny_beir_dir, "--mode", "cosin"],
        [
            "train",
            "--model",
            tiny_model_dir,
            "--train",
            tiny_beir_dir,
            "--out",
            tmp_path / "r",
            "--mode",
            "cosin",
        ],
    ):
        out = user_error(cli(*cmd), "Invalid value for '--mode'", "'cosin'", code=2)
        assert "qnorm" in out  # the choices are listed


@pytest.mark.parametrize("mode", ["qnorm", "dnorm", "learnable"])
def test_symmetric_task_refuses_one_sided_modes(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path, mode: str
) -> None:
    out = tmp_path / "run"
    result = cli(
        "train", "--model", tiny_model_dir, "--train", f"{tiny_beir_dir}:train",
        "--mode", mode, "--task", "symmetric", "--out", out,
    )  # fmt: skip
    user_error(result, f"mode {mode!r}", "symmetric", "--force", "--mode cosine or dot")
    assert not out.exists()


def test_existing_out_folder_needs_force(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    keep = out / "notes.txt"
    keep.write_text("mine")
    args = ["train", "--model", tiny_model_dir, "--train", f"{tiny_beir_dir}:train", "--out", out]
    user_error(cli(*args), str(out), "not empty", "--force")
    assert keep.read_text() == "mine" and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    # an empty existing folder is fine; --force overwrites a non-empty one
    forced = cli(*args, "--force", "--max-steps", "1", "--batch-size", "3")
    assert forced.exit_code == 0, forced.output
    assert (out / CONFIG_NAME).is_file()


def test_unknown_split_and_missing_folder(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    user_error(
        cli("eval", "--model", tiny_model_dir, "--data", f"{tiny_beir_dir}:dev"),
        "no such qrels split 'dev'",
        "available: test, train",
    )
    user_error(
        cli(
            "train",
            "--model",
            tiny_model_dir,
            "--train",
            f"{tiny_beir_dir}:dev",
            "--out",
            tmp_path / "r",
        ),
        "no such qrels split 'dev'",
    )
    missing = tmp_path / "nowhere"
    user_error(
        cli("eval", "--model", tiny_model_dir, "--data", f"{missing}:test"),
        str(missing),
        "not a folder",
    )
    user_error(
        cli(
            "train",
            "--model",
            tiny_model_dir,
            "--train",
            tmp_path / "none.jsonl",
            "--out",
            tmp_path / "r",
        ),
        "file not found",
    )


def test_bad_numbers_and_missing_model(
    tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path: Path
) -> None:
    base = ["train", "--model", tiny_model_dir, "--train", f"{tiny_beir_dir}:train", "--out"]
    user_error(cli(*base, tmp_path / "a", "--batch-size", "1"), "--batch-size must be >= 2")
    user_error(cli(*base, tmp_path / "b", "--lr", "0"), "--lr must be > 0")
    user_error(cli(*base, tmp_path / "c", "--val-fraction", "1.5"), "fraction")
    user_error(cli(*base, tmp_path / "d", "--epochs", "two"), "'two'", code=2)
    for name in "abcd":
        assert not (tmp_path / name).exists() or not any((tmp_path / name).iterdir())
    ghost = tmp_path / "no-model"
    user_error(cli("eval", "--model", ghost, "--data", f"{tiny_beir_dir}:test"), "no-model")


def test_json_never_writes_nan(trained, tiny_beir_dir: Path, tmp_path: Path) -> None:
    """One judged query with one relevant document: Cohen's d is undefined (NaN)."""
    out, _ = trained
    beir = tmp_path / "beir"
    shutil.copytree(tiny_beir_dir, beir)
    qrels = beir / "qrels" / "one.tsv"
    qrels.write_text("query-id\tcorpus-id\tscore\nt0\td01\t1\n")
    result = cli("eval", "--model", out, "--data", f"{beir}:one", "--json")
    assert result.exit_code == 0, result.output
    obj = strict_json(result.stdout)
    assert obj["n_queries"] == 1
    assert obj["cohens_d"] is None  # one relevant norm: undefined, written as null
    assert not any(isinstance(v, float) and math.isnan(v) for v in obj.values())
