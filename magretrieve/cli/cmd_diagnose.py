"""`magretrieve diagnose`: magnitude signal, which side to normalize, and the symmetry check."""

from __future__ import annotations

import math

import click

from magretrieve.cli._common import model_option, seed_option
from magretrieve.cli._group import main

#: = magretrieve.diagnose.plan.DEFAULT_TIME_BUDGET (not imported: the CLI loads without torch)
TIME_BUDGET = 10.0


@main.command("diagnose")
@model_option("A run folder, an HF/sentence-transformers folder, or an alias.")
@click.option("--data", "data_spec", required=True, help="BEIR DIR:split (default split train).")
@click.option("--sts", "sts_file", default=None, help="An STS pair .jsonl for the symmetry check.")
@click.option(
    "--out", default="report", show_default=True, help="Folder for diagnose.json and PNGs."
)
@click.option(
    "--run",
    "runs",
    multiple=True,
    help="A trained run folder to report next to MODEL (repeatable).",
)
@click.option(
    "--probe-steps", type=int, default=100, show_default=True, help="Steps of each ΔCV probe."
)
@click.option("--probe-batch-size", type=int, default=16, show_default=True)
@click.option("--probe-lr", type=float, default=2e-5, show_default=True)
@click.option(
    "--probe-max-doc-length",
    type=int,
    default=128,
    show_default=True,
    help="Cap document tokens in the probes and Fisher estimate (CPU budget).",
)
@click.option(
    "--fisher-batches", type=int, default=8, show_default=True, help="Batches for Fisher κ."
)
@click.option("--skip-probes", is_flag=True, help="Skip ΔCV probes and Fisher κ (no training).")
@click.option(
    "--time-budget",
    type=float,
    default=TIME_BUDGET,
    show_default=True,
    metavar="MINUTES",
    help="Minutes the run may take: the corpus is sampled and probe stages are skipped to fit "
    "(inf: no limit).",
)
@click.option("--cache", "cache_dir", default=None, help="Keep raw embeddings here between runs.")
@click.option(
    "--compare-results",
    "results_dir",
    default=None,
    help="Folder of measured qnorm-s*.json/dnorm-s*.json runs to check the predictors against.",
)
@seed_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def diagnose_command(
    model,
    data_spec,
    sts_file,
    out,
    runs,
    probe_steps,
    probe_batch_size,
    probe_lr,
    probe_max_doc_length,
    fisher_batches,
    skip_probes,
    time_budget,
    cache_dir,
    results_dir,
    seed,
    as_json,
):
    """Tell whether magnitude carries relevance for MODEL on DATA and which mode to train.

    The stages and an estimate of their time are printed first; the checks without training
    run first, the probe trainings only within --time-budget (or never, with --skip-probes).
    """
    from magretrieve.cli._common import print_json, print_table, require_torch

    require_torch("magretrieve diagnose")
    from magretrieve.diagnose import diagnose
    from magretrieve.diagnose.report import to_jsonable

    report = diagnose(
        model,
        data_spec,
        sts=sts_file,
        out=out,
        runs=runs,
        probe_steps=probe_steps,
        probe_batch_size=probe_batch_size,
        probe_lr=probe_lr,
        probe_max_document_length=probe_max_doc_length,
        fisher_batches=fisher_batches,
        skip_probes=skip_probes,
        time_budget=None if math.isinf(time_budget) else time_budget,
        cache_dir=cache_dir,
        results_dir=results_dir,
        seed=seed,
        progress=not as_json,
        say=lambda line: click.echo(line, err=True),
    )
    if as_json:
        print_json(to_jsonable(report))
        return
    click.echo(report["verdict"])
    click.echo("")
    rows = [(report["name"], report["magnitude"])] + [(r["name"], r) for r in report["runs"]]
    print_table(
        [
            "encoder",
            "mode",
            "Cohen's d ‖d‖",
            "CV ‖d‖",
            "r(‖d‖,len)",
            "ρ(‖d‖,len)",
            "NDCG@10 cos",
            "NDCG@10 dot",
        ],
        [
            (
                name,
                m["mode"],
                m["cohens_d"],
                m["norm_cv"],
                m["pearson_norm_length"],
                m["spearman_norm_length"],
                m["ndcg_at_10"].get("cosine"),
                m["ndcg_at_10"].get("dot"),
            )
            for name, m in rows
        ],
    )
    side = report["side"]
    if not side.get("skipped") or "delta_cv" in side:
        click.echo("")
        print_table(["predictor", "value", "picks"], _predictor_rows(side))
    if report.get("sts"):
        click.echo("")
        print_table(
            ["mode", "Spearman s(a,b)", "Spearman s(b,a)", "mean |s(a,b)-s(b,a)|", "max"],
            [
                (
                    r["mode"],
                    r["spearman_ab"],
                    r["spearman_ba"],
                    r["mean_asymmetry"],
                    r["max_asymmetry"],
                )
                for r in report["sts"]
            ],
        )
    if report.get("validation") is not None:
        click.echo("")
        if not report["validation"]:
            click.echo(f"validation: no qnorm/dnorm results in {results_dir} yet (pending)")
        else:
            print_table(
                ["data", "NDCG@10 qnorm", "NDCG@10 dnorm", "better", "ΔCV picks", "κ picks"],
                [
                    (
                        r["data"],
                        r["qnorm"] if r["qnorm"] is not None else "-",
                        r["dnorm"] if r["dnorm"] is not None else "-",
                        r["better"],
                        f"{r['delta_cv'] or '-'} ({_hit(r['delta_cv_agrees'])})",
                        f"{r['kappa'] or '-'} ({_hit(r['kappa_agrees'])})",
                    )
                    for r in report["validation"]
                ],
            )
    click.echo("")
    click.echo(
        f"wrote {report.get('report')}, {report.get('html')} and {len(report['plots'])} plots"
    )


def _predictor_rows(side: dict) -> list[tuple]:
    from magretrieve.cli._common import fmt

    dcv, fis = side["delta_cv"], side["fisher"]
    rows = []
    if dcv.get("skipped"):
        rows.append(("ΔCV probes", "-", f"skipped: {dcv['reason']}"))
    else:
        rows.append(
            (
                f"ΔCV = CV‖q‖ dnorm {fmt(dcv['cv_query_norm_dnorm'])} / dot "
                f"{fmt(dcv['cv_query_norm_dot'])} ({dcv['steps']} steps)",
                dcv["delta_cv"],
                dcv["prediction"] or "-",
            )
        )
    if fis.get("skipped"):
        rows.append(("Fisher κ (experimental)", "-", f"skipped: {fis['reason']}"))
    else:
        rows.append(
            (
                f"Fisher κ qnorm / dnorm (experimental, N={fis['n_examples']})",
                f"{fmt(fis['kappa']['qnorm'], 3)} / {fmt(fis['kappa']['dnorm'], 3)}",
                fis["prediction"] or "-",
            )
        )
    return rows


def _hit(agrees: bool | None) -> str:
    return "n/a" if agrees is None else ("agrees" if agrees else "disagrees")
