"""Encode speed of all-MiniLM-L6-v2: PyTorch eager vs ONNX fp32 vs ONNX int8, in one run.

Measures query latency (batch 1, one thread, p50/p95), document throughput (batch 32, two
threads), peak RSS of a serving process vs a torch process, and NDCG@10 of fp32 vs int8 on
scifact test (exact search). Writes a markdown table to benchmarks/results/encode_speed.md.

    nice -n 10 python benchmarks/encode_speed.py [--data ../shared/data/scifact] [--queries 200]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RSS_CHILD = """
import json, sys
kind, folder, texts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if kind == "torch":
    import torch
    torch.set_num_threads(1)
    from magretrieve.encoder import Encoder
    enc = Encoder.load(folder, mode="qnorm", device="cpu")
    enc.encode_queries(texts, batch_size=1)
else:
    sys.modules["torch"] = None
    from magretrieve.runtime import OnnxEncoder
    enc = OnnxEncoder.load(folder, threads=1)
    enc.encode_queries(texts, batch_size=1)
# VmHWM, not ru_maxrss: ru_maxrss survives exec and would report the forking parent's peak.
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(int(hwm.split()[1]) / 1024)
"""


def _latency(encode, queries: list[str], warmup: int = 5) -> tuple[float, float]:
    for q in queries[:warmup]:
        encode([q])
    times = []
    for q in queries:
        start = time.perf_counter()
        encode([q])
        times.append((time.perf_counter() - start) * 1000)
    return float(np.percentile(times, 50)), float(np.percentile(times, 95))


def _throughput(encode, docs: list[str]) -> float:
    encode(docs[:32])
    start = time.perf_counter()
    encode(docs)
    return len(docs) / (time.perf_counter() - start)


def _rss(kind: str, folder: str, texts: list[str]) -> float:
    out = subprocess.run(
        [sys.executable, "-c", RSS_CHILD, kind, folder, json.dumps(texts)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "scifact"))
    parser.add_argument("--queries", type=int, default=200, help="queries timed at batch 1")
    parser.add_argument("--docs", type=int, default=512, help="documents timed at batch 32")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "encode_speed.md"))
    parser.add_argument("--skip-ndcg", action="store_true")
    parser.add_argument(
        "--ndcg-corpus",
        type=int,
        default=0,
        help="NDCG on a corpus of every judged document plus the first others up to N (0: all)",
    )
    args = parser.parse_args()

    import torch

    from magretrieve.data import load_beir
    from magretrieve.encoder import Encoder
    from magretrieve.export import export_model
    from magretrieve.export.evaluate import evaluate_export
    from magretrieve.manifest import Manifest
    from magretrieve.models import resolve_model_path
    from magretrieve.runtime import OnnxEncoder

    dataset = load_beir(f"{args.data}:test")
    queries = list(dataset.queries.values())[: args.queries]
    docs = [d.full_text for d in list(dataset.corpus.values())[: args.docs]]
    work = Path(tempfile.mkdtemp(prefix="encode_speed-"))
    t0 = time.perf_counter()
    fp32_dir = export_model("all-MiniLM-L6-v2", work / "fp32", mode="qnorm")
    fp32_export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    int8_dir = export_model("all-MiniLM-L6-v2", work / "int8", mode="qnorm", quantize="int8")
    int8_export_s = time.perf_counter() - t0
    exporter = Manifest.load(fp32_dir).exporter["name"]

    rows: dict[str, dict[str, float]] = {}
    torch.set_num_threads(1)
    eager = Encoder.load("all-MiniLM-L6-v2", mode="qnorm", device="cpu")
    rows["PyTorch eager"] = {}
    rows["PyTorch eager"]["p50"], rows["PyTorch eager"]["p95"] = _latency(
        lambda t: eager.encode_queries(t, batch_size=1), queries
    )
    for name, folder in (("ONNX fp32", fp32_dir), ("ONNX int8", int8_dir)):
        enc = OnnxEncoder.load(folder, threads=1)
        rows[name] = {}
        rows[name]["p50"], rows[name]["p95"] = _latency(
            lambda t, e=enc: e.encode_queries(t, batch_size=1), queries
        )
    torch.set_num_threads(2)
    rows["PyTorch eager"]["docs_s"] = _throughput(
        lambda t: eager.encode_documents(t, batch_size=32), docs
    )
    for name, folder in (("ONNX fp32", fp32_dir), ("ONNX int8", int8_dir)):
        enc = OnnxEncoder.load(folder, threads=2)
        rows[name]["docs_s"] = _throughput(
            lambda t, e=enc: e.encode_documents(t, batch_size=32), docs
        )

    rss_texts = queries[:20]
    rows["PyTorch eager"]["rss"] = _rss(
        "torch", str(resolve_model_path("all-MiniLM-L6-v2")), rss_texts
    )
    rows["ONNX fp32"]["rss"] = _rss("onnx", str(fp32_dir), rss_texts)
    rows["ONNX int8"]["rss"] = _rss("onnx", str(int8_dir), rss_texts)
    for name, folder in (("ONNX fp32", fp32_dir), ("ONNX int8", int8_dir)):
        rows[name]["mb"] = sum(p.stat().st_size for p in folder.glob("*.onnx")) / 1e6

    ndcg_note = f"scifact test, full corpus ({len(dataset.corpus)} documents)"
    if args.ndcg_corpus and args.ndcg_corpus < len(dataset.corpus):
        judged = {d for docs_ in dataset.qrels.values() for d in docs_}
        keep = list(judged) + [d for d in dataset.corpus if d not in judged]
        dataset.corpus = {d: dataset.corpus[d] for d in keep[: max(args.ndcg_corpus, len(judged))]}
        ndcg_note = (
            f"scifact test on a {len(dataset.corpus)}-document corpus (all {len(judged)} judged + "
            "the first others): easier than the full corpus, so compare fp32 with int8, not with "
            "published figures"
        )
    if not args.skip_ndcg:
        for name, folder in (("ONNX fp32", fp32_dir), ("ONNX int8", int8_dir)):
            rows[name]["ndcg"] = evaluate_export(
                OnnxEncoder.load(folder, threads=2), dataset, label=name
            )["ndcg@10"]

    base = rows["PyTorch eager"]
    lines = [
        "# Encode speed: all-MiniLM-L6-v2, qnorm (PyTorch eager vs ONNX fp32 vs ONNX int8)",
        "",
        "Command (from the project root, one run, all columns side by side):",
        "",
        "```",
        "nice -n 10 python benchmarks/encode_speed.py " + " ".join(sys.argv[1:]),
        "```",
        "",
        f"Machine: {_cpu()} (2 cores, shared with other jobs: absolute numbers are noisy, ratios "
        f"within this run are the result). torch {torch.__version__}, onnxruntime "
        f"{_ort_version()}, exporter {exporter}. Queries: {len(queries)} scifact test claims, one "
        f"at a time on 1 thread. Documents: {len(docs)} scifact abstracts (max 256 tokens), batch "
        "32 on 2 threads. Peak RSS: a fresh process that loads the encoder and encodes 20 queries. "
        f"Export took {fp32_export_s:.0f} s (fp32) and {int8_export_s:.0f} s (int8, incl. fp32 "
        "parity).",
        "",
        "| encoder | query p50 ms | query p95 ms | speed-up p50 | docs/s (b32, 2 thr) | speed-up | "
        "peak RSS MB | graphs MB (q+d) | NDCG@10 scifact |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['p50']:.2f} | {r['p95']:.2f} | {base['p50'] / r['p50']:.2f}× | "
            f"{r['docs_s']:.1f} | {r['docs_s'] / base['docs_s']:.2f}× | {r['rss']:.0f} | "
            f"{r.get('mb', float('nan')):.1f} | "
            + (f"{r['ndcg']:.4f}" if "ndcg" in r else "–")
            + " |"
        )
    if "ndcg" in rows["ONNX int8"]:
        delta = (rows["ONNX int8"]["ndcg"] - rows["ONNX fp32"]["ndcg"]) * 100
        lines += [
            "",
            f"NDCG@10 int8 − fp32: {delta:+.2f} points (exact inner-product search; {ndcg_note}).",
        ]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _ort_version() -> str:
    import onnxruntime

    return onnxruntime.__version__


if __name__ == "__main__":
    main()
