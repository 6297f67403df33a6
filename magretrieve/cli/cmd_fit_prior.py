"""`magretrieve fit-prior`: choose a document prior on training queries, for `rescale`."""

from __future__ import annotations

import click

from magretrieve.cli._common import hub_k_option, model_option
from magretrieve.cli._group import main


@main.command("fit-prior")
@model_option("The cosine model that built (or will build) the store: run folder or ONNX export.")
@click.option(
    "--data", "train_spec", required=True, help="BEIR DIR:split with judged training queries."
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    help="JSON to write (read by `magretrieve rescale --prior-file`, and by `magretrieve "
    "annotate --prior-file` when the prior is a multiplier, e.g. --method hub).",
)
@click.option(
    "--method",
    default="auto",
    show_default=True,
    help="auto (every method, every numeric document field, and the best combinations), none, "
    "hub, csls, csls-queries, csls-corpus, inverted-softmax, center, field:NAME (a numeric "
    "document field; field:_length is the document's length in words; optionally "
    "field:NAME:TRANSFORM[:MISSING]), fields (the best numeric field), or a combination such "
    "as hub+field:citations.",
)
@click.option(
    "--eval",
    "eval_specs",
    multiple=True,
    help="BEIR DIR:split to report NDCG@10 with and without the prior (held-out sets only).",
)
@click.option(
    "--betas",
    default=None,
    help="Comma-separated β candidates of the hub prior (default: 0.01 to 0.3).",
)
@hub_k_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def fit_prior_command(model, train_spec, out, method, eval_specs, betas, k, as_json):
    """Choose a document prior and its parameters by NDCG@10 of TRAINING queries; write it to OUT.

    Plain cosine ("none") is always a candidate, so a prior is only switched on when it helps
    the training queries. Priors with a bank of training queries are cross-fitted (no query is
    normalized against itself). When --data's folder has only that one judged split, the
    choice is also cross-fitted over query folds and its held-out NDCG@10 reported. Never pass
    a test split as --data when another split exists.
    """
    import json
    from pathlib import Path

    from magretrieve.cli._common import load_model, print_json, print_table
    from magretrieve.core.errors import ConfigError
    from magretrieve.data.readers import load_beir
    from magretrieve.priors import HubPrior
    from magretrieve.priors.base import compact
    from magretrieve.priors.fit import (
        check_fields,
        dataset_fields,
        fit_prior,
        judged_splits,
        score_with_prior,
    )
    from magretrieve.priors.select import FOLDS, grid

    for part in method.split("+") if method != "auto" else ():
        grid(part)  # an unknown method fails before anything is encoded
    grids = {}
    if betas:
        try:
            grids["hub"] = [HubPrior(float(b), k) for b in betas.split(",") if b.strip()]
        except ValueError:
            raise ConfigError(
                f"--betas: not a comma-separated list of numbers: {betas!r}"
            ) from None
    elif k != 10:
        grids["hub"] = [HubPrior(b.beta, k) for b in grid("hub")]
    train = load_beir(train_spec, default_split="train")
    evals = [load_beir(spec) for spec in eval_specs]  # bad specs fail before encoding
    check_fields(method, dataset_fields(train))  # a bad field fails before the model loads
    folds = FOLDS if len(judged_splits(train)) == 1 else None
    encoder = load_model(model, None)
    selection = fit_prior(
        encoder, train, method=method, grids=grids, progress=not as_json, cross_fit_folds=folds
    )
    written = selection.to_dict()
    from magretrieve.stores.base import atomic_write_bytes

    target = Path(out)
    # temp file + fsync + rename: a crash leaves the old file or the new one, never half
    atomic_write_bytes(target, (json.dumps(written, indent=1) + "\n").encode())
    evaluations = [
        score_with_prior(encoder, data, selection.prior, progress=not as_json) for data in evals
    ]
    if as_json:
        shown = compact(written)  # the query bank and mean vector stay in the file
        print_json({"prior": shown, "evaluations": evaluations, "out": str(target)})
        return
    click.echo(
        f"prior: {written['label']}, chosen on {selection.chosen_on} "
        f"(training NDCG@10 {selection.training_ndcg:.4f}); wrote {target}"
    )
    if selection.truncated_queries:
        click.echo(
            f"note: {selection.truncated_queries} training query(ies) longer than the model's "
            "query length were truncated"
        )
    held = selection.held_out
    if held is not None:
        click.echo(
            f"held out ({held.folds} query folds, each scored with the prior chosen on the "
            f"others): cosine NDCG@10 {held.cosine:.4f}, with prior {held.prior:.4f} "
            f"(Δ {held.prior - held.cosine:+.4f})"
        )
    top = sorted(selection.grid.items(), key=lambda kv: -kv[1])[:10]
    print_table(["candidate (best 10)", "training NDCG@10"], top)
    if evaluations:
        print_table(
            ["data", "cosine NDCG@10", "with prior", "Δ", "truncated queries"],
            [
                (
                    e["data"],
                    e["cosine"],
                    e["prior"],
                    e["prior"] - e["cosine"],
                    e["truncated_queries"],
                )
                for e in evaluations
            ],
        )
