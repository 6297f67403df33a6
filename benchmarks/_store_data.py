"""Benchmark data for benchmarks/stores.py: ≥ 50k real passages, embedded once and cached.

Passages are the sentences (≥ 4 words) of the scifact and cranfield abstracts in
../shared/data; queries are both sets' queries. Vectors come from all-MiniLM-L6-v2 in
``qnorm`` (documents keep their raw pooled magnitude, queries are unit-norm) and are cached
under ``_common.cache_dir("store_data")`` so the store benchmarks (stores.py, ann_recall.py)
can be re-run without re-encoding. Encoding runs under the shared CPU lock with 2 threads.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re

import numpy as np
from _common import cache_dir, cpu_lock, data_dir

SHARED = data_dir()
SETS = ("scifact", "cranfield")
_SPLIT = re.compile(r"(?<=[.!?])\s+")


def passages() -> tuple[list[str], list[str]]:
    """(ids, texts) of every sentence with ≥ 4 words, ids ``<set>:<doc>:<n>``."""
    ids, texts = [], []
    for name in SETS:
        with (SHARED / name / "corpus.jsonl").open() as fh:
            for line in fh:
                obj = json.loads(line)
                for n, sent in enumerate(_SPLIT.split(obj["text"])):
                    if len(sent.split()) >= 4:
                        ids.append(f"{name}:{obj['_id']}:{n}")
                        texts.append(sent)
    return ids, texts


def queries() -> list[str]:
    out = []
    for name in SETS:
        with (SHARED / name / "queries.jsonl").open() as fh:
            out.extend(json.loads(line)["text"] for line in fh if line.strip())
    return out


def load_vectors(
    batch_size: int = 128, lock: bool = True
) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
    """(ids, texts, document vectors, query vectors), encoding once and caching."""
    ids, texts = passages()
    qtexts = queries()
    key = hashlib.sha256("\n".join(texts + ["\0"] + qtexts).encode()).hexdigest()[:16]
    path = cache_dir("store_data") / f"minilm-qnorm-{key}.npz"
    if path.is_file():
        data = np.load(path)
        return ids, texts, data["docs"], data["queries"]
    import torch

    from magretrieve.train.encoder import Encoder

    # lock=False: the caller already holds the CPU lock (a second flock would wait on itself)
    with cpu_lock() if lock else contextlib.nullcontext():
        torch.set_num_threads(2)
        enc = Encoder.load("all-MiniLM-L6-v2", mode="qnorm")
        docs = enc.encode_documents(texts, batch_size=batch_size, progress="encoding passages")
        qv = enc.encode_queries(qtexts, batch_size=batch_size, progress="encoding queries")
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, docs=docs, queries=qv)
    tmp.replace(path)
    return ids, texts, docs, qv


if __name__ == "__main__":
    i, _, d, q = load_vectors()
    print(len(i), d.shape, q.shape, float(np.linalg.norm(d, axis=1).mean()))
