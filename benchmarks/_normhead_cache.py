"""Encode scifact (corpus + all queries) and cranfield once with one model (raw pooled vectors).

Writes <cache>/<name>-<part>.npz with ids and raw float32 vectors; skips sets already cached.
``benchmarks/studies/norm_options.py`` reads these caches. Run it under the CPU lock:

    flock .cache/cpu.lock nice -n 5 python benchmarks/_normhead_cache.py \
        .cache/normhead128 --max-doc-length 128
    # a fine-tuned cosine run of benchmarks/quality.py, for "fine-tuned cosine + corpus prior":
    flock .cache/cpu.lock nice -n 5 python benchmarks/_normhead_cache.py \
        .cache/normhead128/cosine-s42 --model .cache/quality/runs/cosine-s42
"""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def cache_embeddings(
    cache: Path,
    model: str = "all-MiniLM-L6-v2",
    data: Path = DATA,
    names: tuple[str, ...] = ("scifact", "cranfield"),
    max_doc_length: int | None = None,
) -> None:
    import torch

    from magretrieve.data.readers import load_corpus, load_queries
    from magretrieve.train.encoder import Encoder

    torch.set_num_threads(2)
    cache.mkdir(parents=True, exist_ok=True)
    encoder = None
    for name in names:
        for part in ("corpus", "queries"):
            out = cache / f"{name}-{part}.npz"
            if out.is_file():
                continue
            if encoder is None:
                kwargs = {"max_document_length": max_doc_length} if max_doc_length else {}
                encoder = Encoder.load(model, "cosine", device="cpu", **kwargs)
            if part == "corpus":
                corpus = load_corpus(data / name / "corpus.jsonl", allow_empty=True)
                ids = list(corpus)
                texts = [corpus[i].full_text for i in ids]
                side = "document"
            else:
                queries = load_queries(data / name / "queries.jsonl")
                ids = list(queries)
                texts = [queries[i] for i in ids]
                side = "query"
            raw = encoder.embed(texts, side, batch_size=64, progress=f"{name} {part}")
            np.savez(out, ids=np.array(ids), raw=raw)
            print(f"wrote {out} {raw.shape}", flush=True)


@click.command()
@click.argument("cache", type=click.Path(file_okay=False, path_type=Path))
@click.argument("names", nargs=-1)
@click.option("--model", default="all-MiniLM-L6-v2", show_default=True)
@click.option("--data", type=click.Path(file_okay=False, path_type=Path), default=DATA)
@click.option("--max-doc-length", type=int, default=None, help="Cut documents (tokens).")
def main(cache: Path, names: tuple[str, ...], model: str, data: Path, max_doc_length) -> None:
    cache_embeddings(cache, model, data, names or ("scifact", "cranfield"), max_doc_length)


if __name__ == "__main__":
    main()
