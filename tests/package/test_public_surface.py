"""The public surface, pinned: ``magretrieve.__all__``, the CLI's commands and their options,
the install extras and the integration modules.

The expected lists are literals on purpose. A change here is a change users see: make it
deliberately, update ``docs/api.md`` and the CHANGELOG with it, then this file.
"""

from __future__ import annotations

import pkgutil
from importlib.metadata import metadata

import click

import magretrieve
import magretrieve.integrations
from magretrieve.cli import main

PUBLIC_NAMES = [
    "ConfigError",
    "DEFAULT_K",
    "DataError",
    "Document",
    "DocumentPrior",
    "Encoder",
    "EncoderConfig",
    "Hit",
    "MODES",
    "MagRetrieveError",
    "Manifest",
    "ManifestError",
    "OnnxEncoder",
    "RetrievalDataset",
    "Retriever",
    "SentencePair",
    "Similarity",
    "StoreError",
    "StoreHit",
    "SymmetryError",
    "TrainConfig",
    "TrainingPair",
    "VectorStore",
    "__version__",
    "choose_prior",
    "diagnose_model",
    "evaluate_retrieval",
    "evaluate_sts",
    "export_model",
    "fit_prior",
    "index_corpus",
    "index_documents",
    "load_beir",
    "load_corpus",
    "load_pairs",
    "load_sentence_pairs",
    "load_training_data",
    "open_store",
    "prior_from_dict",
    "recommend",
    "rescale_store",
    "retrieval_metrics",
    "train_model",
]

#: Options of the ``magretrieve`` group itself.
GROUP_OPTIONS = ["--verbose", "--version", "-v"]

#: Command -> its arguments (upper case) and option names, sorted.
COMMANDS: dict[str, list[str]] = {
    "annotate": [
        "--corpus-prior",
        "--field",
        "--head",
        "--json",
        "--k",
        "--norms-from",
        "--prefetch",
        "--prior-file",
        "--store",
    ],
    "diagnose": [
        "--cache",
        "--compare-results",
        "--data",
        "--fisher-batches",
        "--json",
        "--model",
        "--out",
        "--probe-batch-size",
        "--probe-lr",
        "--probe-max-doc-length",
        "--probe-steps",
        "--run",
        "--seed",
        "--skip-probes",
        "--sts",
        "--time-budget",
    ],
    "eval": [
        "--batch-size",
        "--data",
        "--device",
        "--json",
        "--mode",
        "--model",
    ],
    "export": [
        "--calibration-data",
        "--calibration-size",
        "--device",
        "--eval-data",
        "--exporter",
        "--gamma-d",
        "--gamma-q",
        "--json",
        "--mode",
        "--no-optimize",
        "--optimize",
        "--overwrite",
        "--quantize",
        "DEST",
        "SRC",
    ],
    "fit-prior": [
        "--betas",
        "--data",
        "--eval",
        "--json",
        "--k",
        "--method",
        "--model",
        "--out",
    ],
    "index": [
        "--address",
        "--batch-size",
        "--checkpoint-every",
        "--connect-timeout",
        "--device",
        "--ef-construction",
        "--ef-search",
        "--engine",
        "--faiss-index",
        "--force",
        "--hnsw-m",
        "--nlist",
        "--no-progress",
        "--nprobe",
        "--prefetch",
        "--quantization",
        "--replication-factor",
        "--runtime",
        "--scann-exact-below",
        "--scann-leaves",
        "--scann-leaves-to-search",
        "--scann-reorder",
        "--shard-number",
        "--skip-empty",
        "--store",
        "--target-recall",
        "--threads",
        "--tuning-queries",
        "--workers",
        "CORPUS",
        "EXPORT_DIR",
    ],
    "recall": [
        "--ef-search",
        "--force",
        "--json",
        "--nprobe",
        "--prefetch",
        "--queries",
        "--scann-leaves-to-search",
        "--scann-reorder",
        "--store",
        "--target",
        "EXPORT_DIR",
    ],
    "rescale": [
        "--check-sample",
        "--corpus-prior",
        "--ef-construction",
        "--ef-search",
        "--faiss-index",
        "--force",
        "--head",
        "--hnsw-m",
        "--json",
        "--k",
        "--nlist",
        "--nprobe",
        "--prefetch",
        "--prior-file",
        "--quantization",
        "--replication-factor",
        "--scann-exact-below",
        "--scann-leaves",
        "--scann-leaves-to-search",
        "--scann-reorder",
        "--shard-number",
        "--skip-encoder-check",
        "--source",
        "--target",
        "--target-recall",
    ],
    "search": [
        "--ef-search",
        "--force",
        "--json",
        "--nprobe",
        "--prefetch",
        "--scann-leaves-to-search",
        "--scann-reorder",
        "--store",
        "--where",
        "-k",
        "EXPORT_DIR",
        "QUERY",
    ],
    "serve": [
        "--access-log",
        "--api-key",
        "--ef-search",
        "--force",
        "--graph-workers",
        "--host",
        "--limit-concurrency",
        "--max-batch-rows",
        "--max-batch-tokens",
        "--max-inputs",
        "--max-queue",
        "--max-text-chars",
        "--max-wait-ms",
        "--model-id",
        "--no-batching",
        "--no-onnx-spinning",
        "--nprobe",
        "--onnx-spinning",
        "--port",
        "--prefetch",
        "--recall-cpu-share",
        "--recall-sample",
        "--runtime",
        "--scann-leaves-to-search",
        "--scann-reorder",
        "--store",
        "--threads",
        "--timeout-body",
        "--timeout-keep-alive",
        "--timeout-response",
        "EXPORT_DIR",
    ],
    "train": [
        "--batch-size",
        "--calibrate-scale",
        "--device",
        "--doc-prefix",
        "--epochs",
        "--eval",
        "--force",
        "--freeze-encoder",
        "--gamma-init",
        "--gamma-lr",
        "--hard-negatives",
        "--head-lr",
        "--json",
        "--lr",
        "--max-doc-length",
        "--max-query-length",
        "--max-steps",
        "--mine-hard-negatives",
        "--mini-batch-size",
        "--mode",
        "--model",
        "--norm-head",
        "--norm-head-bound",
        "--norm-head-hidden",
        "--out",
        "--pooling",
        "--precision",
        "--query-prefix",
        "--scale",
        "--seed",
        "--task",
        "--train",
        "--val-fraction",
    ],
}

EXTRAS = [
    "all",
    "chroma",
    "clients",
    "dev",
    "eval",
    "faiss",
    "haystack",
    "lancedb",
    "langchain",
    "llama-index",
    "milvus",
    "minilm",
    "openvino",
    "openvino-int8",
    "peer",
    "pgvector",
    "qdrant",
    "qdrant-edge",
    "ray",
    "scann",
    "serve",
    "server",
    "train",
]

INTEGRATIONS = ["haystack", "langchain", "llama_index", "vector_stores"]


def names_of(command: click.Command) -> list[str]:
    """The arguments (as usage shows them) and every option spelling of a command, sorted."""
    names: list[str] = []
    for param in command.params:
        if isinstance(param, click.Argument):
            names.append(param.human_readable_name)
        else:
            names.extend([*param.opts, *param.secondary_opts])
    return sorted(names)


def test_public_names_are_pinned() -> None:
    assert sorted(magretrieve.__all__) == PUBLIC_NAMES
    assert len(set(magretrieve.__all__)) == len(magretrieve.__all__)
    for name in PUBLIC_NAMES:
        assert getattr(magretrieve, name) is not None, name


def test_cli_commands_and_options_are_pinned() -> None:
    ctx = click.Context(main)
    assert sorted(main.list_commands(ctx)) == sorted(COMMANDS)
    assert sorted(o for p in main.params for o in [*p.opts, *p.secondary_opts]) == GROUP_OPTIONS
    for name, expected in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None, name
        assert names_of(command) == expected, name


def test_install_extras_are_pinned() -> None:
    # every extra keeps its name once released (new ones may be added beside them)
    assert sorted(metadata("magretrieve").get_all("Provides-Extra") or []) == EXTRAS


def test_integration_modules_are_pinned() -> None:
    public = [
        m.name for m in pkgutil.iter_modules(magretrieve.integrations.__path__)
        if not m.name.startswith("_")
    ]  # fmt: skip
    assert sorted(public) == INTEGRATIONS
