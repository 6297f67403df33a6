"""Document speed by token budget per batch, every runtime side by side in one run.

``max_batch_tokens`` closes a length-sorted batch when ``rows × longest`` would pass it. It
sets how big each matrix product is, and how much activation memory one layer touches: a
feed-forward activation of a batch is ``budget × intermediate × 4`` bytes (all-MiniLM-L6-v2:
1,536 wide, so 12 MB at 2,048 tokens and 50 MB at 8,192). This benchmark measures which budget
runs documents fastest for each way magretrieve encodes them (PyTorch eager, onnxruntime fp32
and dynamic int8, OpenVINO fp32, bf16 where the CPU has it, and static int8), against
sentence-transformers ``encode`` (its own batches of 32) as the peer, and is where the default
``magretrieve.core.batching.DEFAULT_BATCH_TOKENS`` comes from.

One sample of abstracts spread over the corpus is cut into one slice per round; round r runs
slice r through every (runtime, budget) column in a rotated order, so each column encodes every
text once and noise from the machine hits all alike. Result: documents/s of each column as a
multiple of the peer's, a table and a PNG.

    python benchmarks/batch_budget.py
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import numpy as np
from _common import (
    cache_dir,
    encoder_benchmark_options,
    encoder_run_header,
    encoder_versions,
    markdown_table,
    rotated,
    run_and_write,
    spread_sample,
)

#: The runtimes measured, and how each is labelled.
RUNTIMES = {
    "eager": "PyTorch eager (magretrieve Encoder)",
    "ort_fp32": "ONNX fp32, onnxruntime",
    "ort_int8": "ONNX dynamic int8, onnxruntime",
    "ov_fp32": "ONNX fp32, OpenVINO",
    "ov_bf16": "ONNX graph in bf16, OpenVINO",
    "ov_int8": "static int8, OpenVINO",
}
DEFAULT_BUDGETS = "1024,2048,4096,8192"
#: Most texts per batch, high enough that the token budget alone closes every batch.
MAX_ROWS = 512


@click.command(help=__doc__.splitlines()[0])
@encoder_benchmark_options("batch_budget")
@click.option("--docs", type=int, default=768, help="documents, spread over the corpus")
@click.option("--rounds", type=int, default=3)
@click.option("--budgets", default=DEFAULT_BUDGETS, help="comma-separated tokens")
@click.option(
    "--calibration-data",
    default=None,
    help="BEIR folder calibrating the static int8 export (default: data_dir()/cranfield)",
)
def main(**options: Any) -> dict[str, Any]:
    return run_and_write(SimpleNamespace(**options), "batch_budget", run, write_results)


def run(args: Any, data: Path) -> dict[str, Any]:
    import torch
    from sentence_transformers import SentenceTransformer

    from magretrieve.core.batching import DEFAULT_BATCH_TOKENS
    from magretrieve.core.model_paths import resolve_model_path
    from magretrieve.data.readers import load_beir
    from magretrieve.export import export_model
    from magretrieve.serving.onnx_encoder import OnnxEncoder
    from magretrieve.serving.openvino_session import bf16_native
    from magretrieve.train.encoder import Encoder

    budgets = [int(b) for b in args.budgets.split(",")]
    torch.set_num_threads(args.threads)
    dataset = load_beir(f"{data}:{args.split}")
    docs = spread_sample(dataset.corpus, args.docs)
    work = Path(tempfile.mkdtemp(prefix="batch_budget-", dir=cache_dir("batch_budget")))
    fp32_dir = export_model(args.model, work / "fp32", mode=args.mode)
    int8_dir = export_model(args.model, work / "int8", mode=args.mode, quantize="int8")
    static_dir = export_model(
        args.model,
        work / "int8-static",
        mode=args.mode,
        quantize="int8-static",
        calibration_data=Path(args.calibration_data or data.parent / "cranfield"),
    )
    runtimes = {k: v for k, v in RUNTIMES.items() if k != "ov_bf16" or bf16_native()}
    onnx = {
        "ort_fp32": OnnxEncoder.load(fp32_dir, threads=args.threads, runtime="onnxruntime"),
        "ort_int8": OnnxEncoder.load(int8_dir, threads=args.threads),
        "ov_fp32": OnnxEncoder.load(fp32_dir, threads=args.threads, runtime="openvino"),
        "ov_int8": OnnxEncoder.load(static_dir, threads=args.threads),
    }
    if "ov_bf16" in runtimes:
        onnx["ov_bf16"] = OnnxEncoder.load(fp32_dir, threads=args.threads, runtime="openvino-bf16")
    st = SentenceTransformer(str(resolve_model_path(args.model)), device="cpu")
    eager = Encoder.load(args.model, mode=args.mode, device="cpu")

    def column(runtime: str, budget: int) -> Callable[[list[str]], Any]:
        if runtime == "eager":
            return lambda t: eager.embed(
                t, "document", batch_size=MAX_ROWS, max_batch_tokens=budget
            )
        enc = onnx[runtime]
        return lambda t: enc.encode_documents(t, batch_size=MAX_ROWS, max_batch_tokens=budget)

    columns: dict[str, Callable[[list[str]], Any]] = {
        "st": lambda t: st.encode(t, batch_size=32, convert_to_numpy=True)
    }
    for runtime in runtimes:
        for budget in budgets:
            columns[f"{runtime}@{budget}"] = column(runtime, budget)
    for encode in columns.values():  # warm-up: sessions, allocators, first-call paths
        encode(docs[:16])
    seconds = dict.fromkeys(columns, 0.0)
    slices = np.array_split(np.arange(len(docs)), args.rounds)
    for r, part in enumerate(slices):
        texts = [docs[i] for i in part]
        for key in rotated(list(columns), r * max(1, len(columns) // args.rounds)):
            print(f"round {r + 1}/{args.rounds}: {key}", flush=True)
            start = time.perf_counter()
            columns[key](texts)
            seconds[key] += time.perf_counter() - start
    docs_s = {k: len(docs) / s for k, s in seconds.items()}
    vs_st = {
        runtime: {str(b): docs_s[f"{runtime}@{b}"] / docs_s["st"] for b in budgets}
        for runtime in runtimes
    }
    return {
        **encoder_run_header(args, data),
        "documents": len(docs),
        "budgets": budgets,
        "default_budget": DEFAULT_BATCH_TOKENS,
        "runtimes": runtimes,
        "docs_s": docs_s,
        "vs_st": vs_st,
        "best_budget": {rt: int(max(row, key=row.get)) for rt, row in vs_st.items()},
        "versions": encoder_versions(),
    }


def write_results(result: dict[str, Any], out: Path) -> None:
    """``out``.json (everything), ``out``.md (the table) and ``out``.png (the same, drawn)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    budgets = result["budgets"]
    rows = []
    for runtime, label in result["runtimes"].items():
        row = result["vs_st"][runtime]
        best = result["best_budget"][runtime]
        rows.append(
            [label]
            + [f"**{row[str(b)]:.2f}×**" if b == best else f"{row[str(b)]:.2f}×" for b in budgets]
        )
    lines = [
        "# Document speed by token budget per batch, every runtime, one run",
        "",
        "Command (from the repository root):",
        "",
        "```",
        result["command"],
        "```",
        "",
        f"Machine: {result['machine']}; every column uses {result['threads']} threads. "
        f"{result['documents']} {result['data']} abstracts spread over the corpus (max 256 "
        f"tokens), cut into {result['rounds']} slices; round r runs slice r through every "
        "column in a rotated order. A column is one runtime at one budget: texts sorted "
        "longest first, a batch closed when rows × longest would pass the budget. Cells: "
        "documents/s as a multiple of sentence-transformers `encode` (its own batches of 32, "
        f"{result['docs_s']['st']:.1f} documents/s here); bold is each runtime's fastest "
        f"budget. The library default (`DEFAULT_BATCH_TOKENS`) when this ran: "
        f"{result['default_budget']}.",
        "",
        markdown_table(
            ["runtime"] + [f"{b:,} tokens" for b in budgets],
            rows,
        ),
        "",
        f"![documents/s × sentence-transformers by budget]({out.with_suffix('.png').name})",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines))
    _plot(result, out.with_suffix(".png"))
    print("\n".join(lines))


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = result["budgets"]
    fig, ax = plt.subplots(figsize=(9, 4.2))
    for runtime, label in result["runtimes"].items():
        ax.plot(budgets, [result["vs_st"][runtime][str(b)] for b in budgets], "o-", label=label)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set_xticks(budgets, [f"{b:,}" for b in budgets])
    ax.set_xlabel("padded tokens per batch (max_batch_tokens)")
    ax.set_ylabel("documents/s × sentence-transformers")
    ax.set_title(f"{result['model']}, {result['machine']}", fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
