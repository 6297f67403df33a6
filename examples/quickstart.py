"""The whole magretrieve path in one script, step by step.

1. ask diagnose which mode this encoder should be trained in (no probes: instant)
2. zero-shot baseline: export all-MiniLM-L6-v2 as it is and score scifact test
3. fine-tune briefly on scifact train in the recommended mode
4. export the query and document graphs (ONNX, int8 by default for a 2-core machine)
5. index the scifact corpus into an embedded vector store (no server)
6. add the document prior diagnose recommends for this encoder: method and parameters chosen
   on the *training* queries against the stored vectors ("no prior" is always a candidate),
   then a rescaled copy of the store (no re-encoding)
7. search, showing how each score splits into ‖q‖ · ‖d‖ · cos θ + the prior's offset
8. NDCG@10 *through the stores* (fine-tuned, fine-tuned + prior) vs the zero-shot baseline,
   then how to serve the store that scored best over HTTP, its page showing each hit's magnitude

    python examples/quickstart.py --data ../shared/data --work quickstart-out

The defaults keep it small for 2 CPU cores: documents are cut at 128 tokens for both models
(so the comparison is fair), training runs 30 steps, the graphs are int8. One run took 339 s
on 2 idle cores (docs/results.md, "The quickstart", has each step's time).
"""

from __future__ import annotations

import argparse
import importlib.util
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path


def step(n: int, text: str) -> float:
    print(f"\n=== {n}. {text}", flush=True)
    return time.perf_counter()


@dataclass(frozen=True)
class StoreResult:
    """One store the quickstart built and searched: its NDCG@10 on scifact test, and what its
    document magnitudes are (None: cosine, every document norm is 1.0)."""

    label: str
    spec: str
    ndcg: float
    magnitude: str | None


def best_store(stores: list[StoreResult]) -> StoreResult:
    """The store that scored best (on a tie, the one listed first: the simpler one)."""
    return max(stores, key=lambda s: s.ndcg)  # max keeps the first of equal values


def magretrieve_command() -> str:
    """How to run ``magretrieve`` as printed: the script beside this Python (the venv's,
    relative to the current folder when it lies inside it), else the one on PATH."""
    script = Path(sys.executable).parent / "magretrieve"
    if not script.is_file():
        return "magretrieve"
    try:
        return str(script.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(script.absolute())


def serve_hint(
    export_dir: Path | str,
    stores: list[StoreResult],
    *,
    program: str = "magretrieve",
    port: int = 8080,
    server_installed: bool = True,
) -> list[str]:
    """The closing lines: serve the best store without a key, on this machine only, so the
    search page and the API docs open as they are and show each hit's magnitude.

    Without a key a server answers every read route and keeps its write endpoints off; with
    one (``MAGRETRIEVE_API_KEY``) the page asks for it before it searches. When the best
    store is plain cosine (all norms 1.0) the store with a magnitude is offered as well.
    """
    best = best_store(stores)
    url = f"http://127.0.0.1:{port}"

    def command(store: StoreResult) -> str:
        args = [program, "serve", str(export_dir), "--store", store.spec, "--port", str(port)]
        return "  " + shlex.join(args)

    lines = [f"serve the best store, {best.label} (NDCG@10 {best.ndcg:.4f}), over HTTP:"]
    if not server_installed:
        lines.append("  pip install 'magretrieve[server]'   # the HTTP service's extra")
    lines.append(command(best))
    shown = [s for s in stores if s.magnitude is not None]
    if best.magnitude is not None:
        lines.append(
            f"then open {url}/ and search: each hit's score splits into ‖q‖ · {best.magnitude}"
            f" · cos θ (+ the prior's offset); the API docs are at {url}/docs"
        )
    else:
        lines.append(
            f"then open {url}/ (API docs at {url}/docs); its documents are cosine, every "
            "norm is 1.0"
        )
        if shown:
            other = max(shown, key=lambda s: s.ndcg)
            lines.append(
                f"to see magnitude on the page ({other.magnitude} for each hit), serve "
                f"{other.label} (NDCG@10 {other.ndcg:.4f}) instead:"
            )
            lines.append(command(other))
    lines.append(
        "(no key: it listens on 127.0.0.1 only and its write endpoints stay off; "
        "MAGRETRIEVE_API_KEY=... turns writes on, and the page then asks for that key)"
    )
    return lines


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

    from magretrieve import (
        Encoder,
        OnnxEncoder,
        Retriever,
        TrainConfig,
        choose_prior,
        evaluate_retrieval,
        export_model,
        index_corpus,
        load_beir,
        load_training_data,
        recommend,
        rescale_store,
        retrieval_metrics,
        train_model,
    )

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
    result = train_model(
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

    def store_spec(name: str) -> str:
        return {
            "qdrant-edge": f"qdrant-edge:{work / name}",
            "faiss": f"faiss:{work / name}",
            "qdrant-local": f"qdrant-local:{work / name}/scifact",
        }[args.store]

    spec = store_spec("index")
    retriever = Retriever.load(export_dir, store=spec, threads=2)
    # as `magretrieve index` does: tokenizing, encoding and writing overlap, with a progress bar
    index_corpus(retriever, data / "corpus.jsonl")
    print(f"{retriever.store.count()} documents stored  ({time.perf_counter() - t:.0f}s)")

    prior_spec = None
    if advice.magnitude == "document_prior" and mode == "cosine":
        t = step(
            6, "document prior: chosen on scifact *train* queries, stored vectors, no re-encoding"
        )
        train_set = load_beir(f"{data}:train")
        doc_ids = [str(i) for i in retriever.store.iter_ids()]
        qids_train = [q for q in train_set.queries if q in train_set.qrels]
        selection = choose_prior(
            retriever.encoder.encode_queries(
                [train_set.queries[q] for q in qids_train], progress="training queries"
            ),
            retriever.store.get_vectors(doc_ids),
            qids_train,
            doc_ids,
            train_set.qrels,
            chosen_on="scifact:train",
            progress=True,
        )
        prior = selection.prior
        print(
            f"chosen: {prior.label()} (training-query NDCG@10 {selection.training_ndcg:.4f}, "
            f"{len(selection.grid)} candidates incl. no prior)"
        )
        retriever.close()
        prior_spec = store_spec("index-prior")
        rescale_store(spec, prior_spec, prior=prior, progress=True)
        retriever = Retriever.load(export_dir, store=spec, threads=2)
        print(f"rescaled copy: {prior_spec}  ({time.perf_counter() - t:.0f}s)")
    else:
        step(6, f"document prior: skipped ({mode} is not the recommended cosine + prior)")

    step(7, "search, with each score split into ‖q‖ · ‖d‖ · cos θ + the prior's offset")
    searcher = Retriever.load(export_dir, store=prior_spec, threads=2) if prior_spec else retriever
    for query in ["statins reduce mortality", "vitamin D deficiency and bone fractures"]:
        print(f"\nquery: {query}")
        print(f"  {'score':>7} {'‖q‖':>6} {'‖d‖':>6} {'cos':>6} {'offset':>7}  title")
        for hit in searcher.search(query, k=3):
            print(
                f"  {hit.score:7.3f} {hit.query_norm:6.3f} {hit.doc_norm:6.3f} {hit.cosine:6.3f} "
                f"{hit.offset:7.3f}  {hit.title[:60]}"
            )

    step(8, "NDCG@10 on scifact test, searched through the stores, vs zero-shot")
    qids = list(test.queries)
    queries = [test.queries[q] for q in qids]

    # one export: its query vectors are encoded once and searched in every store
    query_vectors = retriever.encoder.encode_queries(queries, progress="test queries")

    def ndcg(searcher: Retriever) -> float:
        hits = searcher.search_vectors(query_vectors, k=100)
        run = {q: {h.id: float(h.score) for h in hs} for q, hs in zip(qids, hits, strict=True)}
        return retrieval_metrics(test.qrels, run)["ndcg@10"]

    tuned = f"fine-tuned {mode}, {result.log['total_steps']} steps"
    stores = [StoreResult(tuned, spec, ndcg(retriever), None if mode == "cosine" else "‖d‖")]
    if prior_spec:
        magnitude = None if prior.method == "none" else "m(d)"  # "no prior" can win
        stores.append(
            StoreResult(f"{tuned} + {prior.label()}", prior_spec, ndcg(searcher), magnitude)
        )
        searcher.close()
    retriever.close()
    rows = [("zero-shot cosine", zero_shot.ndcg_at_10), (tuned, stores[0].ndcg)]
    if prior_spec:
        rows.append((f"  + {prior.label()}", stores[1].ndcg))
    width = max(34, *(len(label) for label, _ in rows))
    print(f"\n  {'model':<{width}} NDCG@10")
    for label, value in rows:
        change = "" if label.startswith("zero") else f"  ({100 * (value / rows[0][1] - 1):+.1f}%)"
        print(f"  {label:<{width}} {value:.4f}{change}")
    print(
        f"\n(documents cut at {args.max_doc_length} tokens for both; graphs {quantize or 'fp32'}; "
        f"total {time.perf_counter() - started:.0f}s)"
    )
    print()
    hint = serve_hint(
        export_dir,
        stores,
        program=magretrieve_command(),
        server_installed=importlib.util.find_spec("fastapi") is not None,
    )
    print("\n".join(hint))


if __name__ == "__main__":
    main()
