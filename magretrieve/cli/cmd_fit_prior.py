"""`magretrieve fit-prior`: choose the corpus prior's β on training queries, for `rescale`."""

from __future__ import annotations

import click

from magretrieve.cli._group import main


@main.command("fit-prior")
@click.option(
    "--model",
    required=True,
    help="The cosine model that built (or will build) the store: run folder or ONNX export.",
)
@click.option(
    "--data", "train_spec", required=True, help="BEIR DIR:split with judged training queries."
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False),
    help="JSON to write (read by `magretrieve rescale --prior-file`).",
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
    help="Comma-separated β candidates (default: 0 to 0.3; 0 = cosine is always tried).",
)
@click.option(
    "--k", "k", type=int, default=10, show_default=True, help="Neighbours of the hub score."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def fit_prior_command(model, train_spec, out, eval_specs, betas, k, as_json):
    """Pick β of the hub prior exp(−β·z) by NDCG@10 of TRAINING queries and write it to OUT.

    β = 0 (plain cosine) is always a candidate, so the prior is only switched on when it helps
    the training queries. Never pass a test split as --data.
    """
    import json
    from pathlib import Path

    from magretrieve.cli._common import print_json, print_table
    from magretrieve.cli.cmd_eval import _load_any
    from magretrieve.corpus_prior import DEFAULT_BETAS, fit_prior, score_with_prior
    from magretrieve.data import load_beir
    from magretrieve.errors import ConfigError

    candidates = DEFAULT_BETAS
    if betas:
        try:
            candidates = tuple(float(b) for b in betas.split(",") if b.strip())
        except ValueError:
            raise ConfigError(
                f"--betas: not a comma-separated list of numbers: {betas!r}"
            ) from None
    encoder = _load_any(model, None)
    prior = fit_prior(
        encoder,
        load_beir(train_spec, default_split="train"),
        betas=candidates,
        k=k,
        progress=not as_json,
    )
    evaluations = []
    for spec in eval_specs:
        data = load_beir(spec)
        cosine, with_prior = score_with_prior(encoder, data, prior, progress=not as_json)
        evaluations.append(
            {"data": f"{data.name}:{data.split}", "cosine": cosine, "prior": with_prior}
        )
    from magretrieve.adapters.base import atomic_write_bytes

    target = Path(out)
    # temp file + fsync + rename: a crash leaves the old file or the new one, never half
    atomic_write_bytes(target, (json.dumps(prior.to_dict(), indent=1) + "\n").encode())
    if as_json:
        print_json({"prior": prior.to_dict(), "evaluations": evaluations, "out": str(target)})
        return
    click.echo(f"β = {prior.beta:g} (k {prior.k}), chosen on {prior.chosen_on}; wrote {target}")
    print_table(["β", "training NDCG@10"], [(b, s) for b, s in prior.grid.items()])
    if evaluations:
        print_table(
            ["data", "cosine NDCG@10", "with prior", "Δ"],
            [(e["data"], e["cosine"], e["prior"], e["prior"] - e["cosine"]) for e in evaluations],
        )
