"""Where document-encoding time goes, and the most any runtime on this machine can give.

encode_speed.py measures the speed-goal ratios; this benchmark explains them. On one
sample of scifact abstracts, cut into length-sorted batches by the library's default token budget
(``DEFAULT_BATCH_TOKENS``, what ``encode_documents`` and ``index`` run; every ONNX column runs the
very same batches; sentence-transformers sorts the same texts into its own batches of 32):

* **Timed columns**, interleaved over rounds in rotated order: sentence-transformers ``encode``
  (the peer), the fp32 export on onnxruntime, the int8 export on onnxruntime, and the *same*
  fp32 graph on OpenVINO (a second ONNX runtime, fp32 precision forced; it reads onnxruntime's
  fused operators). Result: each column's speed as a multiple of sentence-transformers.
* **Operator breakdown** (one profiled pass per column, outside the timing): onnxruntime's
  profiler by operator type, torch's profiler by aten operator for sentence-transformers.
* **Matrix-product roof**: GFLOP/s of fp32 GEMM on the encoder's own linear shapes in MLAS
  (onnxruntime), torch and numpy, and the rate onnxruntime's MatMul nodes reached in the graph.
* **Bounds**: the speed-up over sentence-transformers a column could reach if every operator
  other than its matrix products took no time at all. Where a bound falls short of a goal, no
  tuning of the rest can meet that goal with those matrix products.

    python benchmarks/encode_breakdown.py
"""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
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

COLUMNS = {
    "st": "sentence-transformers encode (peer, fp32, torch)",
    "ort_fp32": "ONNX fp32, onnxruntime",
    "ort_int8": "ONNX int8, onnxruntime (shipped: attention fp32)",
    "ov_fp32": "ONNX fp32, OpenVINO (same fused graph, f32 forced)",
    "ov_bf16": "ONNX graph in bf16, OpenVINO (not a goal column: other precision)",
}
#: The ONNX columns: the runtime each runs on (:data:`magretrieve.serving.onnx_encoder.RUNTIMES`).
ONNX_RUNTIMES = {
    "ort_fp32": "onnxruntime",
    "ort_int8": "onnxruntime",
    "ov_fp32": "openvino",
    "ov_bf16": "openvino-bf16",
}
#: Document speed goals (speed-up over sentence-transformers).
GOALS = {"fp32": 1.5, "int8": 2.5}
#: sentence-transformers' own batch size (the peer's default).
BATCH = 32
#: Most texts per ONNX batch: high enough that the token budget alone closes every batch.
MAX_ROWS = 512


# --------------------------------------------------------------------------- arithmetic


def linear_flops_per_token(hidden: int, intermediate: int, layers: int) -> dict[str, int]:
    """FLOPs (2 per multiply-add) of one token through the encoder's weight matrices.

    ``qkv`` is the fused query/key/value projection (inside onnxruntime's ``Attention`` node);
    ``other`` is the attention output projection and the two feed-forward matrices (the plain
    ``MatMul`` nodes of the fused graph).
    """
    qkv = 2 * hidden * 3 * hidden
    other = 2 * (hidden * hidden + hidden * intermediate + intermediate * hidden)
    return {"qkv": qkv * layers, "other": other * layers}


def attention_flops(batch_shapes: Sequence[tuple[int, int]], hidden: int, layers: int) -> int:
    """FLOPs of the attention products (QKᵀ and attention·V) over padded batches (rows, length)."""
    return sum(2 * 2 * rows * length * length * hidden for rows, length in batch_shapes) * layers


def aggregate_ort_profile(events: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Seconds per operator type from an onnxruntime profile (its ``*_kernel_time`` events)."""
    total: Counter[str] = Counter()
    for event in events:
        if event.get("cat") == "Node" and str(event.get("name", "")).endswith("_kernel_time"):
            total[event["args"]["op_name"]] += event["dur"] / 1e6  # microseconds
    return dict(total.most_common())


def torch_groups(self_seconds: dict[str, float]) -> dict[str, float]:
    """Group torch's per-aten self times as the ONNX graph groups them."""
    groups: Counter[str] = Counter()
    for name, seconds in self_seconds.items():
        if name in {"aten::addmm", "aten::mm", "aten::bmm", "aten::matmul", "aten::linear"}:
            groups["matrix products (linear layers)"] += seconds
        elif "scaled_dot_product" in name or "attention" in name:
            groups["attention (SDPA)"] += seconds
        else:
            groups["everything else"] += seconds
    return dict(groups)


def speedup_bound(peer_seconds: float, floor_seconds: float) -> float:
    """The most a column can beat the peer by when only ``floor_seconds`` of work remains."""
    return peer_seconds / floor_seconds


# --------------------------------------------------------------------------- measurement


def gemm_rates(shapes: Sequence[tuple[int, int, int]], threads: int, repeats: int = 10) -> dict:
    """fp32 GEMM GFLOP/s of MLAS (a one-node onnxruntime graph), torch and numpy on ``shapes``.

    Each library multiplies the same (M, K) × (K, N) operands ``repeats`` times per shape after
    two warm-up products; the rate is all FLOPs over all time (numpy's BLAS threads follow the
    environment's OMP/OPENBLAS settings).
    """
    import onnxruntime as ort
    import torch
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    seconds: Counter[str] = Counter()
    flops = 0
    for m, k, n in shapes:
        a = rng.standard_normal((m, k), dtype=np.float32)
        b = rng.standard_normal((k, n), dtype=np.float32)
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            "gemm",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
            [numpy_helper.from_array(b, "w")],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        calls: dict[str, Callable[[], Any]] = {
            "onnxruntime (MLAS)": lambda s=session, x=a: s.run(None, {"x": x}),
            "torch": lambda x=ta, w=tb: x @ w,
            "numpy": lambda x=a, w=b: x @ w,
        }
        for name, call in calls.items():
            for _ in range(2):
                call()
            start = time.perf_counter()
            for _ in range(repeats):
                call()
            seconds[name] += time.perf_counter() - start
        flops += 2 * m * k * n * repeats
    return {name: flops / s / 1e9 for name, s in seconds.items()}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two equally shaped matrices."""
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@click.command(help=__doc__.splitlines()[0])
@encoder_benchmark_options("encode_breakdown")
@click.option("--docs", type=int, default=512, help="documents, spread over the corpus")
@click.option("--rounds", type=int, default=3)
@click.option(
    "--max-batch-tokens",
    type=int,
    default=None,
    help="padded tokens per ONNX batch (default: the library's DEFAULT_BATCH_TOKENS)",
)
def main(**options: Any) -> dict[str, Any]:
    return run_and_write(SimpleNamespace(**options), "encode_breakdown", run, write_results)


def run(args: Any, data: Path) -> dict[str, Any]:
    import onnxruntime as ort
    import torch
    from sentence_transformers import SentenceTransformer
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoConfig

    from magretrieve.core.batching import DEFAULT_BATCH_TOKENS, token_budget_batches
    from magretrieve.core.model_paths import resolve_model_path
    from magretrieve.data.readers import load_beir
    from magretrieve.export import export_model
    from magretrieve.serving import openvino_session
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    torch.set_num_threads(args.threads)
    dataset = load_beir(f"{data}:{args.split}")
    docs = spread_sample(dataset.corpus, args.docs)
    work = Path(tempfile.mkdtemp(prefix="encode_breakdown-", dir=cache_dir("encode_breakdown")))
    fp32_dir = export_model(args.model, work / "fp32", mode=args.mode)
    int8_dir = export_model(args.model, work / "int8", mode=args.mode, quantize="int8")
    model_path = resolve_model_path(args.model)
    config = AutoConfig.from_pretrained(str(model_path))
    hidden, layers = config.hidden_size, config.num_hidden_layers
    intermediate = config.intermediate_size

    encoder = OnnxEncoder.load(fp32_dir, threads=args.threads)
    encodings = encoder.tokenize(docs, "document")
    # longest first, closed at the token budget, as encode_documents batches
    budget = args.max_batch_tokens or DEFAULT_BATCH_TOKENS
    batches = token_budget_batches(
        [len(e.ids) for e in encodings], max_tokens=budget, max_rows=MAX_ROWS
    )
    feeds = [encoder.feed([encodings[i] for i in b], "document") for b in batches]
    shapes = [tuple(f["input_ids"].shape) for f in feeds]
    tokens = sum(rows * length for rows, length in shapes)
    texts_sorted = [docs[i] for b in batches for i in b]

    def profiled_session(folder: Path) -> Any:
        """OnnxEncoder's onnxruntime options, plus onnxruntime's per-operator profiler."""
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.enable_profiling = True
        options.profile_file_prefix = str(work / f"profile-{folder.name}")
        return ort.InferenceSession(
            str(folder / "document.onnx"), options, providers=["CPUExecutionProvider"]
        )

    bf16_native = openvino_session.bf16_native()
    columns = {k: v for k, v in COLUMNS.items() if bf16_native or k != "ov_bf16"}
    # The sessions the product runs (OnnxEncoder's options for each runtime), fed directly so
    # that every ONNX column sees the very same batches.
    sessions = {
        key: OnnxEncoder.load(
            int8_dir if key == "ort_int8" else fp32_dir, threads=args.threads, runtime=runtime
        ).session("document")
        for key, runtime in ONNX_RUNTIMES.items()
        if key in columns
    }
    st = SentenceTransformer(str(model_path), device="cpu")
    passes: dict[str, Callable[[], list[np.ndarray]]] = {
        "st": lambda: [st.encode(texts_sorted, batch_size=BATCH, convert_to_numpy=True)],
    }
    for key, session in sessions.items():
        passes[key] = lambda s=session: [s.run(None, f)[0] for f in feeds]
    # warm-up (sessions, allocators, first-call paths) on the shortest and the longest batch
    st.encode(texts_sorted[:BATCH] + texts_sorted[-BATCH:], batch_size=BATCH)
    for f in (feeds[0], feeds[-1]):
        for session in sessions.values():
            session.run(None, f)
    seconds: dict[str, list[float]] = {k: [] for k in columns}
    outputs: dict[str, np.ndarray] = {}
    for r in range(args.rounds):
        for key in rotated(list(columns), r):
            print(f"round {r + 1}/{args.rounds}: {columns[key]}", flush=True)
            start = time.perf_counter()
            got = passes[key]()
            seconds[key].append(time.perf_counter() - start)
            outputs[key] = np.concatenate(got)
    mean = {k: float(np.mean(v)) for k, v in seconds.items()}
    # Same graph, two runtimes: OpenVINO must compute what onnxruntime computes.
    ov_gap = float(np.abs(outputs["ov_fp32"] - outputs["ort_fp32"]).max())
    bf16_cosine = (
        float(np.mean(cosines(outputs["ov_bf16"], outputs["ort_fp32"])))
        if "ov_bf16" in outputs
        else None
    )

    print("profiling one pass per column", flush=True)
    ops: dict[str, dict[str, float]] = {}
    for key, folder in (("ort_fp32", fp32_dir), ("ort_int8", int8_dir)):
        session = profiled_session(folder)
        for f in feeds:
            session.run(None, f)
        profile_file = Path(session.end_profiling())
        ops[key] = aggregate_ort_profile(json.loads(profile_file.read_text()))
        profile_file.unlink()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        passes["st"]()
    aten = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    ops["st"] = torch_groups(aten)

    print("GEMM rates", flush=True)
    rows = max(n * length for n, length in shapes)  # the biggest batch's token rows
    gemm_shapes = [
        (rows, hidden, 3 * hidden),
        (rows, hidden, hidden),
        (rows, hidden, intermediate),
        (rows, intermediate, hidden),
    ]
    rates = gemm_rates(gemm_shapes, args.threads)
    per_token = linear_flops_per_token(hidden, intermediate, layers)
    flops = {
        "qkv": per_token["qkv"] * tokens,
        "other_linear": per_token["other"] * tokens,
        "attention_products": attention_flops(shapes, hidden, layers),
    }
    all_products = sum(flops.values())
    ort_matmul_rate = flops["other_linear"] / ops["ort_fp32"]["MatMul"] / 1e9
    best_rate = max(rates.values())
    st_seconds = mean["st"]
    bounds = {
        "fp32_at_best_gemm": speedup_bound(st_seconds, all_products / best_rate / 1e9),
        "fp32_at_onnxruntime_graph_rate": speedup_bound(
            st_seconds, all_products / ort_matmul_rate / 1e9
        ),
        "int8_attention_fp32": speedup_bound(
            st_seconds,
            ops["ort_int8"].get("Attention", 0.0)
            + ops["ort_int8"].get("DynamicQuantizeMatMul", 0.0)
            + ops["ort_int8"].get("MatMulIntegerToFloat", 0.0),
        ),
    }
    return {
        **encoder_run_header(args, data),
        "documents": len(docs),
        "batches": len(shapes),
        "tokens_padded": tokens,
        "max_batch_tokens": budget,
        "versions": encoder_versions(),
        "seconds_per_pass": mean,
        "per_round_seconds": seconds,
        "vs_st": {k: st_seconds / v for k, v in mean.items()},
        "openvino_vs_onnxruntime_max_abs_diff": ov_gap,
        "columns": columns,
        "openvino_bf16_native": bf16_native,
        "bf16_mean_cosine_to_fp32": bf16_cosine,
        "operators_seconds": ops,
        "flops": flops,
        "gemm_shapes": gemm_shapes,
        "gemm_gflops": rates,
        "onnxruntime_graph_matmul_gflops": ort_matmul_rate,
        "bounds_vs_st": bounds,
        "goals": GOALS,
    }


# --------------------------------------------------------------------------- report


def _share_rows(ops: dict[str, float], limit: int = 6) -> list[list[str]]:
    total = sum(ops.values())
    top = list(ops.items())[:limit]
    rest = total - sum(s for _, s in top)
    rows = [[name, f"{s:.2f}", f"{100 * s / total:.0f} %"] for name, s in top]
    if rest > 0.005 * total:
        rows.append(["(other operators)", f"{rest:.2f}", f"{100 * rest / total:.0f} %"])
    return rows


def write_results(result: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    vs = result["vs_st"]
    ops = result["operators_seconds"]
    b = result["bounds_vs_st"]
    rates = result["gemm_gflops"]
    lines = [
        "# Encode breakdown: where document time goes, and what any runtime here can give",
        "",
        "Command (from the repository root):",
        "",
        "```",
        result["command"],
        "```",
        "",
        f"Machine: {result['machine']}; every column and GEMM uses {result['threads']} threads. "
        f"{result['documents']} {result['data']} abstracts spread over the corpus, in "
        f"{result['batches']} length-sorted batches of at most {result['max_batch_tokens']:,} "
        f"padded tokens ({result['tokens_padded']:,} in all; the library's default budget) run "
        f"by every ONNX column (sentence-transformers sorts the same texts into its own batches "
        f"of {BATCH}); "
        f"{result['rounds']} rounds, columns rotated. "
        "Versions: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items()) + ".",
        "",
        "## Speed, side by side",
        "",
        markdown_table(
            ["column", "× sentence-transformers", "seconds per pass"],
            [
                [label, f"{vs[k]:.2f}×", f"{result['seconds_per_pass'][k]:.2f}"]
                for k, label in result["columns"].items()
            ],
        ),
        "",
        "OpenVINO ran the fp32 export's own fused graph; its vectors differ from onnxruntime's "
        f"by at most {result['openvino_vs_onnxruntime_max_abs_diff']:.1e}. "
        + (
            "The bf16 column runs the same graph with OpenVINO's bf16 inference precision (native "
            "on this CPU); its vectors keep a mean cosine of "
            f"{result['bf16_mean_cosine_to_fp32']:.5f} to fp32. It answers no goal (the goals "
            "name fp32 and int8) and is shown for what it shows."
            if result["openvino_bf16_native"]
            else "This CPU has no native bf16, so there is no bf16 column."
        ),
        "",
        "## Where the time goes (one profiled pass each)",
        "",
    ]
    for key, label in (
        ("st", COLUMNS["st"]),
        ("ort_fp32", COLUMNS["ort_fp32"]),
        ("ort_int8", COLUMNS["ort_int8"]),
    ):
        lines += [
            f"**{label}**",
            "",
            markdown_table(["operator", "s", "share"], _share_rows(ops[key])),
            "",
        ]
    lines += [
        "In the fused graphs `Attention` holds the query/key/value projection (a third of the "
        "layer's weight FLOPs besides the feed-forward) as well as softmax(QKᵀ)V; `MatMul` / "
        "`DynamicQuantizeMatMul` are the output projection and the feed-forward layers.",
        "",
        "## Matrix-product roof",
        "",
        markdown_table(
            ["fp32 GEMM on the encoder's shapes", "GFLOP/s"],
            [[k, f"{v:.0f}"] for k, v in rates.items()]
            + [
                [
                    "onnxruntime's MatMul nodes inside the fp32 graph",
                    f"{result['onnxruntime_graph_matmul_gflops']:.0f}",
                ]
            ],
        ),
        "",
        "## Bounds against the goals",
        "",
        markdown_table(
            ["if only these took time", "most × sentence-transformers", "goal", "reachable"],
            [
                [
                    "fp32: every matrix product (weights, QKᵀ, attention·V) at the fastest "
                    "standalone GEMM above (a library on the encoder's shapes); softmax, "
                    "LayerNorm, GELU, embedding free",
                    f"{b['fp32_at_best_gemm']:.2f}×",
                    f"{GOALS['fp32']}×",
                    _yes(b["fp32_at_best_gemm"] >= GOALS["fp32"]),
                ],
                [
                    "fp32: the same at the rate onnxruntime's MatMul nodes reach in the graph",
                    f"{b['fp32_at_onnxruntime_graph_rate']:.2f}×",
                    f"{GOALS['fp32']}×",
                    _yes(b["fp32_at_onnxruntime_graph_rate"] >= GOALS["fp32"]),
                ],
                [
                    "int8 (shipped): the fp32 Attention nodes and the int8 matrix products as "
                    "measured; LayerNorm, GELU, embedding free",
                    f"{b['int8_attention_fp32']:.2f}×",
                    f"{GOALS['int8']}×",
                    _yes(b["int8_attention_fp32"] >= GOALS["int8"]),
                ],
            ],
        ),
        "",
        "A bound is a ceiling, not a forecast: it charges nothing for the operators it names "
        "free. Where it sits near a goal, meeting the goal would need those operators to cost "
        "almost nothing.",
        "",
        fp32_headroom(result),
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines))


def fp32_headroom(result: dict[str, Any]) -> str:
    """What the fp32 goal leaves for everything but matrix products, against what onnxruntime's
    other operators took: the bound's margin in seconds instead of a ratio."""
    st = result["seconds_per_pass"]["st"]
    b = result["bounds_vs_st"]
    floor = st / max(b["fp32_at_best_gemm"], b["fp32_at_onnxruntime_graph_rate"])
    goal = st / GOALS["fp32"]
    ops = result["operators_seconds"]["ort_fp32"]
    others = sum(v for k, v in ops.items() if k not in ("MatMul", "Attention"))
    return (
        f"**fp32 headroom.** At {GOALS['fp32']}× a pass may take {goal:.2f} s. Every matrix "
        f"product at the fastest rate measured here takes {floor:.2f} s, which leaves "
        f"{max(goal - floor, 0.0):.2f} s for softmax, LayerNorm, GELU and the embedding. "
        f"onnxruntime's LayerNorm, GELU and embedding operators alone took {others:.2f} s in "
        "the profiled pass, before the softmax inside `Attention`."
    )


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


if __name__ == "__main__":
    main()
