"""ANN recall measured, not hoped: recall@k against exact search on a sample, and tuning.

Approximate inner-product search over vectors that keep their magnitude is where ANN indexes
are known to fail quietly (HNSW graphs over unnormalized inner product: milvus-io/milvus#51821,
pgvector/pgvector#923, nmslib/hnswlib#74). So after an ANN index is built or optimized the
store calls :func:`measure`: the truth is exact inner-product search over every stored vector,
and recall@k = |ANN top-k ∩ exact top-k| / k, averaged.

The queries should look like the queries the store will get, because recall depends on where
queries sit: a query close to one stored point is easy, a query far from all of them (a MiniLM
query and its relevant passage sit near cosine 0.5-0.7) is where a graph or a partition misses
answers. A sample that is too easy stops the tuning too early and reports a recall the real
queries do not get. So, best first:

- the user's own queries (``--tuning-queries FILE``; :class:`TuningQueries` of kind
  :data:`USER`), measured alone;
- pseudo-queries made from the corpus (titles, first sentences and spans of stored documents
  encoded with the **query** graph, each with its document held out of both answers; kind
  :data:`PSEUDO`), which ``magretrieve index`` / ``index_corpus`` make when the store has an ANN
  index, mixed with a quarter of the synthetic sample below;
- otherwise (a store reopened without texts or an encoder) a synthetic sample made hard on
  purpose: half are stored directions moved off by isotropic noise to cosine
  :data:`FAR_COSINE`, half are mixtures of :data:`MIX_PARTS` stored directions moved off to
  cosine :data:`MIX_COSINE`; every stored vector a query was made from is held out of the exact
  answer and the index's answer, so the query is answered by its neighbourhood, not by itself.
  ``benchmarks/results/recall_honesty.md`` measures how far each sample sits from the stored
  points (mean max-cosine) beside real queries, and the recall each delivers.

Below its backend's ``exact_below`` size (declared once in the backend's module as
``EXACT_BELOW``, measured where exact search is as fast as the index: docs/stores.md) a store
searches exactly and measures nothing; :func:`search_mode` is what ``describe()`` reports of it.

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
#: Cosine between a lightly perturbed query and the stored direction it is made from (the
#: sample measured before the harder one; kept for comparison in the benchmarks).
SOURCE_COSINE = 0.9
#: Cosine between a far query and the stored direction it is made from.
FAR_COSINE = 0.7
#: Stored directions averaged into one mixture query, and its cosine to that average.
MIX_PARTS = 3
MIX_COSINE = 0.8
#: Share of the synthetic sample mixed into pseudo-queries.
SYNTHETIC_SHARE = 0.25
#: Fewer given queries than this are topped up with the synthetic sample.
MIN_GIVEN = 20

#: What a store tuned on (``describe()["parameters"]["recall"]["query_kind"]``).
USER = "user queries"
PSEUDO = "pseudo-queries from the corpus (titles, first sentences, spans; query graph)"
SYNTHETIC = (
    f"synthetic: stored directions moved to cosine {FAR_COSINE} and mixtures of {MIX_PARTS} "
    f"moved to cosine {MIX_COSINE}, sources held out"
)
REAL = "real queries"

#: What ``describe()["parameters"]["search"]`` says of a store below its ``exact_below``.
EXACT = "exact"
#: ... and of a store at or above it (its ANN index answers).
APPROXIMATE = "ann"


def search_mode(count: int, exact_below: int) -> dict[str, Any]:
    """What ``describe()`` reports of an ANN store's size rule: the size below which it
    searches exactly (its backend's measured ``EXACT_BELOW``, declared once in its module) and
    which search answers now."""
    return {
        "exact_below": int(exact_below),
        "search": EXACT if count < exact_below else APPROXIMATE,
    }


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


@dataclass
class TuningQueries:
    """Query vectors a store tunes and measures on: ``kind`` says what they are (:data:`USER`,
    :data:`PSEUDO`), ``sources`` the stored id each was made from (held out of both answers;
    ``None`` for a query made from no document)."""

    vectors: np.ndarray
    kind: str
    sources: Sequence[str | None] | None = None

    def __post_init__(self) -> None:
        self.vectors = np.ascontiguousarray(self.vectors, dtype=np.float32)
        if self.vectors.ndim != 2:
            raise ValueError("tuning query vectors must be a 2-d array")
        if self.sources is not None and len(self.sources) != len(self.vectors):
            raise ValueError("one source (or None) per tuning query")

    def __len__(self) -> int:
        return len(self.vectors)


def _unit(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _move_off(unit: np.ndarray, cosine: float, rng: np.random.Generator) -> np.ndarray:
    """Each unit row moved off by isotropic noise to exactly ``cosine`` with itself."""
    noise = rng.standard_normal(unit.shape).astype(np.float32)
    noise -= (noise * unit).sum(axis=1, keepdims=True) * unit  # orthogonal to the source
    noise = _unit(noise)
    return (cosine * unit + np.sqrt(1.0 - cosine**2) * noise).astype(np.float32)


def perturbed_sample(
    vectors: np.ndarray, n: int, seed: int, cosine: float = SOURCE_COSINE
) -> tuple[np.ndarray, list[list[int]]]:
    """``n`` sampled stored directions moved off to ``cosine``, each with its source row."""
    rng = np.random.default_rng(seed)
    pick = rng.choice(len(vectors), size=min(n, len(vectors)), replace=False)
    return _move_off(_unit(vectors[pick]), cosine, rng), [[int(p)] for p in pick]


def synthetic_sample(vectors: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, list[list[int]]]:
    """The hard synthetic sample (see the module): far-perturbed directions and mixtures."""
    rng = np.random.default_rng(seed + 7919)
    far = n - n // 2
    q1, src1 = perturbed_sample(vectors, far, seed, FAR_COSINE)
    parts = min(MIX_PARTS, len(vectors))
    mixes = n // 2
    if mixes == 0 or parts < 2:
        return q1, src1
    rows = np.stack([rng.choice(len(vectors), size=parts, replace=False) for _ in range(mixes)])
    mean = _unit(_unit(vectors[rows.ravel()]).reshape(mixes, parts, -1).sum(axis=1))
    q2 = _move_off(mean, MIX_COSINE, rng)
    return np.concatenate([q1, q2]), src1 + [[int(r) for r in row] for row in rows]


def sample_queries(
    vectors: np.ndarray,
    n: int,
    seed: int,
    given: np.ndarray | TuningQueries | None = None,
    ids: Sequence[str] | None = None,
) -> tuple[np.ndarray, list[frozenset[Any]], str]:
    """(queries, held-out ids per query, what they are): see the module for the choice.

    ``given`` is a :class:`TuningQueries` or a bare array of real query vectors; with at least
    :data:`MIN_GIVEN` user or real queries those are used alone, pseudo-queries are mixed with
    a :data:`SYNTHETIC_SHARE` of the synthetic sample, and too few are topped up with it.
    ``ids`` name the rows of ``vectors`` (row numbers when absent).
    """
    rng = np.random.default_rng(seed)
    name = (lambda r: ids[r]) if ids is not None else (lambda r: r)
    if given is not None and not isinstance(given, TuningQueries):
        given = TuningQueries(np.asarray(given, dtype=np.float32), REAL)
    if given is not None and len(given) == 0:
        given = None
    take: list[np.ndarray] = []
    held: list[frozenset[Any]] = []
    kinds: list[str] = []
    synthetic_n = n
    if given is not None:
        pick = rng.permutation(len(given))[: max(n, MIN_GIVEN) if given.kind == PSEUDO else None]
        take.append(given.vectors[pick])
        src = given.sources
        held.extend(
            frozenset() if src is None or src[i] is None else frozenset([src[i]]) for i in pick
        )
        kinds.append(given.kind)
        if given.kind == PSEUDO and len(pick) >= MIN_GIVEN:
            synthetic_n = max(1, int(round(len(pick) * SYNTHETIC_SHARE / (1 - SYNTHETIC_SHARE))))
        elif len(pick) >= MIN_GIVEN:
            synthetic_n = 0
    if synthetic_n:
        q, rows = synthetic_sample(vectors, synthetic_n, seed)
        take.append(q)
        held.extend(frozenset(name(r) for r in row) for row in rows)
        kinds.append(SYNTHETIC)
    q = np.concatenate(take)
    order = rng.permutation(len(q))
    return (
        np.ascontiguousarray(q[order], dtype=np.float32),
        [held[i] for i in order],
        " + ".join(kinds),
    )


def _held_out(
    rows: Sequence[Sequence[Any]], held: Sequence[frozenset[Any]], k: int
) -> list[list[Any]]:
    """Each row without its query's sources (the vectors it was made from), cut to k."""
    return [[x for x in row if x not in h][:k] for row, h in zip(rows, held, strict=True)]


def measure(
    search: Callable[[np.ndarray, int], list[list[str]]],
    ids: Sequence[str],
    vectors: np.ndarray,
    *,
    knob: Knob | None = None,
    target: float | None = None,
    k: int = K,
    queries: np.ndarray | TuningQueries | None = None,
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
    given = queries.vectors if isinstance(queries, TuningQueries) else queries
    if given is not None and len(given) and np.shape(given)[1] != vectors.shape[1]:
        raise ValueError(
            f"{where}: tuning queries have {np.shape(given)[1]} dimensions, the store "
            f"{vectors.shape[1]}"
        )
    q, held, kind = sample_queries(vectors, 2 * QUERIES, seed, queries, ids)
    half = max(1, len(q) // 2) if len(q) > 1 else 1
    parts = (slice(0, half), slice(half, None)) if len(q) > 1 else (slice(None), slice(None))
    ids_arr = np.asarray(ids, dtype=object)
    most = max((len(h) for h in held), default=0)
    wider = min(k + most, n)  # more answers, for the held-out sources

    def part(which: slice) -> tuple[np.ndarray, list[frozenset[Any]]]:
        return q[which], held[which]

    def answers(queries_: np.ndarray, src: list[frozenset[Any]]) -> list[list[Any]]:
        return _held_out(search(queries_, wider), src, k)

    def exact(queries_: np.ndarray, src: list[frozenset[Any]]) -> list[list[Any]]:
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
        "query_kind": kind,
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
