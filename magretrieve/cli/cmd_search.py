"""``magretrieve search EXPORT_DIR --store SPEC "query" -k 5 [--json] [--where JSON]``."""

from __future__ import annotations

import json

import click

from magretrieve.cli._common import collect_store_options, search_store_options, store_spec_option
from magretrieve.cli._group import main
from magretrieve.core.errors import ConfigError
from magretrieve.serving.retriever import DEFAULT_K


def parse_where(value: str | None) -> dict[str, object] | None:
    """``--where``'s JSON object (``/search``'s ``filter``), or one line saying what is wrong."""
    if value is None:
        return None
    try:
        where = json.loads(value)
    except ValueError as exc:
        raise ConfigError(
            f"--where: not JSON ({exc}); give an object such as '{{\"year\": 2019}}'"
        ) from None
    if not isinstance(where, dict):
        raise ConfigError(
            f"--where: expected a JSON object of payload field: value, got {type(where).__name__}"
        )
    return where


def _snippet(hit: object, width: int = 60) -> str:
    title = getattr(hit, "title", "") or getattr(hit, "text", "")
    title = " ".join(str(title).split())
    return title if len(title) <= width else title[: width - 1] + "…"


@main.command("search")
@click.argument("export_dir", type=click.Path(file_okay=False))
@click.argument("query", nargs=-1, required=True)
@store_spec_option
@click.option("-k", "k", type=int, default=DEFAULT_K, show_default=True, help="Hits per query.")
@click.option("--json", "as_json", is_flag=True, help="Print hits as JSON.")
@click.option(
    "--where",
    "where_json",
    default=None,
    metavar="JSON",
    help="Keep hits whose payload has each field equal to the value, e.g. '{\"year\": 2019}' "
    "(the filter of the server's /search).",
)
@click.option("--force", is_flag=True, help="Search a store built by another model.")
@search_store_options
def search_cmd(
    export_dir: str,
    query: tuple[str, ...],
    store_spec: str,
    k: int,
    as_json: bool,
    where_json: str | None,
    force: bool,
    **store_kw: object,
) -> None:
    """Search the store with QUERY; shows score = ‖q‖·doc_norm·cosine for each hit."""
    from magretrieve.serving.retriever import Retriever, check_where

    text = " ".join(query)
    where = check_where(parse_where(where_json))  # refused before anything is opened
    with Retriever.load(
        export_dir,
        store=store_spec,
        force=force,
        create=False,
        **collect_store_options(**store_kw),
    ) as retriever:
        hits = retriever.search(text, k=k, where=where)
        truncated = bool(getattr(retriever.encoder, "last_truncated", 0))
        limit = getattr(retriever.manifest, "max_query_length", None)
    if as_json:
        click.echo(
            json.dumps(
                {"query": text, "truncated": truncated, "hits": [h.to_dict() for h in hits]},
                indent=2,
            )
        )
        return
    if truncated:
        click.echo(
            f"note: the query is longer than max_query_length={limit} tokens and was truncated",
            err=True,
        )
    if not hits:
        click.echo(
            "no hits (no payload matches --where)" if where else "no hits (is the store empty?)"
        )
        return
    offsets = any(h.offset for h in hits)
    rows = [
        [str(h.rank), h.id, f"{h.score:.4f}", f"{h.doc_norm:.4f}", f"{h.cosine:.4f}"]
        + ([f"{h.offset:+.4f}"] if offsets else [])
        + [_snippet(h)]
        for h in hits
    ]
    headers = [
        "rank",
        "id",
        "score",
        "doc_norm",
        "cosine",
        *(["offset"] if offsets else []),
        "title",
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    click.echo("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    click.echo("  ".join("-" * w for w in widths))
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    click.echo(
        f"query_norm {hits[0].query_norm:.4f}; score = query_norm · doc_norm · cosine"
        + (" + offset (the store's document prior)" if offsets else "")
    )
