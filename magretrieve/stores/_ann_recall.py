"""ANN recall measured, not hoped: recall@k against exact search on a sample, and tuning.

Approximate inner-product search over vectors that keep their magnitude is where ANN indexes
are known to fail quietly (HNSW graphs over unnormalized inner product: milvus-io/milvus#51821,
pgvector/pgvector#923, nmslib/hnswlib#74). So after an ANN index is built or optimized the
store calls :func:`measure`: the truth is exact inner-product search over every stored vector,
and recall@k = |ANN top-k ∩ exact top-k| / k, averaged.

The queries (real ones when given) are made from the store's own vectors, and made to look like
queries rather than documents. A stored vector's own direction is a poor stand-in: its best
answer is itself, and a low-norm vector is one an inner-product graph rarely links to, so its
recall measures reachability of that vector instead of the search around it (real queries stay
far from every document and their answers are high-norm ones). So each tuning query is the
direction of a sampled vector moved off it by isotropic noise (cosine :data:`SOURCE_COSINE`
to it), and the sampled vector is left out of both the exact answer and the index's answer
("held out"). ``benchmarks/results/mips_scale.md`` compares the recall measured this way with
the recall on held-out real queries at every size.

With a target (``target_recall`` / ``--target-recall``) the search knob (FAISS ``efSearch`` or
``nprobe``, set through ``faiss.ParameterSpace``; Qdrant ``hnsw_ef``) is raised step by step on
one half of the queries until the target plus half the remaining gap is reached (0.995 for a
0.99 target: a small tuning sample otherwise lands below the target on other queries); cost grows with the knob, so the first
value that reaches it is the fastest that does. The other half then measures the recall that
is reported, so the number is not fitted to the queries that chose it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from magretrieve.core.topk import exact_search

logger = logging.getLogger(__name__)

#: Below this recall@k the store warns (and ``magretrieve index`` prints the warning).
WARN_BELOW = 0.95
K = 10
#: Queries per half (tuning / reporting).
QUERIES = 200
#: Cosine between a tuning query and the stored direction it is made from.
SOURCE_COSINE = 0.9

HNSW_EF = (16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)


def nprobe_values(nlist: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, ... up to ``nlist`` (exhaustive)."""
    out, v = [], 1
    while v < nlist:
        out.append(v)
        if v >= 2 and int(v * 1.5) < nlist:
            out.append(int(v * 1.5))
        v *= 2
    return sorted(set(out + [int(nlist)]))


@dataclass
class Knob:
    """One search-time knob: its name, candidate values (ascending) and how to set it."""

    name: str
    values: Sequence[int]
    set: Callable[[int], None]
    current: int


def recall_at_k(found: Sequence[Sequence[str]], truth: Sequence[Sequence[str]]) -> float:
    per = [len(set(f) & set(t)) / len(t) if t else 1.0 for f, t in zip(found, truth, strict=True)]
    return float(np.mean(per)) if per else 1.0


def sample_queries(
    vectors: np.ndarray, n: int, seed: int, real: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(queries, source rows): real queries if at least 20 are given (source -1), else ``n``
    sampled stored directions moved off by noise (see the module), each with its source row."""
    rng = np.random.default_rng(seed)
    if real is not None and len(real) >= 20:  # real queries given: measure on those alone
        q = rng.permutation(np.asarray(real, dtype=np.float32))
        return q, np.full(len(q), -1, dtype=np.int64)
    pick = rng.choice(len(vectors), size=min(n, len(vectors)), replace=False)
    unit = vectors[pick].astype(np.float32)
    unit /= np.maximum(np.linalg.norm(unit, axis=1, keepdims=True), 1e-12)
    noise = rng.standard_normal(unit.shape).astype(np.float32)
    noise -= (noise * unit).sum(axis=1, keepdims=True) * unit  # orthogonal to the source
    noise /= np.maximum(np.linalg.norm(noise, axis=1, keepdims=True), 1e-12)
    q = SOURCE_COSINE * unit + np.sqrt(1.0 - SOURCE_COSINE**2) * noise
    source = pick.astype(np.int64)
    if real is not None and len(real):
        q = np.concatenate([np.asarray(real, dtype=np.float32), q])
        source = np.concatenate([np.full(len(real), -1, dtype=np.int64), source])
    order = rng.permutation(len(q))
    return np.ascontiguousarray(q[order], dtype=np.float32), source[order]


def _held_out(rows: Sequence[Sequence[Any]], sources: Sequence[Any], k: int) -> list[list[Any]]:
    """Each row without its query's source (the vector the query was made from), cut to k."""
    return [[x for x in row if x != src][:k] for row, src in zip(rows, sources, strict=True)]


def measure(
    search: Callable[[np.ndarray, int], list[list[str]]],
    ids: Sequence[str],
    vectors: np.ndarray,
    *,
    knob: Knob | None = None,
    target: float | None = None,
    k: int = K,
    queries: np.ndarray | None = None,
    ground_truth: str = "exact inner product over the stored vectors",
    where: str = "",
    seed: int = 0,
    warn: bool = True,
) -> dict[str, Any]:
    """recall@k of ``search`` against exact search (tuning ``knob`` to ``target`` first).

    ``search(q, k)`` returns document ids per query; ``ids``/``vectors`` are every live
    stored vector. Returns what is recorded in ``describe()`` and the store's state.
    ``warn=False`` leaves the low-recall warning to the caller (:func:`warn_if_low`), for a
    store that measures several settings and keeps one.
    """
    n = len(ids)
    k = min(k, n - 1) if n > 1 else 1
    q, source = sample_queries(vectors, 2 * QUERIES, seed, queries)
    half = max(1, len(q) // 2) if len(q) > 1 else 1
    parts = (slice(0, half), slice(half, None)) if len(q) > 1 else (slice(None), slice(None))
    ids_arr = np.asarray(ids, dtype=object)
    wider = min(k + 1, n)  # one more answer, for the held-out source

    def part(which: slice) -> tuple[np.ndarray, list[Any]]:
        src = [ids_arr[s] if s >= 0 else None for s in source[which]]
        return q[which], src

    def answers(queries_: np.ndarray, src: list[Any]) -> list[list[Any]]:
        return _held_out(search(queries_, wider), src, k)

    def exact(queries_: np.ndarray, src: list[Any]) -> list[list[Any]]:
        rows = exact_search(queries_, vectors, wider)[0]
        return _held_out([list(ids_arr[row]) for row in rows], src, k)

    (tune_q, tune_src), (eval_q, eval_src) = part(parts[0]), part(parts[1])
    t0 = time.perf_counter()
    truth = exact(eval_q, eval_src)
    exact_qps = len(eval_q) / max(time.perf_counter() - t0, 1e-9)
    out: dict[str, Any] = {
        "k": k,
        "queries": len(eval_q),
        "ground_truth": ground_truth,
        "query_kind": (
            "real queries"
            if all(s is None for s in eval_src)
            else f"held-out stored directions (cosine {SOURCE_COSINE} to the source)"
        ),
    }
    if knob is not None and target is not None:
        tune_truth = exact(tune_q, tune_src)
        chosen, reached = knob.values[-1], False
        # half the remaining gap as a margin: the tuning sample is small, and a setting that
        # only just reaches the target there lands below it on other queries about half the time
        bar = min(1.0, target + (1.0 - target) / 2)
        # a bar in a terminal only (tuning a million vectors takes minutes)
        with tqdm(knob.values, desc=f"tuning {knob.name}", leave=False, disable=None) as steps:
            for value in steps:
                knob.set(int(value))
                if recall_at_k(answers(tune_q, tune_src), tune_truth) >= bar:
                    chosen, reached = value, True
                    break
        knob.set(int(chosen))
        knob.current = int(chosen)
        out.update({"target": target, "tuned_to": bar, "target_met_on_tuning_queries": reached})
    if knob is not None:
        out[knob.name] = int(knob.current)
    t0 = time.perf_counter()
    found = answers(eval_q, eval_src)
    qps = len(eval_q) / max(time.perf_counter() - t0, 1e-9)
    measured = recall_at_k(found, truth)
    out.update(
        {
            f"recall_at_{k}": round(measured, 4),
            "qps": round(qps, 1),
            "exact_qps": round(exact_qps, 1),
        }
    )
    if measured < WARN_BELOW:
        out["warning"] = f"recall@{k} {measured:.3f} below {WARN_BELOW}"
    if warn:
        warn_if_low(out, where)
    return out


def warn_if_low(recall: dict[str, Any], where: str) -> None:
    """Log the warning :func:`measure` recorded for a recall below :data:`WARN_BELOW`."""
    if "warning" not in recall:
        return
    k = recall.get("k", K)
    logger.warning(
        "%s: ANN recall@%d is %.3f (< %.2f) against exact search%s",
        where,
        k,
        recall[f"recall_at_{k}"],
        WARN_BELOW,
        "; raise --target-recall or use an exact index"
        if "target" in recall
        else "; try --target-recall",
    )


def warning_line(recall: dict[str, Any] | None) -> str | None:
    """One line for ``magretrieve index`` describing the measured recall (None if none)."""
    if not recall:
        return None
    k = recall.get("k", K)
    value = recall.get(f"recall_at_{k}")
    knob = next(
        (
            f"{n}={recall[n]}"
            for n in ("ef_search", "nprobe", "hnsw_ef", "leaves_to_search")
            if n in recall
        ),
        "",
    )
    line = (
        f"ANN recall@{k} {value:.3f} vs exact on {recall.get('queries')} sampled queries"
        + (f" ({knob})" if knob else "")
        + f", {recall.get('qps', 0):.0f} q/s vs exact {recall.get('exact_qps', 0):.0f} q/s"
    )
    if "target" in recall and not recall.get("target_met_on_tuning_queries", True):
        line += f"; target {recall['target']} NOT reached at the largest setting"
    if value is not None and value < WARN_BELOW:
        line = "warning: " + line + f" (below {WARN_BELOW})"
    return line
