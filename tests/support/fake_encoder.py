"""A deterministic fake encoder exposing the runtime contract (``manifest`` +
``encode_queries``/``encode_documents``), and a small corpus for it.

Imports only numpy and magretrieve, so a child process a test starts can load this file by
its path (:data:`LOAD_IN_CHILD`) without any import path of the test suite.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from magretrieve.core import similarity

DIM = 24


@dataclass
class FakeManifest:
    mode: str = "qnorm"
    gamma_q: float = 1.0
    gamma_d: float = 0.0
    dimension: int = DIM
    model_fingerprint: str = "f" * 64
    index_metric: str = "inner_product"
    folder: Path | None = None

    @property
    def similarity(self) -> similarity.Similarity:
        return similarity.resolve(self.mode)

    @property
    def document_contract(self) -> str:
        return similarity.vector_contract(self.gamma_d)

    @property
    def query_contract(self) -> str:
        return similarity.vector_contract(self.gamma_q)


class FakeEncoder:
    """Bag of hashed word vectors: longer texts get larger raw norms, like real pooled output."""

    def __init__(self, mode: str = "qnorm", fingerprint: str = "f" * 64, dim: int = DIM) -> None:
        sim = similarity.resolve(mode)
        self.manifest = FakeManifest(mode, sim.gamma_q, sim.gamma_d, dim, fingerprint)
        self.dim = dim
        self.calls = 0
        self.fail_after: int | None = None  # raise after this many document batches
        self.nan_for: str | None = None  # give this text a NaN vector
        self.query_progress: list[bool | str] = []

    def raw(self, texts) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            for w in t.lower().split():
                rng = np.random.default_rng(zlib.crc32(w.encode()))
                out[i] += rng.normal(size=self.dim).astype(np.float32)
        return out

    def encode_queries(self, texts, batch_size: int = 32, progress: bool | str = False):
        self.query_progress.append(progress)  # the progress bar each call asked for
        return similarity.query_vectors(self.raw(texts), self.manifest.similarity)

    def encode_documents(self, texts, batch_size: int = 32) -> np.ndarray:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise KeyboardInterrupt("simulated crash")
        vecs = similarity.document_vectors(self.raw(texts), self.manifest.similarity)
        if self.nan_for is not None:
            for i, t in enumerate(texts):
                if self.nan_for in t:
                    vecs[i, 0] = np.nan
        return vecs


TOPICS = "statins heart cancer cell brain protein wing flow lung smoking vitamin dose".split()


def corpus(n: int = 60) -> list[dict]:
    rng = np.random.default_rng(3)
    docs = []
    for i in range(n):
        words = rng.choice(TOPICS, size=int(rng.integers(2, 12))).tolist()
        docs.append({"_id": f"d{i}", "title": f"title {i}", "text": " ".join(words), "year": i})
    return docs


def write_corpus(path: Path, n: int, seed: int = 0) -> Path:
    """A BEIR ``corpus.jsonl`` of ``n`` documents made of :data:`TOPICS` words."""
    rng = np.random.default_rng(seed)
    with path.open("w") as fh:
        for i in range(n):
            words = " ".join(rng.choice(TOPICS, size=int(rng.integers(2, 10))))
            fh.write(json.dumps({"_id": f"p{i}", "title": f"T{i}", "text": words}) + "\n")
    return path


#: Python lines that give a child process ``FakeEncoder``, loaded from this file by its path.
LOAD_IN_CHILD = f"""
import importlib.util, sys
_spec = importlib.util.spec_from_file_location("fake_encoder", {str(Path(__file__).resolve())!r})
_fake = importlib.util.module_from_spec(_spec)
sys.modules["fake_encoder"] = _fake
_spec.loader.exec_module(_fake)
FakeEncoder = _fake.FakeEncoder
"""
