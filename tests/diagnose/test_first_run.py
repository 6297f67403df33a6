"""What a first diagnose run shows: its stages and an estimate before the long work, the
probes inside a time budget, a verdict whose bullets agree with its recommendation, the
encoder named in tables and plot titles, and no repository paths a pip user lacks."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from magretrieve.diagnose.report import recommend, verdict_text

PROBES = {"probe_steps": 2, "probe_batch_size": 3, "fisher_batches": 1}
#: a repository path or file a pip install does not have
REPO_PATH = re.compile(r"\b(?:benchmarks|docs|tests|scripts|examples)/|\.md\b|\.py\b")
ARROW = re.compile(r"→ (qnorm|dnorm|dot|cosine)")


def _sts(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "test.jsonl"
    rows = [
        {
            "sentence1": f"statins heart risk {i}",
            "sentence2": f"cancer cell {i % 3}",
            "score": i % 5,
        }
        for i in range(10)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ----------------------------------------------------------------------------- stages, estimate


def test_stages_and_estimate_are_printed_before_the_long_work(
    tiny_model_dir, tiny_beir_dir, tmp_path, monkeypatch
) -> None:
    import magretrieve.diagnose as dg

    lines: list[str] = []
    seen: dict[str, int] = {}

    def spy(name, fn):
        def wrapped(*args, **kwargs):
            seen.setdefault(name, len(lines))
            return fn(*args, **kwargs)

        return wrapped

    for name in ("magnitude_signal", "symmetry_check", "delta_cv", "fisher_kappa"):
        monkeypatch.setattr(dg, name, spy(name, getattr(dg, name)))
    report = dg.diagnose(
        tiny_model_dir,
        f"{tiny_beir_dir}:train",
        sts=_sts(tmp_path / "stsb"),
        time_budget=None,
        progress=False,
        say=lines.append,
        **PROBES,
    )
    text = "\n".join(lines)
    # the plan comes first: every stage with an estimate, from the data's sizes
    assert re.match(
        rf"diagnose {Path(tiny_model_dir).name} on \S+:train: 4 stages, estimated \d", lines[0]
    ), lines[0]
    data = dg.load_beir(f"{tiny_beir_dir}:train")
    n_docs, n_queries = len(data.corpus), len(data.queries)
    assert f"encode {n_docs} documents and {n_queries} queries" in lines[1]
    assert [line.split(":")[0].strip() for line in lines[1:5]] == [
        "1. magnitude signal (no training)",
        "2. task symmetry (no training)",
        "3. ΔCV probes (training)",
        "4. Fisher κ (gradients, experimental)",
    ]
    assert all(re.search(r"\(~\d+ s\)$|\(~\d+\.\d min\)$", line) for line in lines[1:5])
    assert "--skip-probes" in text and "--time-budget" in text
    # each stage's heading is out before its work starts; training-free stages come first
    for i, name in enumerate(("magnitude_signal", "symmetry_check", "delta_cv", "fisher_kappa")):
        heading = next(j for j, line in enumerate(lines) if line.startswith(f"[{i + 1}/4] "))
        assert heading < seen[name], (name, lines)
    assert seen["magnitude_signal"] < seen["symmetry_check"] < seen["delta_cv"]
    plan = report["plan"]
    assert plan["estimate_seconds"] == pytest.approx(sum(s["estimate"] for s in plan["stages"]))
    assert all(s["seconds"] is not None and s["seconds"] >= 0 for s in plan["stages"])
    assert "delta_cv" in report["side"]["delta_cv"] and "kappa" in report["side"]["fisher"]


def test_cli_prints_the_plan_on_stderr_and_keeps_stdout_for_the_verdict(
    tiny_model_dir, tiny_beir_dir, tmp_path
) -> None:
    from magretrieve.cli import main

    args = ["diagnose", "--model", str(tiny_model_dir), "--data", f"{tiny_beir_dir}:train"]
    args += ["--out", str(tmp_path / "r"), "--skip-probes"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert ": 1 stage, estimated" in result.stderr
    assert "[1/1] magnitude signal (no training)" in result.stderr
    assert "No probe trainings in this run (--skip-probes)." in result.stderr
    assert result.stdout.startswith("recommended: ")


# ----------------------------------------------------------------------------- time budget


def test_plan_admits_a_probe_only_within_the_budget_scaled_by_the_pace() -> None:
    from magretrieve.diagnose.plan import Plan, Stage

    said: list[str] = []
    free = Stage("magnitude", "magnitude signal", "", estimate=10.0)
    probe = Stage("delta_cv", "ΔCV probes", "", estimate=8.0, probe=True)
    plan = Plan([free, probe], budget=120.0, say=said.append)
    plan.started = time.perf_counter() - 100.0  # 100 s gone, 20 s left
    free.seconds = 20.0  # the machine ran at half the estimated speed: pace 2
    assert plan.pace() == pytest.approx(2.0)
    assert plan.begin(probe) is True  # 8 s x 2 = 16 s fits in 20 s
    plan.started -= 5.0  # 15 s left: 16 s no longer fits
    assert plan.begin(probe) is False
    assert (
        probe.skipped.startswith("needs ~16 s, ")
        and "left of the 2.0 min time budget" in probe.skipped
    )
    assert probe.skipped.endswith("--time-budget 4 to run it")  # ceil((105 + 16) / 60) + 1
    assert said[-1] == f"[2/2] ΔCV probes: skipped, {probe.skipped}"
    # no budget: everything runs
    assert Plan([probe], budget=float("inf"), say=said.append).begin(probe) is True


def test_time_budget_skips_the_probes_and_keeps_the_checks_without_training(
    tiny_model_dir, tiny_beir_dir, tmp_path, monkeypatch
) -> None:
    import magretrieve.diagnose as dg

    def never(*args, **kwargs):
        raise AssertionError("a probe ran over the time budget")

    monkeypatch.setattr(dg, "delta_cv", never)
    monkeypatch.setattr(dg, "fisher_kappa", never)
    lines: list[str] = []
    report = dg.diagnose(
        tiny_model_dir,
        f"{tiny_beir_dir}:train",
        time_budget=1e-6,  # minutes: gone before the probes come
        progress=False,
        say=lines.append,
        **PROBES,
    )
    assert report["side"]["skipped"] is True
    for key in ("delta_cv", "fisher"):
        assert report["side"][key]["skipped"] is True
        assert "--time-budget" in report["side"][key]["reason"]
    assert any(line.startswith("[2/3] ΔCV probes (training): skipped, needs") for line in lines)
    assert report["magnitude"]["cohens_d"] is not None
    assert any("no side predictor ran" in w for w in report["recommendation"]["warnings"])


def test_cli_time_budget_and_skip_probes(tiny_model_dir, tiny_beir_dir, tmp_path) -> None:
    from magretrieve.cli import main

    base = ["diagnose", "--model", str(tiny_model_dir), "--data", f"{tiny_beir_dir}:train"]
    base += ["--probe-steps", "2", "--probe-batch-size", "3", "--fisher-batches", "1", "--json"]
    over = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "a"), "--time-budget", "1e-6"])
    assert over.exit_code == 0, over.output
    side = json.loads(over.stdout)["side"]
    assert side["skipped"] is True and "--time-budget" in side["delta_cv"]["reason"]
    # --skip-probes: no probe stage at all, and the report says so as before
    skip = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "b"), "--skip-probes"])
    assert skip.exit_code == 0, skip.output
    report = json.loads(skip.stdout)
    assert report["side"] == {"skipped": True}
    assert [s["key"] for s in report["plan"]["stages"]] == ["magnitude"]
    # a budget that allows nothing is a one-line error
    bad = CliRunner().invoke(main, [*base, "--time-budget", "0"])
    assert bad.exit_code == 1 and "--time-budget must be > 0" in bad.output
    assert "Traceback" not in bad.output
    # no limit: the probes run
    free = CliRunner().invoke(main, [*base, "--out", str(tmp_path / "c"), "--time-budget", "inf"])
    assert free.exit_code == 0, free.output
    side = json.loads(free.stdout)["side"]
    assert side["delta_cv"]["steps"] == 2 and side["fisher"]["n_examples"] >= 2


def test_cli_default_time_budget_is_the_library_default() -> None:
    from magretrieve.cli.cmd_diagnose import TIME_BUDGET
    from magretrieve.diagnose.plan import DEFAULT_TIME_BUDGET

    assert TIME_BUDGET == DEFAULT_TIME_BUDGET == 10.0


# ----------------------------------------------------------------------------- verdict


def _no_prior_helped(monkeypatch) -> None:
    import magretrieve.diagnose.report as rp

    evidence = dict(rp.load_evidence())
    evidence["best_prior"] = {**evidence["best_prior"], "method": "none", "row": "none"}
    monkeypatch.setattr(rp, "load_evidence", lambda: evidence)


PREDICTORS = {"delta_cv": 0.73, "kappa": {"qnorm": 3.9e3, "dnorm": 1.2e8}}


@pytest.mark.parametrize(
    ("figures", "no_prior", "headline"),
    [
        ({"removed_normalize": True, **PREDICTORS}, False, "cosine + document prior"),
        ({"cohens_d": -0.4, "delta_cv": 6.1}, False, "cosine + document prior"),
        ({"removed_normalize": True, "cohens_d": -0.4}, False, "cosine + document prior"),
        ({"removed_normalize": True, **PREDICTORS}, True, "cosine"),
        ({"delta_cv": 1.3, "kappa": {"qnorm": 50.0, "dnorm": 10.0}}, False, "qnorm"),
        ({"delta_cv": 6.1, "kappa": {"qnorm": 5.0, "dnorm": 10.0}}, False, "dnorm"),
        ({"kappa": {"qnorm": 50.0, "dnorm": 10.0}, "cohens_d": 0.7}, False, "dnorm"),
        ({}, False, "qnorm"),
    ],
)
def test_verdict_bullets_agree_with_the_recommendation(
    figures, no_prior, headline, monkeypatch
) -> None:
    from magretrieve.diagnose.html import _verdict

    if no_prior:
        _no_prior_helped(monkeypatch)
    rec = recommend(figures).to_dict()
    text = verdict_text({"recommendation": rec})
    page = _verdict({"recommendation": rec})
    assert text.splitlines()[0] == f"recommended: {headline}"
    assert f"Recommended: {headline}</p>" in page
    mode = headline.split()[0]
    for shown in (text, page):
        # every "→ side" the verdict prints is the side it recommends
        assert set(ARROW.findall(shown)) <= {mode}, shown
    bullets = text.splitlines()[1:]
    if mode == "cosine":
        # the side predictors' pick appears once, as the conditional line, never as a reason
        assert not any(r.startswith(("ΔCV", "Fisher")) for r in rec["reasons"])
        one_sided = [b for b in bullets if "one-sided anyway" in b]
        assert len(one_sided) == 1 and one_sided[0].startswith("  - if you fine-tune one-sided")
        assert not any("qnorm is the default" in b for b in bullets)
    if headline == "cosine + document prior":
        assert rec["magnitude"] == "document_prior"
        assert any("fit-prior" in b for b in bullets) and any("rescale" in b for b in bullets)
    if headline == "cosine":
        assert rec["magnitude"] == "" and not any("fit-prior" in b for b in bullets)
        assert [s.split()[1] for s in rec["next_steps"]] == ["train"]


def test_verdict_cites_no_repository_paths(tiny_st_dir, tiny_beir_dir, tmp_path) -> None:
    from magretrieve.cli import main

    rec = recommend({"removed_normalize": True, **PREDICTORS}).to_dict()
    assert not REPO_PATH.search(verdict_text({"recommendation": rec})), rec["reasons"]
    out = tmp_path / "r"
    args = ["diagnose", "--model", str(tiny_st_dir), "--data", f"{tiny_beir_dir}:train"]
    args += ["--out", str(out), "--skip-probes"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    verdict = result.stdout.split("\n\n")[0]
    assert verdict.startswith("recommended: cosine + document prior")
    assert not REPO_PATH.search(verdict), verdict
    page = (out / "diagnose.html").read_text()
    assert not REPO_PATH.search(page), REPO_PATH.search(page)


# ----------------------------------------------------------------------------- naming


def test_tables_and_plot_titles_name_the_encoder(
    tiny_model_dir, tiny_beir_dir, tmp_path, monkeypatch
) -> None:
    from magretrieve.cli import main
    from magretrieve.diagnose import plots

    titles: list[str] = []

    def spy(fn):
        def wrapped(*args, **kwargs):
            titles.append(args[-1] if isinstance(args[-1], str) else kwargs["title"])
            return fn(*args, **kwargs)

        return wrapped

    for name in ("norm_histograms", "norm_length_scatter", "score_decomposition", "symmetry_bars"):
        monkeypatch.setattr(plots, name, spy(getattr(plots, name)))
    out = tmp_path / "r"
    args = ["diagnose", "--model", str(tiny_model_dir), "--data", f"{tiny_beir_dir}:train"]
    args += ["--sts", str(_sts(tmp_path / "stsb")), "--out", str(out), "--skip-probes"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    name = Path(tiny_model_dir).name
    assert len(titles) == 4
    assert all(t.startswith(f"{name}: ") for t in titles), titles
    assert not any(re.search(r"\bmodel\b", t, re.I) for t in titles), titles
    header = next(line for line in result.stdout.splitlines() if "Cohen's d ‖d‖" in line)
    assert header.split()[0] == "encoder"
    assert any(line.split()[:1] == [name] for line in result.stdout.splitlines())
    page = (out / "diagnose.html").read_text()
    assert "<th>encoder</th>" in page and "<th>model</th>" not in page
    assert f"<td>{name}</td>" in page


# ----------------------------------------------------------------------------- corpus sample


def test_corpus_sample_keeps_judged_documents_and_fits_the_allowance() -> None:
    from magretrieve.data.readers import Document, RetrievalDataset
    from magretrieve.diagnose.plan import corpus_sample

    corpus = {f"d{i}": Document(f"d{i}", f"text {i}") for i in range(10)}
    data = RetrievalDataset("x", "train", corpus, {"q0": "q"}, {"q0": {"d7": 1, "d8": 0}})
    costs = {f"d{i}": 2.0 for i in range(10)}  # 20 s in all
    same, note = corpus_sample(data, costs, 20.0, seed=1)
    assert same is data and note == ""
    # 9 s: the two judged documents (4 s), then two more at 2 s each (8 s); a third would pass 9
    small, note = corpus_sample(data, costs, 9.0, seed=1)
    assert len(small.corpus) == 4 and {"d7", "d8"} <= set(small.corpus)
    assert note.startswith("a sample of 4 of 10 documents (all 2 judged ones")
    assert small.qrels == data.qrels and small.queries == data.queries
    assert corpus_sample(data, costs, 9.0, seed=1)[0].corpus.keys() == small.corpus.keys()
    # less than the judged documents cost: those are kept all the same
    assert set(corpus_sample(data, costs, 0.0, seed=1)[0].corpus) == {"d7", "d8"}


def test_budget_samples_the_corpus_and_the_report_says_so(tiny_model_dir, tiny_beir_dir) -> None:
    import magretrieve.diagnose as dg

    lines: list[str] = []
    report = dg.diagnose(
        tiny_model_dir,
        f"{tiny_beir_dir}:train",
        skip_probes=True,
        time_budget=1e-6,  # minutes: nothing to spend, only the judged documents are kept
        progress=False,
        say=lines.append,
    )
    data = dg.load_beir(f"{tiny_beir_dir}:train")
    judged = {d for docs in data.qrels.values() for d in docs}
    assert len(judged) < len(data.corpus)
    expected = f"a sample of {len(judged)} of {len(data.corpus)} documents"
    assert report["corpus_sample"].startswith(expected)
    assert expected in lines[1] and any(
        line.startswith(f"The magnitude figures use {expected}") and "--time-budget" in line
        for line in lines
    )
    assert report["magnitude"]["verdict"].endswith(f"measured on {report['corpus_sample']}")
