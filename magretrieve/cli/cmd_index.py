"""``magretrieve index EXPORT_DIR CORPUS.jsonl --store SPEC``: resumable bulk indexing."""

from __future__ import annotations

import click

from magretrieve.cli._common import (
    collect_store_options,
    device_option,
    store_options,
    store_spec_option,
)
from magretrieve.cli._group import main
from magretrieve.cli._options import click_options
from magretrieve.engines import ENGINES, engine_options, option_specs
from magretrieve.serving.onnx_encoder import RUNTIMES


def engine_flags(fn):  # type: ignore[no-untyped-def]
    """``--engine`` and the options every engine declares (magretrieve/engines), as click options."""
    fn = click_options(option_specs())(fn)
    where = ", or ".join(e.help for e in ENGINES.values())
    return click.option(
        "--engine",
        type=click.Choice(sorted(ENGINES)),
        default="local",
        show_default=True,
        help=f"Where documents are encoded: {where}; either way this process writes the store.",
    )(fn)


@main.command("index")
@click.argument("export_dir", type=click.Path(file_okay=False))
@click.argument("corpus", type=click.Path(dir_okay=False))
@store_spec_option
@click.option(
    "--batch-size",
    type=int,
    default=256,
    show_default=True,
    help="Documents read, length-sorted, encoded and written together (the graph runs them "
    "in padded-token-budget batches, docs/export.md).",
)
@click.option(
    "--checkpoint-every",
    type=int,
    default=4096,
    show_default=True,
    help="Persist the store after this many new documents (a resumed run skips them).",
)
@click.option(
    "--threads",
    type=int,
    default=None,
    help="onnxruntime intra-op threads (default: the cores this process may use, or "
    "$MAGRETRIEVE_ONNX_THREADS).",
)
@device_option("Run the document graph on onnxruntime's CUDA provider (cuda) or the CPU.")
@click.option(
    "--runtime",
    type=click.Choice(list(RUNTIMES)),
    default=None,
    help="What runs the graphs: onnxruntime, or OpenVINO (magretrieve[openvino]) in fp32 or, "
    "on CPUs with native bf16, bfloat16 (docs/export.md, 'Runtimes'). Default: the export's "
    "own (onnxruntime; OpenVINO for --quantize int8-static exports).",
)
@click.option("--force", is_flag=True, help="Write into a store built by another model.")
@click.option(
    "--skip-empty",
    is_flag=True,
    help="Skip (and count) documents with empty title and text instead of refusing the corpus.",
)
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@click.option(
    "--tuning-queries",
    type=click.Path(dir_okay=False),
    default=None,
    help="Queries like yours (one text per line, or a BEIR queries.jsonl) that an ANN store "
    "tunes --target-recall on and measures its recall with; default: pseudo-queries made "
    "from the corpus.",
)
@engine_flags
@store_options
def index_cmd(
    export_dir: str,
    corpus: str,
    store_spec: str,
    batch_size: int,
    checkpoint_every: int,
    threads: int | None,
    device: str,
    runtime: str | None,
    force: bool,
    skip_empty: bool,
    no_progress: bool,
    tuning_queries: str | None,
    engine: str,
    **options: object,
) -> None:
    """Encode CORPUS.jsonl with EXPORT_DIR's document graph into the store.

    Re-running skips ids the store already holds, so an interrupted run resumes.
    """
    from magretrieve.serving.indexing import check_corpus_file, index_corpus
    from magretrieve.serving.tuning_queries import read_query_texts
    from magretrieve.stores.registry import check_spec_before_encoding

    engine_kw = {o.name: options.pop(o.name) for o in option_specs()}
    engine_kw = engine_options(engine, engine_kw, {"threads": threads, "runtime": runtime})
    from magretrieve.serving.retriever import Retriever

    # a spec naming a regular file, or a store that keeps nothing, fails before any encoding
    check_spec_before_encoding(store_spec, must_persist=True)
    # the whole file is validated first: a bad corpus never creates or half-fills a store
    documents = check_corpus_file(corpus, skip_empty=skip_empty)
    tuning = read_query_texts(tuning_queries) if tuning_queries else None
    with Retriever.load(
        export_dir,
        store=store_spec,
        force=force,
        threads=threads,
        device=device,
        runtime=runtime,
        for_writing=True,
        tuning_queries=tuning,
        **collect_store_options(**options),
    ) as retriever:
        report = index_corpus(
            retriever,
            corpus,
            batch_size=batch_size,
            checkpoint_every=checkpoint_every,
            progress=not no_progress,
            skip_empty=skip_empty,
            total=documents,
            engine=engine,
            **engine_kw,
        )
        click.echo(
            f"{retriever.store.location}: {report.added} added, {report.skipped} already stored, "
            f"{report.count} in store ({report.docs_per_second:.1f} docs/s)"
        )
        recall = retriever.store.describe()["parameters"].get("recall")
        if recall:
            from magretrieve.stores._ann_recall import warning_line

            click.echo(warning_line(recall))
        if report.truncated:
            limit = getattr(retriever.manifest, "max_document_length", "?")
            click.echo(
                f"note: {report.truncated} document(s) longer than max_document_length={limit} "
                "tokens were truncated (only their first tokens are indexed)"
            )
        if report.empty_skipped:
            shown = ", ".join(repr(i) for i in report.empty_ids or [])
            more = ", ..." if report.empty_skipped > len(report.empty_ids or []) else ""
            click.echo(
                f"note: {report.empty_skipped} document(s) with empty title and text were "
                f"skipped (--skip-empty): {shown}{more}"
            )
