"""Encode speed, side by side in one run: sentence-transformers, PyTorch eager, ONNX fp32/int8,
and end-to-end ``index`` into FAISS flat.

Documents: every scifact abstract (5,183), each column encoding the whole corpus its own way:
sentence-transformers ``encode`` (its own length-sorted batches of 32, fp32) as the peer,
magretrieve's PyTorch encoder, the ONNX fp32 and int8 exports (token-budget batches), and
``index_corpus`` of the fp32 export into a fresh FAISS flat store (read, tokenize, encode,
write, checkpoint); then the fp32 export on OpenVINO, in fp32 and (on CPUs with native bf16)
in bf16, through the same ``OnnxEncoder``, and the static int8 export (``--quantize
int8-static``, calibrated on another corpus: cranfield) on OpenVINO. Queries: the 300 scifact
test claims one at a time (batch 1), p50/p95.
Every column uses the same thread count. The corpus and the queries are cut into one slice
per round; round r runs slice r through every column, in a rotated order, so each column
encodes every text exactly once while noise from other jobs hits all columns alike (the
index column adds each slice to the same store, as a resumed run would). Documents/s is all
documents over the summed time; results are ratios (the machine is shared: absolute times
are noisy, ratios within one run are the result). NDCG@10 of every ONNX column comes from
the timed vectors (exact search, full corpus).

    python benchmarks/encode_speed.py --rounds 2
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
)

#: Column key → label, in the order of the first round.
COLUMNS = {
    "st": "sentence-transformers encode (peer, fp32)",
    "eager": "PyTorch eager (magretrieve)",
    "fp32": "ONNX fp32",
    "int8": "ONNX int8",
    "index": "end-to-end `index` → FAISS flat (ONNX fp32)",
    "ov_fp32": "ONNX fp32 on OpenVINO (runtime `openvino`)",
    "ov_bf16": "ONNX graph in bf16 on OpenVINO (runtime `openvino-bf16`; no goal names bf16)",
    "ov_int8": "static int8 on OpenVINO (`--quantize int8-static`, NNCF)",
}
QUERY_COLUMNS = ("st", "eager", "fp32", "int8", "ov_fp32", "ov_bf16", "ov_int8")
#: Columns run by an OnnxEncoder, and its runtime.
ONNX_RUNTIMES = {
    "fp32": "onnxruntime",
    "int8": "onnxruntime",
    "ov_fp32": "openvino",
    "ov_bf16": "openvino-bf16",
    "ov_int8": "openvino",
}
#: Speed goals: (what, column, baseline, metric, at least).
GOALS = (
    ("documents: ONNX fp32 vs sentence-transformers", "fp32", "st", "docs_s", 1.5),
    ("documents: ONNX int8 vs sentence-transformers", "int8", "st", "docs_s", 2.5),
    ("query p50: ONNX fp32 vs PyTorch eager", "fp32", "eager", "p50", 2.5),
    ("query p50: ONNX int8 vs PyTorch eager", "int8", "eager", "p50", 4.0),
    ("end-to-end index vs ONNX fp32 encoding", "index", "fp32", "docs_s", 0.9),
    ("documents: ONNX fp32 on OpenVINO vs sentence-transformers", "ov_fp32", "st", "docs_s", 1.5),
    ("query p50: ONNX fp32 on OpenVINO vs PyTorch eager", "ov_fp32", "eager", "p50", 2.5),
    ("documents: static int8 on OpenVINO vs sentence-transformers", "ov_int8", "st", "docs_s", 2.5),
    ("query p50: static int8 on OpenVINO vs PyTorch eager", "ov_int8", "eager", "p50", 4.0),
)
#: NDCG@10 loss goals: (what, int8 column).
LOSS_GOALS = (
    ("int8 NDCG@10 loss vs fp32 (points)", "int8"),
    ("static int8 NDCG@10 loss vs fp32 (points)", "ov_int8"),
)


def available_columns(bf16_native: bool) -> dict[str, str]:
    """:data:`COLUMNS`, without the bf16 one on a CPU that has no native bf16."""
    return {k: v for k, v in COLUMNS.items() if bf16_native or k != "ov_bf16"}


MAX_NDCG_LOSS = 0.5  # points


def latencies_ms(encode: Callable[[list[str]], Any], queries: list[str]) -> list[float]:
    """Milliseconds per query, one query per call."""
    out = []
    for q in queries:
        start = time.perf_counter()
        encode([q])
        out.append((time.perf_counter() - start) * 1000)
    return out


def write_corpus_slices(corpus: Path, slices: list[list[str]], folder: Path) -> list[Path]:
    """One corpus file per slice of document ids (the lines of ``corpus`` as they are)."""
    where = {doc_id: n for n, ids in enumerate(slices) for doc_id in ids}
    paths = [folder / f"corpus-{n}.jsonl" for n in range(len(slices))]
    handles = [p.open("w") for p in paths]
    try:
        with corpus.open() as src:
            for line in src:
                if line.strip():
                    n = where.get(json.loads(line)["_id"])
                    if n is not None:
                        handles[n].write(line)
    finally:
        for h in handles:
            h.close()
    return paths


def ratio(rows: dict[str, dict[str, float]], column: str, baseline: str, metric: str) -> float:
    """How many times faster ``column`` is than ``baseline`` (throughput up, latency down)."""
    a, b = rows[column][metric], rows[baseline][metric]
    return a / b if metric == "docs_s" else b / a


@click.command(help=__doc__.splitlines()[0])
@encoder_benchmark_options("encode_speed")
@click.option(
    "--calibration-data",
    default=None,
    help="BEIR folder calibrating the static int8 export (default: data_dir()/cranfield, "
    "another corpus than the one measured)",
)
@click.option("--rounds", type=int, default=2)
@click.option("--queries", type=int, default=300, help="queries timed (0: all)")
@click.option("--docs", type=int, default=0, help="documents encoded (0: all)")
def main(**options: Any) -> dict[str, Any]:
    return run_and_write(SimpleNamespace(**options), "encode_speed", run, write_results)


def run(args: Any, data: Path) -> dict[str, Any]:
    import torch
    from sentence_transformers import SentenceTransformer

    from magretrieve.core.manifest import Manifest
    from magretrieve.core.metrics import retrieval_metrics
    from magretrieve.core.model_paths import resolve_model_path
    from magretrieve.data.readers import load_beir
    from magretrieve.evaluation.retrieval import exact_run
    from magretrieve.export import export_model
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.onnx_encoder import OnnxEncoder
    from magretrieve.serving.retriever import Retriever
    from magretrieve.train.encoder import Encoder

    torch.set_num_threads(args.threads)
    dataset = load_beir(f"{data}:{args.split}")
    qids = list(dataset.queries)[: args.queries or None]
    queries = [dataset.queries[q] for q in qids]
    dids = list(dataset.corpus)[: args.docs or None]
    docs = [dataset.corpus[d].full_text for d in dids]
    work = Path(tempfile.mkdtemp(prefix="encode_speed-", dir=cache_dir("encode_speed")))
    # Round r encodes slice r of the documents and of the queries in every column: each
    # column sees every text exactly once, and the rounds interleave the columns in time.
    doc_slices = [list(map(int, a)) for a in np.array_split(np.arange(len(docs)), args.rounds)]
    query_slices = [list(map(int, a)) for a in np.array_split(np.arange(len(queries)), args.rounds)]
    corpus_files = write_corpus_slices(
        data / "corpus.jsonl", [[dids[i] for i in sl] for sl in doc_slices], work
    )
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    fp32_dir = export_model(args.model, work / "fp32", mode=args.mode)
    timings["export_fp32_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    int8_dir = export_model(args.model, work / "int8", mode=args.mode, quantize="int8")
    timings["export_int8_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    calibration = Path(args.calibration_data or data.parent / "cranfield")
    static_dir = export_model(
        args.model,
        work / "int8-static",
        mode=args.mode,
        quantize="int8-static",
        calibration_data=calibration,
    )
    timings["export_int8_static_s"] = time.perf_counter() - t0
    manifest = Manifest.load(fp32_dir)

    st = SentenceTransformer(str(resolve_model_path(args.model)), device="cpu")
    eager = Encoder.load(args.model, mode=args.mode, device="cpu")

    from magretrieve.serving.openvino_session import bf16_native

    columns = available_columns(bf16_native())
    query_columns = [k for k in QUERY_COLUMNS if k in columns]
    folders = {"int8": int8_dir, "ov_int8": static_dir}
    onnx = {
        key: OnnxEncoder.load(folders.get(key, fp32_dir), threads=args.threads, runtime=runtime)
        for key, runtime in ONNX_RUNTIMES.items()
        if key in columns
    }
    doc_encode: dict[str, Callable[[list[str]], Any]] = {
        "st": lambda t: st.encode(t, batch_size=32, convert_to_numpy=True),
        "eager": lambda t: eager.encode_documents(t),
    }
    query_encode: dict[str, Callable[[list[str]], Any]] = {
        "st": lambda t: st.encode(t, batch_size=1, convert_to_numpy=True),
        "eager": lambda t: eager.encode_queries(t, batch_size=1),
    }
    for key, enc in onnx.items():
        doc_encode[key] = enc.encode_documents
        query_encode[key] = lambda t, enc=enc: enc.encode_queries(t, batch_size=1)
    for key in query_columns:  # warm-up: sessions, allocators, first-call paths
        doc_encode[key](docs[:8])
        query_encode[key](queries[:5])

    seconds: dict[str, list[float]] = {k: [] for k in columns}
    docs_s: dict[str, list[float]] = {k: [] for k in columns}
    lat: dict[str, list[float]] = {k: [] for k in query_columns}
    vectors: dict[str, np.ndarray] = {
        k: np.zeros((len(docs), manifest.dimension), dtype=np.float32) for k in onnx
    }
    qvectors: dict[str, np.ndarray] = {}
    for r in range(args.rounds):
        part = doc_slices[r]
        texts = [docs[i] for i in part]
        for key in rotated(list(columns), r):
            print(f"round {r + 1}/{args.rounds}: {columns[key]}", flush=True)
            start = time.perf_counter()
            if key == "index":  # each round adds its slice to the same store (as a resume)
                with Retriever.load(
                    fp32_dir, store=f"faiss:{work / 'index'}", threads=args.threads
                ) as retriever:
                    report = index_corpus(retriever, corpus_files[r], progress=False)
                if report.added != len(part):
                    raise RuntimeError(f"index added {report.added} of {len(part)} documents")
            else:
                vecs = doc_encode[key](texts)
                if key in onnx:
                    vectors[key][part] = np.asarray(vecs)
            seconds[key].append(time.perf_counter() - start)
            docs_s[key].append(len(part) / seconds[key][-1])
            if key in lat:
                lat[key].extend(
                    latencies_ms(query_encode[key], [queries[i] for i in query_slices[r]])
                )
    for key in onnx:  # the vectors of the timed path (batch 1), for NDCG
        qvectors[key] = onnx[key].encode_queries(queries, batch_size=1)

    rows: dict[str, dict[str, float]] = {}
    for key in columns:
        rows[key] = {"docs_s": len(docs) / sum(seconds[key])}
        if key in lat:
            rows[key]["p50"] = float(np.percentile(lat[key], 50))
            rows[key]["p95"] = float(np.percentile(lat[key], 95))
    qrels = {q: dataset.qrels[q] for q in qids if q in dataset.qrels}
    for key in onnx:
        run_ = exact_run(qvectors[key], vectors[key], qids, dids)
        rows[key]["ndcg@10"] = retrieval_metrics(qrels, run_)["ndcg@10"]
    goals = []
    for what, column, baseline, metric, need in GOALS:
        got = ratio(rows, column, baseline, metric)
        goals.append({"goal": what, "ratio": got, "at_least": need, "met": got >= need})
    for what, column in LOSS_GOALS:
        loss = (rows["fp32"]["ndcg@10"] - rows[column]["ndcg@10"]) * 100
        goals.append(
            {
                "goal": what,
                "loss_points": loss,
                "at_most": MAX_NDCG_LOSS,
                "met": loss <= MAX_NDCG_LOSS,
            }
        )
    return {
        **encoder_run_header(args, data),
        "calibration_data": calibration.resolve().name,
        "documents": len(docs),
        "queries": len(queries),
        "exporter": manifest.exporter,
        "versions": encoder_versions(),
        "columns": columns,
        "timings": timings,
        "per_round_docs_s": docs_s,
        "rows": rows,
        "ratios": {
            key: {
                "docs_vs_st": ratio(rows, key, "st", "docs_s"),
                **(
                    {"p50_vs_eager": ratio(rows, key, "eager", "p50")} if "p50" in rows[key] else {}
                ),
            }
            for key in columns
        },
        "goals": goals,
        # not written to the results (a path of this machine): for tests and callers
        "_export_dirs": {"fp32": str(fp32_dir), "int8": str(int8_dir), "ov_int8": str(static_dir)},
    }


def write_results(result: dict[str, Any], out: Path) -> None:
    """``out``.json (everything) and ``out``.md (ratios, the machine, the goals)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    public = {k: v for k, v in result.items() if not k.startswith("_")}
    out.with_suffix(".json").write_text(json.dumps(public, indent=2) + "\n")
    rows, ratios = result["rows"], result["ratios"]
    table = []
    for key, label in result["columns"].items():
        r = rows[key]
        table.append(
            [
                label,
                f"{ratios[key]['docs_vs_st']:.2f}×",
                f"{ratios[key]['p50_vs_eager']:.2f}×" if "p50_vs_eager" in ratios[key] else "–",
                f"{rows['eager']['p95'] / r['p95']:.2f}×" if "p95" in r else "–",
                f"{r['ndcg@10']:.4f}" if "ndcg@10" in r else "–",
            ]
        )
    goal_rows = []
    for g in result["goals"]:
        if "ratio" in g:
            goal_rows.append(
                [g["goal"], f"≥ {g['at_least']}×", f"{g['ratio']:.2f}×", _met(g["met"])]
            )
        else:
            goal_rows.append(
                [
                    g["goal"],
                    f"≤ {g['at_most']}",
                    f"{g['loss_points']:+.2f}",
                    _met(g["met"]),
                ]
            )
    opt = result["exporter"].get("optimizer", {})
    fused = ", ".join(f"{n} {k}" for k, n in sorted(opt.get("fused_operators", {}).items()))
    lines = [
        f"# Encode speed: {result['model']} ({result['mode']}), one run, columns side by side",
        "",
        "Command (from the repository root):",
        "",
        "```",
        result["command"],
        "```",
        "",
        f"Machine: {result['machine']} (the run held the CPU lock; the ratios within this run "
        "are the result, absolute numbers are in encode_speed.json). Every column uses "
        f"{result['threads']} threads. The corpus and the queries are cut into "
        f"{result['rounds']} slices; round r runs slice r through every column in a rotated "
        "order (columns interleaved in time, every text encoded once per column); documents/s "
        "= all documents / summed time.",
        "",
        f"Documents: {result['documents']} {result['data']} corpus abstracts (max 256 tokens), "
        "the whole corpus per column. Queries: "
        f"{result['queries']} {result['data']} claims one at a time (batch 1), p50/p95 over all "
        "of them. Export: "
        f"{result['exporter'].get('name')} opset {result['exporter'].get('opset')}, "
        + (f"fused ({fused})" if opt.get("applied") else f"unfused ({opt.get('reason')})")
        + "; int8 = dynamic per-channel quantization of the fused fp32 graphs (MatMul and "
        "embedding; attention kept fp32). End-to-end: "
        "`index_corpus` (what `magretrieve index` runs) of the fp32 export into a new FAISS "
        "flat store, corpus file to persisted store. The OpenVINO columns run the same fp32 "
        "export's files through `OnnxEncoder(runtime=...)`: fp32 forced, or bf16 "
        f"({result['versions'].get('openvino', '?')}). Static int8 = `export --quantize "
        "int8-static` (NNCF post-training quantization, OpenVINO IR), calibrated on 320 "
        f"documents and queries of {result['calibration_data']} (not the measured corpus); "
        "OpenVINO runs it in fp32 precision except its int8 operators.",
        "",
        markdown_table(
            [
                "column",
                "documents: × sentence-transformers",
                "query p50: × eager",
                "query p95: × eager",
                "NDCG@10 (full corpus, exact)",
            ],
            table,
        ),
        "",
        "## Speed goals",
        "",
        markdown_table(["goal", "target", "measured", "met"], goal_rows),
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


if __name__ == "__main__":
    main()
