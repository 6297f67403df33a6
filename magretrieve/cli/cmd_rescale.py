"""`magretrieve rescale`: give a cosine-built store a document magnitude, no text re-encoding."""

from __future__ import annotations

from typing import Any

import click

from magretrieve.cli._common import collect_store_options, magnitude_options, store_options
from magretrieve.cli._group import main


@main.command("rescale")
@click.option("--source", required=True, help="Store built with a cosine export (read only).")
@click.option("--target", required=True, help="New store to write (Qdrant: a new Dot collection).")
@magnitude_options
@click.option(
    "--check-sample",
    type=int,
    default=16,
    show_default=True,
    help="Stored texts re-encoded to check the head's encoder built the store.",
)
@click.option(
    "--skip-encoder-check", is_flag=True, help="Do not re-encode a sample (no texts stored)."
)
@click.option("--force", is_flag=True, help="Rescale a store that has no model metadata.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@store_options
def rescale_cmd(
    source: str,
    target: str,
    magnitude: dict[str, Any],
    check_sample: int,
    skip_encoder_check: bool,
    force: bool,
    as_json: bool,
    **store_kw: object,
) -> None:
    """Write SOURCE's vectors times a magnitude into TARGET, keeping ids and payloads.

    The magnitude is a frozen-encoder norm head (--head), the hub prior (--corpus-prior β) or
    any document prior fitted by `fit-prior` (--prior-file). Query with the same cosine export
    as before: scores become m(d)·cos(q, d) + b(d); a prior with an offset b(d) stores one extra
    coordinate, which the Retriever handles.
    """
    from magretrieve.cli._common import print_magnitude_report, require_store_extra
    from magretrieve.priors.rescale import rescale_store

    require_store_extra(target)
    report = rescale_store(
        source,
        target,
        **magnitude,
        encoder_check_sample=check_sample,
        skip_encoder_check=skip_encoder_check,
        force=force,
        **collect_store_options(**store_kw),
    )
    print_magnitude_report(
        report,
        as_json,
        f"rescaled {report.count} documents: {report.source} -> {report.target}",
        {"encoder check": report.encoder_check},
    )
