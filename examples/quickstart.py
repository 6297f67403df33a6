"""The whole magretrieve path in one script, step by step.

1. ask diagnose which mode this encoder should be trained in (no probes: instant)
2. zero-shot baseline: export all-MiniLM-L6-v2 as it is and score scifact test
3. fine-tune briefly on scifact train in the recommended mode
4. export the query and document graphs (ONNX, int8 by default for a 2-core machine)
5. index the scifact corpus into an embedded vector store (no server)
6. search, showing how each score splits into ‖q‖ · ‖d‖ · cos θ
7. NDCG@10 of the fine-tuned model *through the store* vs the zero-shot baseline

    python examples/quickstart.py --data ../shared/data --work quickstart-out

Defaults keep it within about 10 minutes on 2 CPU cores: documents are cut at 128 tokens
for both models (so the comparison is fair), training runs 30 steps, the graphs are int8.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path


def step(n: int, text: str) -> float:
    print(f"\n=== {n}. {text}", flush=True)
    return time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", default="../shared/data", help="folder holding scifact/ (BEIR layout)"
    )
    parser.add_argument(
        "--model", default="all-MiniLM-L6-v2", help="encoder folder (default: the packaged MiniLM)"
    )
    parser.add_argument(
        "--work", default="quickstart-out", help="where runs, exports and the index go"
    )
    parser.add_argument("--steps", type=int, default=30, help="fine-tuning steps (batch 32)")
    parser.add_argument("--max-doc-length", type=int, default=128)
    parser.add_argument(
        "--store", default="qdrant-edge", choices=["qdrant-edge", "faiss", "qdrant-local"]
    )
    parser.add_argument("--fp32", action="store_true", help="export fp32 graphs instead of int8")
    parser.add_argument("--mode", default=None, help="override the recommended mode")
    args = parser.parse_args()

    import torch

    from magretrieve import Retriever, load_beir, load_training_data
    from magretrieve.diagnose.report import recommend
    from magretrieve.encoder import Encoder
    from magretrieve.evaluate import evaluate_retrieval
    from magretrieve.export import export_model
    from magretrieve.metrics import retrieval_metrics
    from magretrieve.runtime import OnnxEncoder
    from magretrieve.trainer import TrainConfig, train

    torch.set_num_threads(2)
    started = time.perf_counter()
    work = Path(args.work)
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    data = Path(args.data) / "scifact"
    test = load_beir(f"{data}:test")
    pairs = load_training_data(f"{data}:train")
    quantize = None if args.fp32 else "int8"

    t = step(1, "which mode? (magretrieve diagnose's rule, without probes)")
    base = Encoder.load(args.model, "cosine", max_document_length=args.max_doc_length)
    advice = recommend({"removed_normalize": bool(base.config.extra.get("removed_normalize"))})
    mode = args.mode or advice.mode
    print(f"recommended: {advice.mode}" + (f"; using {mode}" if mode != advice.mode else ""))
    for reason in advice.reasons + advice.warnings:
        print(f"  - {reason}")

    t = step(2, "zero-shot baseline (cosine, the encoder as shipped)")
    zs_dir = export_model(base, work / "exported-zero-shot", quantize=quantize, echo=print)
    zero_shot = evaluate_retrieval(OnnxEncoder.load(zs_dir, threads=2), test)
    print(
        f"zero-shot NDCG@10 on scifact test: {zero_shot.ndcg_at_10:.4f}  ({time.perf_counter() - t:.0f}s)"
    )

    t = step(
        3, f"fine-tune {args.steps} steps in mode {mode} on scifact train ({len(pairs)} pairs)"
    )
    encoder = Encoder.load(args.model, mode, max_document_length=args.max_doc_length)
    result = train(
        encoder,
        pairs,
        TrainConfig(epochs=100, batch_size=32, max_steps=args.steps),
        out_dir=work / "run",
    )
    print(
        f"trained {result.log['total_steps']} steps in {result.log['seconds']:.0f}s, "
        f"final loss {result.log['steps'][-1]['loss']:.3f}"
    )

    t = step(4, "export query.onnx and document.onnx (parity-checked against PyTorch)")
    export_dir = export_model(encoder, work / "exported", quantize=quantize, echo=print)
    print(f"exported to {export_dir}  ({time.perf_counter() - t:.0f}s)")

    t = step(5, f"index {len(test.corpus)} scifact documents into an embedded {args.store} store")
    spec = {
        "qdrant-edge": f"qdrant-edge:{work / 'index'}",
        "faiss": f"faiss:{work / 'index'}",
        "qdrant-local": f"qdrant-local:{work / 'index'}/scifact",
    }[args.store]
    retriever = Retriever.load(export_dir, store=spec, threads=2)
    retriever.add_documents(test.corpus.values())
    retriever.persist()
    print(f"{retriever.store.count()} documents stored  ({time.perf_counter() - t:.0f}s)")

    step(6, "search, with each score split into ‖q‖ · ‖d‖ · cos θ")
    for query in ["statins reduce mortality", "vitamin D deficiency and bone fractures"]:
        print(f"\nquery: {query}")
        print(f"  {'score':>7} {'‖q‖':>6} {'‖d‖':>6} {'cos':>6}  title")
        for hit in retriever.search(query, k=3):
            print(
                f"  {hit.score:7.3f} {hit.query_norm:6.3f} {hit.doc_norm:6.3f} {hit.cosine:6.3f}  {hit.title[:60]}"
            )

    step(7, "NDCG@10 on scifact test: fine-tuned (searched through the store) vs zero-shot")
    qids = list(test.queries)
    hits = retriever.search_batch([test.queries[q] for q in qids], k=100)
    run = {q: {h.id: float(h.score) for h in hs} for q, hs in zip(qids, hits, strict=True)}
    tuned = retrieval_metrics(test.qrels, run)["ndcg@10"]
    retriever.close()
    print(f"\n  {'model':<34} NDCG@10")
    tuned_label = f"fine-tuned {mode}, {result.log['total_steps']} steps"
    print(f"  {'zero-shot cosine':<34} {zero_shot.ndcg_at_10:.4f}")
    print(f"  {tuned_label:<34} {tuned:.4f}  ({100 * (tuned / zero_shot.ndcg_at_10 - 1):+.1f}%)")
    print(
        f"\n(documents cut at {args.max_doc_length} tokens for both; graphs {quantize or 'fp32'}; "
        f"total {time.perf_counter() - started:.0f}s)"
    )


if __name__ == "__main__":
    main()
