"""``magretrieve index EXPORT_DIR CORPUS.jsonl --store SPEC``: resumable bulk indexing."""

from __future__ import annotations

from typing import Any

import click

from magretrieve.cli._common import device_option
from magretrieve.cli._group import main
from magretrieve.engines import ENGINES
from magretrieve.serving.runtime import RUNTIMES


def _click_option(opt: Any) -> Any:
    kind: Any = click.Choice(list(opt.choices)) if opt.choices else opt.type
    return click.option(opt.cli, opt.name, type=kind, default=None, help=opt.help)


def store_options(fn):  # type: ignore[no-untyped-def]
    """The store options of every registered backend (magretrieve/stores/registry.py), as click options.

    Build-time knobs shape a store when it is created; on reopen they must match what the
    store was built with (or the store refuses them). Each backend refuses options it does
    not take, naming them.
    """
    from magretrieve.stores.registry import cli_options

    for opt in reversed(cli_options()):
        fn = _click_option(opt)(fn)
    return fn


def search_store_options(fn):  # type: ignore[no-untyped-def]
    """The search-time store knobs (``--ef-search``, ``--nprobe``, ...) for ``search``."""
    from magretrieve.stores.registry import cli_options

    for opt in reversed(cli_options(search_only=True)):
        fn = _click_option(opt)(fn)
    return fn


def collect_store_options(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


@main.command("index")
@click.argument("export_dir", type=click.Path(file_okay=False))
@click.argument("corpus", type=click.Path(dir_okay=False))
@click.option(
    "--store", "store_spec", required=True, help="Store spec, e.g. faiss:indexes/scifact."
)
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
    "--engine",
    type=click.Choice(sorted(ENGINES)),
    default="local",
    show_default=True,
    help="Where documents are encoded: this process, or a Ray cluster (magretrieve[ray]); "
    "either way this process writes the store.",
)
@click.option(
    "--address",
    default=None,
    help="Ray cluster to join (e.g. auto, ray://head:10001); default: start a local Ray.",
)
@click.option(
    "--workers", type=int, default=None, help="Ray encoding actors (default: one per CPU)."
)
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
    engine: str,
    address: str | None,
    workers: int | None,
    **store_kw: object,
) -> None:
    """Encode CORPUS.jsonl with EXPORT_DIR's document graph into the store.

    Re-running skips ids the store already holds, so an interrupted run resumes.
    """
    from magretrieve.core.errors import ConfigError
    from magretrieve.serving.indexing import check_corpus_file, index_corpus
    from magretrieve.stores.registry import check_spec_before_encoding

    engine_options: dict[str, object] = {}
    if engine == "ray":
        engine_options = {"address": address, "workers": workers}
        if threads is not None:
            engine_options["threads"] = threads
        if runtime is not None:
            raise ConfigError(
                "--runtime applies to --engine local (Ray workers use the export's own runtime)"
            )
    elif address is not None or workers is not None:
        raise ConfigError("--address and --workers need --engine ray")
    from magretrieve.serving.retriever import Retriever

    # a spec naming a regular file, or a store that keeps nothing, fails before any encoding
    check_spec_before_encoding(store_spec, must_persist=True)
    # the whole file is validated first: a bad corpus never creates or half-fills a store
    documents = check_corpus_file(corpus, skip_empty=skip_empty)
    with Retriever.load(
        export_dir,
        store=store_spec,
        force=force,
        threads=threads,
        device=device,
        runtime=runtime,
        for_writing=True,
        **collect_store_options(**store_kw),
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
            **engine_options,
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
