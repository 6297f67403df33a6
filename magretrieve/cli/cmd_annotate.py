"""`magretrieve annotate`: write m(d) into an existing Cosine collection; search by cos·m(d)."""

from __future__ import annotations

from typing import Any

import click

from magretrieve.cli._common import magnitude_options
from magretrieve.cli._group import main
from magretrieve.cli._options import click_option
from magretrieve.stores.annotation import RECORDED_PREFETCH


@main.command("annotate")
@click.option(
    "--store",
    "store_spec",
    required=True,
    help="An existing Cosine collection or pgvector table ranked by cosine, e.g. "
    "qdrant:http://localhost:6333/docs or pgvector:postgresql://me@host/db#items.",
)
@magnitude_options
@click.option(
    "--norms-from",
    type=click.Path(file_okay=False, exists=True),
    default=None,
    help="A magnitude-keeping export (qnorm/dot/partial): m(d) = its document norm of each "
    "stored text (payload title/text or content).",
)
@click.option(
    "--field",
    default=None,
    help="Payload field (Qdrant) or new column (pgvector) that receives m(d) [default: the one "
    "an earlier annotation recorded, else magretrieve_m]. A field or column holding your own "
    "data is refused.",
)
@click_option(RECORDED_PREFETCH)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def annotate_cmd(
    store_spec: str,
    magnitude: dict[str, Any],
    norms_from: str | None,
    field: str | None,
    prefetch: int | None,
    as_json: bool,
) -> None:
    """Write each document's magnitude m(d) next to its vector in an existing Cosine store.

    Qdrant: into each point's payload; pgvector: into a new column of the table. The vectors
    are not touched. Afterwards `magretrieve search` (and Retriever.load) with the cosine
    export rank it by cos·m(d) inside the database: a cosine prefetch re-ranked by cos·m.
    The prior is the hub prior (--corpus-prior β) or a multiplier-only prior file written by
    `fit-prior` (--prior-file). While it runs the store is marked incomplete (searches rank by
    plain cosine); if it is interrupted, run the same command again.
    """
    from magretrieve.cli._common import print_magnitude_report
    from magretrieve.priors.annotate import annotate_store

    report = annotate_store(
        store_spec, **magnitude, norms_from=norms_from, field=field, prefetch=prefetch
    )
    print_magnitude_report(
        report,
        as_json,
        f"annotated {report.count} points of {report.store}: payload field {report.field!r}, "
        f"prefetch {report.prefetch}",
    )
