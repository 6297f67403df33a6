"""`magretrieve eval`: NDCG@10 etc. on BEIR splits, or Spearman on an STS pair file."""

from __future__ import annotations

import click

from magretrieve.cli._common import device_option, model_option
from magretrieve.cli._group import main
from magretrieve.core.similarity import MODES


@main.command("eval")
@model_option("A run folder, an HF/sentence-transformers folder, or an ONNX export folder.")
@click.option(
    "--data",
    "data_specs",
    required=True,
    multiple=True,
    help="BEIR DIR:split (default test) or an STS .jsonl.",
)
@click.option(
    "--mode",
    type=click.Choice(MODES),
    default=None,
    help="Score with this mode (default: the model's own).",
)
@click.option("--batch-size", type=int, default=64, show_default=True)
@device_option("Encode on a CUDA GPU (torch, or onnxruntime's CUDA provider for an export).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def eval_command(model, data_specs, mode, batch_size, device, as_json):
    """Evaluate MODEL with exact search under its (or --mode's) similarity."""
    from pathlib import Path

    from magretrieve.cli._common import load_model, print_json, print_table
    from magretrieve.core.extras import require
    from magretrieve.data.readers import is_sentence_pair_file, load_beir, load_sentence_pairs
    from magretrieve.evaluation.retrieval import evaluate_retrieval, evaluate_sts

    if any(is_sentence_pair_file(spec) for spec in data_specs):
        require("scipy.stats", what="STS evaluation")  # before anything is encoded
    encoder = load_model(model, mode, device)
    results = []
    for spec in data_specs:
        if is_sentence_pair_file(spec):
            res = evaluate_sts(
                encoder,
                load_sentence_pairs(spec),
                name=Path(spec).stem,
                batch_size=batch_size,
                progress=not as_json,
            )
        else:
            res = evaluate_retrieval(
                encoder, load_beir(spec), batch_size=batch_size, progress=not as_json
            )
        results.append(res.to_dict())
    if as_json:
        print_json(
            {"model": str(model), "results": results}
            if len(results) > 1
            else {"model": str(model), **results[0]}
        )
        return
    retrieval = [r for r in results if "ndcg_at_10" in r]
    sts = [r for r in results if "spearman_ab" in r]
    if retrieval:
        print_table(
            [
                "data",
                "mode",
                "NDCG@10",
                "R@100",
                "MRR@10",
                "Cohen's d ‖d‖",
                "CV ‖d‖",
                "queries",
                "truncated queries",
                "docs",
            ],
            [
                (
                    r["dataset"],
                    r["mode"],
                    r["ndcg_at_10"],
                    r["recall_at_100"],
                    r["mrr_at_10"],
                    r["cohens_d"],
                    r["norm_cv"],
                    r["n_queries"],
                    r["truncated_queries"] if r["truncated_queries"] >= 0 else "?",
                    r["n_documents"],
                )
                for r in retrieval
            ],
        )
    if sts:
        print_table(
            ["data", "mode", "Spearman s(a,b)", "Spearman s(b,a)", "mean |s(a,b)-s(b,a)|", "pairs"],
            [
                (
                    r["dataset"],
                    r["mode"],
                    r["spearman_ab"],
                    r["spearman_ba"],
                    r["mean_asymmetry"],
                    r["n_pairs"],
                )
                for r in sts
            ],
        )
