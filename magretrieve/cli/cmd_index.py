"""``magretrieve index EXPORT_DIR CORPUS.jsonl --store SPEC``: resumable bulk indexing."""

from __future__ import annotations

import click

from magretrieve.cli._common import device_option
from magretrieve.cli._group import main


def store_options(fn):  # type: ignore[no-untyped-def]
    """Options that shape a store when it is created (ignored for build-time knobs on reopen)."""
    decorators = [
        click.option(
            "--faiss-index",
            "index_type",
            default=None,
            help="FAISS index: flat (exact, default), hnsw, ivf, or a faiss.index_factory "
            "string (inner product is always used).",
        ),
        click.option("--hnsw-m", type=int, default=None, help="HNSW M (FAISS default 32)."),
        click.option(
            "--ef-construction", type=int, default=None, help="HNSW efConstruction (FAISS 200)."
        ),
        click.option("--ef-search", type=int, default=None, help="HNSW efSearch (FAISS 128)."),
        click.option("--nlist", type=int, default=None, help="FAISS IVF lists (default ~4·√n)."),
        click.option("--nprobe", type=int, default=None, help="FAISS IVF lists probed (16)."),
        click.option(
            "--quantization",
            type=click.Choice(["int8"]),
            default=None,
            help="Qdrant / Edge scalar quantization (searched with rescoring).",
        ),
        click.option("--shard-number", type=int, default=None, help="Qdrant server: shards."),
        click.option(
            "--replication-factor", type=int, default=None, help="Qdrant server: replicas."
        ),
    ]
    for deco in reversed(decorators):
        fn = deco(fn)
    return fn


def collect_store_options(**kw: object) -> dict[str, object]:
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
@click.option("--force", is_flag=True, help="Write into a store built by another model.")
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@store_options
def index_cmd(
    export_dir: str,
    corpus: str,
    store_spec: str,
    batch_size: int,
    checkpoint_every: int,
    threads: int | None,
    device: str,
    force: bool,
    no_progress: bool,
    **store_kw: object,
) -> None:
    """Encode CORPUS.jsonl with EXPORT_DIR's document graph into the store.

    Re-running skips ids the store already holds, so an interrupted run resumes.
    """
    from magretrieve.indexing import index_corpus
    from magretrieve.retriever import Retriever

    with Retriever.load(
        export_dir,
        store=store_spec,
        force=force,
        threads=threads,
        device=device,
        **collect_store_options(**store_kw),
    ) as retriever:
        report = index_corpus(
            retriever,
            corpus,
            batch_size=batch_size,
            checkpoint_every=checkpoint_every,
            progress=not no_progress,
        )
        click.echo(
            f"{retriever.store.location}: {report.added} added, {report.skipped} already stored, "
            f"{report.count} in store ({report.docs_per_second:.1f} docs/s)"
        )
        if report.truncated:
            limit = getattr(retriever.manifest, "max_document_length", "?")
            click.echo(
                f"note: {report.truncated} document(s) longer than max_document_length={limit} "
                "tokens were truncated (only their first tokens are indexed)"
            )
