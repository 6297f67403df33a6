"""Encode scifact (corpus + all queries) and cranfield once with all-MiniLM-L6-v2 (raw pooled).

Writes /work/cache/normhead/<name>.npz with ids and raw float32 vectors; skips sets already cached.
Run under the CPU lock (see benchmarks/norm_options.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


def cache_embeddings(
    cache: Path, model: str = "all-MiniLM-L6-v2", data: Path = DATA, names=("scifact", "cranfield")
) -> None:
    import torch

    from magretrieve.data import load_corpus, load_queries
    from magretrieve.encoder import Encoder

    torch.set_num_threads(2)
    cache.mkdir(parents=True, exist_ok=True)
    encoder = None
    for name in names:
        for part in ("corpus", "queries"):
            out = cache / f"{name}-{part}.npz"
            if out.is_file():
                continue
            if encoder is None:
                encoder = Encoder.load(model, "cosine", device="cpu")
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


if __name__ == "__main__":
    cache_embeddings(
        Path(sys.argv[1] if len(sys.argv) > 1 else "/work/cache/normhead"),
        names=tuple(sys.argv[2:]) or ("scifact", "cranfield"),
    )
