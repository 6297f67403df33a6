"""The models and cached vectors behind benchmarks/priors.py (the heavy part, run under the lock).

Models (all from one encoder folder, trained with magretrieve's own trainer at the settings of
benchmarks/quality.py):

- ``zero-shot``: the encoder as installed, cosine;
- ``cosine-s{seed}``: fine-tuned cosine;
- ``pace-{qnorm,dot}-s{seed}``: PACE's curriculum (cosine first, then the magnitude-keeping mode
  from that cosine checkpoint at a 10x lower learning rate, one more epoch).

Each model encodes each text set once; raw pooled vectors are cached as ``.npy`` under
``cache_dir("priors")`` keyed by model and text set, with the model's similarity beside them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.data.readers import RetrievalDataset


def model_dir(work: Path, tag: str) -> Path:
    return work / "runs" / tag


def train_model(
    base: str,
    tag: str,
    work: Path,
    pairs: list,
    settings: dict[str, Any],
    seed: int,
    max_doc_length: int,
    threads: int,
) -> Path:
    """Train ``tag`` (cosine-sN or pace-MODE-sN) unless its run folder is complete."""
    import torch

    from magretrieve.train.encoder import Encoder
    from magretrieve.train.trainer import TrainConfig, train

    torch.set_num_threads(threads)
    out = model_dir(work, tag)
    if (out / "train_log.json").is_file():
        return out
    if tag.startswith("cosine-"):
        encoder = Encoder.load(base, "cosine", max_document_length=max_doc_length, device="cpu")
        config = TrainConfig(seed=seed, **settings)
    else:  # pace-MODE-sN: from the cosine checkpoint of the same seed, lr / 10
        _, mode, _ = tag.split("-")
        start = model_dir(work, f"cosine-s{seed}")
        encoder = Encoder.load(start, mode, device="cpu")
        config = TrainConfig(seed=seed, **{**settings, "lr": settings["lr"] / 10})
    train(encoder, pairs, config, out_dir=out)
    return out


def _key(texts: list[str]) -> str:
    return hashlib.sha256("\x1f".join(texts).encode()).hexdigest()[:16]


class VectorCache:
    """Raw vectors of one model, per text set, encoded once and kept on disk."""

    def __init__(self, work: Path, tag: str, model: str | Path, max_doc_length: int) -> None:
        self.folder = work / "embeddings" / tag
        self.tag = tag
        self.model = model
        self.max_doc_length = max_doc_length
        self._encoder: Any = None

    def encoder(self) -> Any:
        if self._encoder is None:
            from magretrieve.train.encoder import Encoder

            mode = "cosine" if self.tag == "zero-shot" else None
            # queries as long as the model allows (0); documents at the training length
            self._encoder = Encoder.load(
                self.model,
                mode,
                device="cpu",
                max_query_length=0,
                max_document_length=self.max_doc_length,
            )
        return self._encoder

    def similarity(self) -> dict[str, Any]:
        path = self.folder / "similarity.json"
        if path.is_file():
            return json.loads(path.read_text())
        sim = self.encoder().similarity
        info = {
            "mode": sim.mode,
            "gamma_q": sim.gamma_q,
            "gamma_d": sim.gamma_d,
            "max_query_length": self.encoder().config.max_query_length,
            "max_document_length": self.encoder().config.max_document_length,
        }
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(info))
        return info

    def _path(self, texts: list[str], side: str, label: str) -> Path:
        limit = self.max_doc_length if side == "document" else "model"
        return self.folder / f"{label}-{side}-{limit}-{_key(texts)}.npy"

    def raw(self, texts: list[str], side: str, label: str) -> np.ndarray:
        path = self._path(texts, side, label)
        if path.is_file():
            return np.load(path)
        enc = self.encoder()
        out = enc.embed(texts, side, progress=f"{self.tag}: {label} {side}s")
        self.folder.mkdir(parents=True, exist_ok=True)
        np.save(path, out)
        (path.with_suffix(".json")).write_text(
            json.dumps({"texts": len(texts), "truncated": int(enc.last_truncated)})
        )
        self.similarity()
        return out

    def truncated(self, texts: list[str], side: str, label: str) -> int:
        meta = self._path(texts, side, label).with_suffix(".json")
        return int(json.loads(meta.read_text())["truncated"]) if meta.is_file() else -1


def split_texts(ds: RetrievalDataset) -> tuple[list[str], list[str], list[str], list[str]]:
    """Document ids, document texts, judged query ids, query texts (qrels order)."""
    doc_ids = list(ds.corpus)
    qids = [q for q in ds.queries if q in ds.qrels]
    return (
        doc_ids,
        [ds.corpus[i].full_text for i in doc_ids],
        qids,
        [ds.queries[q] for q in qids],
    )


def encode_all(cache: VectorCache, sets: list[RetrievalDataset]) -> None:
    """Encode every corpus (once per folder) and every split's judged queries."""
    for ds in sets:
        _, docs, _, queries = split_texts(ds)
        cache.raw(docs, "document", ds.name)
        cache.raw(queries, "query", f"{ds.name}-{ds.split}")
