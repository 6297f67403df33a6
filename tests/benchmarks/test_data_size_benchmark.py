"""benchmarks/studies/data_size.py: weak pairs never come from eval-judged documents, samples are nested,
and a smoke run on the tiny BERT writes the table, JSON and chart, reuses a matching quality
result for N = 0, and resumes from its cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from magretrieve.core.errors import ConfigError
from magretrieve.data.readers import Document, RetrievalDataset
from tests.support.benchmarks import load_benchmark
from tests.support.tiny_models import TINY_TOPICS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("studies/data_size")


def _doc(doc_id: str, topic: str) -> Document:
    text = (
        f"The {topic} study followed many patients. Blood data show a high effect here. "
        f"Low dose {topic} does reduce the risk."
    )
    return Document(doc_id, text, f"{topic} in human patients")


# ---------------------------------------------------------------- exclusion and sampling


def test_judged_documents_by_id_in_the_same_corpus_by_text_in_another(bench, tmp_path) -> None:
    corpus = {
        i: _doc(i, t)
        for i, t in zip("12345", ["statin", "cancer", "brain", "wing", "lung"], strict=True)
    }
    same = RetrievalDataset(
        "sci", "test", corpus, {"q1": "?"}, {"q1": {"1": 1, "2": 0}}
    )  # a 0 judgement counts: the document was looked at for this test query
    other_corpus = {
        "3": Document("3", "an unrelated aerodynamics report", "wing flow"),  # id collides
        "9": corpus["4"],  # same text under another id
        "8": Document("8", "nothing shared", ""),
    }
    other = RetrievalDataset("cran", "test", other_corpus, {"c": "?"}, {"c": {"3": 1, "9": 2}})
    (tmp_path / "sci").mkdir()
    (tmp_path / "cran").mkdir()
    excluded = bench.eval_judged_documents(
        corpus, tmp_path / "sci", [(tmp_path / "sci" / ".", same), (tmp_path / "cran", other)]
    )
    assert excluded == {"sci:test": ["1", "2"], "cran:test": ["4"]}

    pool = bench.weak_pool(corpus, ["title", "sentence"], ["1", "2", "4"], seed=7)
    assert sorted((bench.pair_kind(p, corpus), p.positive_id) for p in pool) == [
        ("sentence", "3"),
        ("sentence", "5"),
        ("title", "3"),
        ("title", "5"),
    ]
    titles = [p for p in pool if bench.pair_kind(p, corpus) == "title"]
    assert {(p.query, p.positive) for p in titles} == {
        ("brain in human patients", corpus["3"].text),
        ("lung in human patients", corpus["5"].text),
    }


def test_samples_are_nested_prefixes_and_refuse_sizes_the_pool_cannot_fill(bench) -> None:
    corpus = {f"d{i}": _doc(f"d{i}", t) for i, t in enumerate(["statin", "cancer", "brain"])}
    pool = bench.weak_pool(corpus, ["title", "sentence"], [], seed=3)
    assert len(pool) == 6
    small, large = bench.sample_weak_pairs(pool, 2), bench.sample_weak_pairs(pool, 5)
    assert small == large[:2] == pool[:2]
    assert bench.sample_weak_pairs(pool, 0) == []
    again = bench.weak_pool(corpus, ["title", "sentence"], [], seed=3)
    assert [(p.query, p.positive_id) for p in again] == [(p.query, p.positive_id) for p in pool]
    with pytest.raises(ConfigError, match="7 weak pairs asked for, but .* yields only 6"):
        bench.sample_weak_pairs(pool, 7)


def test_summary_differences_are_paired_per_seed(bench) -> None:
    def rec(n, mode, seed, ndcg, d):
        return {
            "n_weak": n,
            "n_pairs": 10 + n,
            "mode": mode,
            "seed": seed,
            "train": {"steps": 3},
            "eval": {"x:test": {"ndcg_at_10": ndcg, "cohens_d": d}},
        }

    records = [
        rec(0, "cosine", 1, 0.50, 0.1),
        rec(0, "qnorm", 1, 0.40, -0.3),
        rec(0, "cosine", 2, 0.60, 0.2),
        rec(0, "qnorm", 2, 0.56, -0.1),
        rec(5, "cosine", 1, 0.50, 0.0),
        rec(5, "qnorm", 1, 0.52, 0.4),
    ]
    rows = bench.summarize(records, [0, 5], ["cosine", "qnorm"], ["x:test"])
    assert [(r["n_weak"], r["pairs"], r["seeds"]) for r in rows] == [(0, 10, [1, 2]), (5, 15, [1])]
    assert rows[0]["ndcg"]["qnorm"] == pytest.approx({"mean": 0.48, "spread": 0.08})
    assert rows[0]["minus_cosine"]["qnorm"] == pytest.approx({"mean": -0.07, "spread": 0.03})
    assert rows[0]["cohens_d"]["cosine"] == pytest.approx({"mean": 0.15, "spread": 0.05})
    assert rows[1]["minus_cosine"]["qnorm"] == pytest.approx({"mean": 0.02, "spread": 0.0})
    assert bench.where_it_pays(rows, "qnorm") == {"x:test": [5]}
    assert bench.where_it_pays(rows[:1], "qnorm") == {"x:test": []}


# ---------------------------------------------------------------- smoke run on the tiny BERT


def _data(tiny_beir_dir: Path, root: Path) -> Path:
    """The tiny BEIR plus six minable documents e0..e5; e4 and e5 are judged by test queries."""
    folder = root / "sci"
    shutil.copytree(tiny_beir_dir, folder)
    with (folder / "corpus.jsonl").open("a") as fh:
        for i, topic in enumerate(TINY_TOPICS):
            fh.write(json.dumps({"_id": f"e{i}", "title": _doc("", topic).title,
                                 "text": _doc("", topic).text}) + "\n")  # fmt: skip
    with (folder / "queries.jsonl").open("a") as fh:
        fh.write(json.dumps({"_id": "t9", "text": "what does lung smoking cause"}) + "\n")
    with (folder / "qrels" / "test.tsv").open("a") as fh:
        fh.write("t9\te4\t1\nt9\te5\t0\n")
    return folder


def _reuse_dir(root: Path, settings: dict) -> Path:
    folder = root / "quality_results"
    folder.mkdir()
    made_up = {"sci:test": {"ndcg_at_10": 0.123456, "cohens_d": 0.5}}
    (folder / "cosine-s1.json").write_text(
        json.dumps(
            {
                "mode": "cosine",
                "seed": 1,
                "train": {"steps": 2},
                "eval": made_up,
                "settings": settings,
            }
        )  # fmt: skip
    )
    (folder / "qnorm-s1.json").write_text(
        json.dumps(
            {
                "mode": "qnorm",
                "seed": 1,
                "train": {"steps": 2},
                "eval": made_up,
                "settings": {**settings, "epochs": 3},
            }
        )  # fmt: skip
    )
    return folder


SETTINGS = {"epochs": 1, "batch_size": 3, "lr": 1e-4, "scale": 20.0, "warmup_ratio": 0.1,
            "max_document_length": 48}  # fmt: skip


@pytest.fixture(scope="module")
def smoke(bench, tiny_model_dir: Path, tiny_beir_dir: Path, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("data_size")
    data = _data(tiny_beir_dir, root)
    args = [
        "--model", str(tiny_model_dir),
        "--train", f"{data}:train",
        "--eval", f"{data}:test",
        "--sizes", "0,3,8",
        "--modes", "cosine,qnorm",
        "--seeds", "1",
        "--batch-size", "3",
        "--lr", "1e-4",
        "--max-doc-length", "48",
        "--reuse", str(_reuse_dir(root, SETTINGS)),
        "--work", str(root / "work"),
        "--out", str(root / "out"),
        "--name", "smoke",
    ]  # fmt: skip
    result = CliRunner().invoke(bench.main, args, catch_exceptions=False)
    return {"root": root, "args": args, "result": result}


def test_smoke_run_rows_steps_and_reuse(smoke: dict) -> None:
    result, root = smoke["result"], smoke["root"]
    assert result.exit_code == 0, result.output
    out = root / "out"
    assert sorted(p.name for p in out.iterdir()) == ["smoke.json", "smoke.md", "smoke.png"]
    results = root / "work" / "results"
    names = [f"n{n}-{m}-s1.json" for n in (0, 3, 8) for m in ("cosine", "qnorm")]
    assert sorted(p.name for p in results.iterdir()) == sorted(names)
    runs = {p.stem: json.loads(p.read_text()) for p in results.iterdir()}
    # 6 supervised pairs + N weak, batches of 3, one epoch: 6 -> 2, 9 -> 3, 14 -> 3+3+3+3+2 = 5
    assert {t: r["train"]["steps"] for t, r in runs.items()} == {
        "n0-cosine-s1": 2, "n0-qnorm-s1": 2, "n3-cosine-s1": 3, "n3-qnorm-s1": 3,
        "n8-cosine-s1": 5, "n8-qnorm-s1": 5,
    }  # fmt: skip
    assert {t: r["n_pairs"] for t, r in runs.items()} == {
        t: 6 + int(t.split("-")[0][1:]) for t in runs
    }
    assert runs["n8-qnorm-s1"]["weak_kinds"] == {"title": 4, "sentence": 4}
    # N = 0 cosine matched the quality result; qnorm's was trained with 3 epochs, so it was not
    assert runs["n0-cosine-s1"]["reused_from"].endswith("cosine-s1.json")
    assert runs["n0-cosine-s1"]["eval"]["sci:test"]["ndcg_at_10"] == 0.123456
    assert "reused_from" not in runs["n0-qnorm-s1"]
    assert (root / "work" / "runs" / "n0-qnorm-s1" / "train_log.json").is_file()
    assert not (root / "work" / "runs" / "n0-cosine-s1").exists()
    assert "n0-qnorm-s1: not reused" in result.output and "'epochs': 3" in result.output
    for r in runs.values():
        assert r["settings"] == SETTINGS and set(r["eval"]) == {"sci:test"}

    table = (out / "smoke.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[0] == (
        "| weak pairs N | pairs | steps | eval set | cosine NDCG@10 | qnorm NDCG@10 | qnorm − cosine"
        " | Cohen's d cosine | Cohen's d qnorm |"
    )
    cells = [r.strip("| ").split(" | ") for r in rows[1:]]
    assert [c[:4] for c in cells] == [
        ["0", "6", "2", "sci:test"],
        ["3", "9", "3", "sci:test"],
        ["8", "14", "5", "sci:test"],
    ]
    for c, n in zip(cells, (0, 3, 8), strict=True):
        cos = runs[f"n{n}-cosine-s1"]["eval"]["sci:test"]["ndcg_at_10"]
        qn = runs[f"n{n}-qnorm-s1"]["eval"]["sci:test"]["ndcg_at_10"]
        assert c[4:7] == [f"{cos:.4f}", f"{qn:.4f}", f"{qn - cos:+.4f}"]
    assert cells[0][7] == "+0.50"
    assert "Documents used for mining: 10 of 18" in table
    assert "sci:test: 8" in table and "Pool: 8 pairs (title 4, sentence 4)" in table
    pays = [n for n, c in zip((0, 3, 8), cells, strict=True) if float(c[6]) > 0]
    listed = f"N = {', '.join(map(str, pays))}" if pays else "no size tried"
    assert (
        f"Sizes at which qnorm beats cosine (mean NDCG@10, computed): sci:test: {listed}." in table
    )
    assert "n0-cosine-s1 ← " in table

    summary = json.loads((out / "smoke.json").read_text())
    assert summary["weak_pairs"]["excluded"] == {
        "sci:test": sorted([f"d{i}1" for i in range(6)] + ["e4", "e5"])
    }
    assert [r["n_weak"] for r in summary["rows"]] == [0, 3, 8]


def test_no_weak_pair_comes_from_a_test_judged_document(smoke: dict) -> None:
    weak = json.loads((smoke["root"] / "work" / "weak" / "s1.json").read_text())
    assert sorted({p["positive_id"] for p in weak["pool"]}) == ["e0", "e1", "e2", "e3"]
    assert sorted((p["kind"], p["positive_id"]) for p in weak["pool"]) == sorted(
        (k, f"e{i}") for k in ("title", "sentence") for i in range(4)
    )


def test_png_is_a_readable_line_chart(smoke: dict) -> None:
    import matplotlib.image

    path = smoke["root"] / "out" / "smoke.png"
    image = matplotlib.image.imread(path)
    assert image.shape[1] >= 800 and image.shape[0] >= 500
    assert image[..., :3].std() > 0.05


def test_rerun_resumes_and_a_changed_setting_is_refused(bench, smoke: dict) -> None:
    again = CliRunner().invoke(bench.main, smoke["args"], catch_exceptions=False)
    assert again.exit_code == 0, again.output
    assert again.output.count(": cached") == 6 and ": running" not in again.output
    args = list(smoke["args"])
    args[args.index("--lr") + 1] = "2e-4"
    changed = CliRunner().invoke(bench.main, args)
    assert changed.exit_code == 1 and "was made with other settings" in changed.output


def test_a_size_beyond_the_pool_or_an_unknown_mode_is_a_clear_error(bench, smoke: dict) -> None:
    args = list(smoke["args"])
    args[args.index("--modes") + 1] = "cosine,qnrom"
    result = CliRunner().invoke(bench.main, args)
    assert result.exit_code == 2 and "unknown modes ['qnrom']" in result.output
    args = list(smoke["args"])
    args[args.index("--sizes") + 1] = "0,9"
    result = CliRunner().invoke(bench.main, args)
    assert result.exit_code == 1
    assert "9 weak pairs asked for, but the corpus" in result.output and "only 8" in result.output


def test_plan_prints_pairs_steps_and_reuse_without_training(bench, smoke: dict, tmp_path) -> None:
    args = list(smoke["args"])
    args[args.index("--work") + 1] = str(tmp_path / "work")
    result = CliRunner().invoke(bench.main, [*args, "--plan"])
    assert result.exit_code == 0, result.output
    for line in ("N = 0: 6 pairs, 2 steps", "N = 3: 9 pairs, 3 steps", "N = 8: 14 pairs, 5 steps"):
        assert line in result.output
    assert "mining from 10 of 18 documents (excluded as eval-judged: sci:test 8)" in result.output
    assert "N = 0 cosine s1: reusable" in result.output
    assert "N = 0 qnorm s1: not reusable" in result.output
    assert not (tmp_path / "work").exists()
