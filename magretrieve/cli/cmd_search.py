"""``magretrieve search EXPORT_DIR --store SPEC "query" -k 5 [--json]``."""

from __future__ import annotations

import json

import click

from magretrieve.cli._common import collect_store_options, search_store_options
from magretrieve.cli._group import main
from magretrieve.serving.retriever import DEFAULT_K


def _snippet(hit: object, width: int = 60) -> str:
    title = getattr(hit, "title", "") or getattr(hit, "text", "")
    title = " ".join(str(title).split())
    return title if len(title) <= width else title[: width - 1] + "…"


@main.command("search")
@click.argument("export_dir", type=click.Path(file_okay=False))
@click.argument("query", nargs=-1, required=True)
@click.option(
    "--store", "store_spec", required=True, help="Store spec, e.g. faiss:indexes/scifact."
)
@click.option("-k", "k", type=int, default=DEFAULT_K, show_default=True, help="Hits per query.")
@click.option("--json", "as_json", is_flag=True, help="Print hits as JSON.")
@click.option("--force", is_flag=True, help="Search a store built by another model.")
@search_store_options
def search_cmd(
    export_dir: str,
    query: tuple[str, ...],
    store_spec: str,
    k: int,
    as_json: bool,
    force: bool,
    **store_kw: object,
) -> None:
    """Search the store with QUERY; shows score = ‖q‖·doc_norm·cosine for each hit."""
    from magretrieve.serving.retriever import Retriever

    text = " ".join(query)
    with Retriever.load(
        export_dir,
        store=store_spec,
        force=force,
        create=False,
        **collect_store_options(**store_kw),
    ) as retriever:
        hits = retriever.search(text, k=k)
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
        click.echo("no hits (is the store empty?)")
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
