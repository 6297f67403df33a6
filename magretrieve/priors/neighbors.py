"""Mean cosine to the ``k`` nearest other documents, exact or by approximate k-NN.

This is the hub score of the hub prior (:mod:`magretrieve.priors.hub`). Exactly it costs
O(n²·dim): every document against every other, growing fourfold with each doubling of n.

The default approximate path (``grouped``) finds each document's neighbours among the members
of its ``nprobe`` nearest inverted lists (spherical k-means cells, ≈4√n of them, trained by
matrix products on a random sample), the candidates
an IVF search (FAISS ``IndexIVFFlat``, inner product) would scan, but computes them list by
list: all documents probing one list meet its members in one matrix product, so every list is
read once per block of documents instead of once per document, and the document-to-centroid
products are computed once (an ``IndexIVFFlat`` computes them when adding and again when
searching). Its cost is the k-means on a sample, one n×nlist product and the list products,
O(n^1.5·dim), all at BLAS speed; its memory is the vectors plus ``k`` candidates per probe.

``ivf`` searches a FAISS ``IndexIVFFlat`` per document instead (same candidates, slower: each
query scans its lists from memory); it also takes a *streamed* source (``chunks``: a callable
returning a fresh iterator of row blocks, read twice), so a corpus larger than memory needs
only the index resident. ``blocked`` and ``hnsw`` are kept as options.

Which path runs: ``method="auto"`` takes the exact one below :data:`EXACT_MAX` documents (where
it is fast and there is nothing to approximate) and ``grouped`` above it (numpy only; the
``ivf``, ``blocked`` and ``hnsw`` options need faiss). ``benchmarks/studies/corpus_prior_scale.py`` measures the
agreement (Spearman of the z-scores, NDCG@10 of the prior) and the speed-up.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError, DataError
from magretrieve.core.extras import require

logger = logging.getLogger(__name__)

#: Below this many documents ``method="auto"`` computes the hub score exactly.
EXACT_MAX = 20_000
METHODS = ("auto", "exact", "grouped", "blocked", "ivf", "hnsw")
#: Vectors used to train the IVF coarse quantizer (k-means), at most this many per list.
TRAIN_PER_LIST = 64

Chunks = Callable[[], Iterable[np.ndarray]]

_PROGRESS: contextvars.ContextVar[bool] = contextvars.ContextVar("hub_progress", default=False)


@contextlib.contextmanager
def progress_shown(show: bool = True) -> Iterator[None]:
    """Show tqdm progress of the approximate paths inside this block (e.g. when a prior's
    ``fit_corpus`` computes the hub score of a large store, which takes minutes)."""
    token = _PROGRESS.set(bool(show))
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _as_unit_f32(block: np.ndarray) -> np.ndarray:
    v = np.ascontiguousarray(block, dtype=np.float32)
    if v.ndim != 2:
        raise DataError(f"expected a 2-d array of vectors, got shape {v.shape}")
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def exact_mean_knn(
    unit_docs: np.ndarray, k: int, chunk: int = 1024, rows: np.ndarray | None = None
) -> np.ndarray:
    """Exact mean cosine to the ``k`` nearest other rows (chunked: O(chunk·n) memory).

    ``rows`` (indices) limits the work to those documents, each still against all n: the
    result is their exact score, at ``len(rows)/n`` of the cost (the benchmark uses it to time
    the exact path at sizes where running it on every row would take half an hour).
    """
    d = np.asarray(unit_docs, dtype=np.float32)
    n = d.shape[0]
    which = np.arange(n) if rows is None else np.asarray(rows, dtype=np.int64)
    out = np.zeros(len(which), dtype=np.float64)
    for start in range(0, len(which), chunk):
        own = which[start : start + chunk]
        sims = d[own] @ d.T
        sims[np.arange(len(own)), own] = -np.inf  # not its own neighbour
        top = np.partition(sims, n - k, axis=1)[:, n - k :]
        out[start : start + chunk] = top.mean(axis=1)
    return out


#: Lists probed per document by the ``grouped`` and ``ivf`` paths, with
#: :data:`LISTS_PER_SQRT_N` ·√n lists. Chosen by measurement (benchmarks/results/
#: corpus_prior_scale.md): on corpora of mostly diffuse vectors 12 probes stayed under Spearman
#: 0.99 of z against exact, and a probe costs little in the grouped path (one product per list).
NPROBE = 32
#: Inverted lists of the ``ivf`` path per √n: more, smaller lists make each probe cheaper.
LISTS_PER_SQRT_N = 4
#: Lists compared per list by the blocked path: its candidates are chosen per list, not per
#: document, so it probes more lists than a per-document search (a product costs little).
#: Measured at 200,000 vectors it stays under Spearman 0.99 (0.981 at 32 probes, 0.988 at 64),
#: which is why ``auto`` takes the ``ivf`` path; it is kept as an option.
BLOCKED_NPROBE = 32
#: Lists of the blocked path per √n (its cost is one product per list, so fewer, larger lists).
BLOCKED_LISTS_PER_SQRT_N = 2
#: k-means iterations of the coarse quantizer (FAISS default 25; 10 is as good for this use).
KMEANS_ITERATIONS = 10


def default_nlist(n: int, per_sqrt_n: float = LISTS_PER_SQRT_N) -> int:
    """Inverted lists for ``n`` vectors: about ``per_sqrt_n``·√n (4√n for ``ivf``, 2√n blocked).

    A query scans the ``nlist`` centroids plus ``NPROBE`` lists of ~n/nlist vectors, so with
    ``nlist ∝ √n`` the whole corpus costs O(n^1.5·dim) instead of exact O(n²·dim).
    """
    return int(min(65536, max(1, round(per_sqrt_n * math.sqrt(n)))))


def _blocks(source: np.ndarray | Chunks, chunk: int) -> Iterator[np.ndarray]:
    if callable(source):
        for block in source():
            yield _as_unit_f32(block)
    else:
        for start in range(0, source.shape[0], chunk):
            yield _as_unit_f32(source[start : start + chunk])


def _build_index(
    faiss: Any, source: np.ndarray | Chunks, n: int, dim: int, method: str, chunk: int, codes: str
) -> Any:
    if method == "hnsw":
        index = faiss.IndexHNSWFlat(dim, 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 80
        index.hnsw.efSearch = 64
        for block in _blocks(source, chunk):
            index.add(block)
        return index
    nlist = default_nlist(n)
    index = faiss.index_factory(dim, f"IVF{nlist},{codes}", faiss.METRIC_INNER_PRODUCT)
    faiss.extract_index_ivf(index).cp.niter = KMEANS_ITERATIONS
    # k-means on the first TRAIN_PER_LIST·nlist vectors of the stream (a store's order carries
    # no meaning; a sorted corpus would want a random sample instead)
    want = min(n, TRAIN_PER_LIST * nlist)
    sample, got = [], 0
    for block in _blocks(source, chunk):
        sample.append(block[: want - got])
        got += len(sample[-1])
        if got >= want:
            break
    index.train(np.concatenate(sample))
    for block in _blocks(source, chunk):
        index.add(block)
    index.nprobe = min(nlist, NPROBE)
    return index


def approximate_mean_knn(
    source: np.ndarray | Chunks,
    k: int,
    *,
    n: int | None = None,
    method: str = "ivf",
    chunk: int = 8192,
    codes: str = "Flat",
    progress: bool = False,
) -> np.ndarray:
    """Mean cosine to the ``k`` approximate nearest other documents (FAISS, inner product).

    ``source`` is an (n, dim) array or a callable returning a fresh iterator of row blocks
    (then pass ``n``). ``codes`` is the IVF list storage: ``"Flat"`` (exact distances to the
    candidates) or ``"SQ8"`` (4x less memory, quantized distances).
    """
    from tqdm.auto import tqdm

    faiss = require("faiss", what="approximate k-NN")
    if method not in ("ivf", "hnsw"):
        raise ConfigError(f"unknown approximate method {method!r}; choose ivf or hnsw")
    if n is None:
        if callable(source):
            raise ConfigError("a streamed source needs n (the number of vectors)")
        n = int(source.shape[0])
    first = next(iter(_blocks(source, chunk)))
    dim = first.shape[1]
    index = _build_index(faiss, source, n, dim, method, chunk, codes)
    if index.ntotal != n:
        raise DataError(f"the source yielded {index.ntotal} vectors, expected {n}")
    out = np.empty(n, dtype=np.float64)
    bar = tqdm(total=n, desc="hub score (ann)", unit="doc", disable=not progress)
    start = 0
    for block in _blocks(source, chunk):
        sims, labels = index.search(block, k + 1)
        own = labels == np.arange(start, start + len(block))[:, None]
        # drop the document itself; where the search missed it, drop the weakest candidate
        missed = ~own.any(axis=1)
        own[missed, k] = True
        keep = sims[~own].reshape(len(block), k)
        # a list shorter than k + 1 pads with label −1 and −inf/−max similarity: ignore those
        valid = labels[~own].reshape(len(block), k) >= 0
        out[start : start + len(block)] = np.where(valid, keep, 0.0).sum(1) / np.maximum(
            valid.sum(1), 1
        )
        start += len(block)
        bar.update(len(block))
    bar.close()
    return out


def blocked_mean_knn(
    unit_docs: np.ndarray, k: int, *, nprobe: int = BLOCKED_NPROBE, progress: bool = False
) -> np.ndarray:
    """Inverted-file k-NN computed list by list with matrix products ("batched IVF").

    FAISS k-means (spherical) cuts the corpus into ``≈2√n`` lists; every document of a list
    is compared, in one BLAS product, with the documents of the ``nprobe`` lists whose
    centroids are nearest to its own list's centroid. The candidates are those of an IVF
    search probing ``nprobe`` lists, chosen per list instead of per document, so the whole
    list shares one product: O(n·nprobe·n/nlist·dim) = O(n^1.5·dim) at BLAS speed.
    """
    from tqdm.auto import tqdm

    faiss = require("faiss", what="approximate k-NN")
    x = _as_unit_f32(unit_docs)
    n, dim = x.shape
    nlist = default_nlist(n, BLOCKED_LISTS_PER_SQRT_N)
    km = faiss.Kmeans(
        dim,
        nlist,
        niter=KMEANS_ITERATIONS,
        spherical=True,
        max_points_per_centroid=TRAIN_PER_LIST,
        seed=1234,
    )
    km.train(x)
    _, assign = km.index.search(x, 1)
    assign = assign[:, 0]
    _, near = km.index.search(km.centroids, min(nprobe, nlist))
    order = np.argsort(assign, kind="stable")
    bounds = np.searchsorted(assign[order], np.arange(nlist + 1))
    members = [order[bounds[i] : bounds[i + 1]] for i in range(nlist)]
    out = np.zeros(n, dtype=np.float64)
    bar = tqdm(total=n, desc="hub score (blocked ivf)", unit="doc", disable=not progress)
    for cl in range(nlist):
        rows = members[cl]
        if not len(rows):
            continue
        cand = np.concatenate([members[j] for j in near[cl] if j >= 0])
        sims = x[rows] @ x[cand].T
        sims[cand[None, :] == rows[:, None]] = -np.inf  # not its own neighbour
        kk = min(k, cand.shape[0] - 1)
        if kk < 1:
            continue
        top = np.partition(sims, cand.shape[0] - kk, axis=1)[:, cand.shape[0] - kk :]
        out[rows] = top.mean(axis=1)
        bar.update(len(rows))
    bar.close()
    return out


#: Rows of one matrix product of the ``grouped`` path (bounds its working memory).
GROUPED_BLOCK = 4096


def _workers() -> int:
    """Threads of the grouped scan: the cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS / Windows
        return max(1, os.cpu_count() or 1)


def _single_threaded_blas() -> contextlib.AbstractContextManager[Any]:
    """BLAS limited to one thread inside the block (threadpoolctl), when installed."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - depends on the install
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def _blocks_on_pool(fn: Callable[[int], Any], n: int, block: int) -> list[Any]:
    """``fn(start)`` for every block start of ``range(n)``, on worker threads (one BLAS
    thread each), results in block order."""
    with _single_threaded_blas(), ThreadPoolExecutor(_workers()) as pool:
        return list(pool.map(fn, range(0, n, block)))


def _nearest_centroid(x: np.ndarray, centroids: np.ndarray, block: int = 8192) -> np.ndarray:
    def one(start: int) -> np.ndarray:
        return np.argmax(x[start : start + block] @ centroids.T, axis=1)

    return np.concatenate(_blocks_on_pool(one, len(x), block))


def kmeans_centroids(x: np.ndarray, nlist: int, *, seed: int = 1234) -> np.ndarray:
    """Unit centroids of spherical k-means on a random sample of ``x`` (unit rows).

    At most :data:`TRAIN_PER_LIST` random vectors per list, :data:`KMEANS_ITERATIONS` Lloyd
    iterations from ``nlist`` random sample points; a list left empty restarts at a random
    sample point. Assignments are matrix products on worker threads, so a million-document
    corpus trains in minutes.
    """
    rng = np.random.default_rng(seed)
    n = len(x)
    take = min(n, TRAIN_PER_LIST * nlist)
    sample = x if take == n else x[np.sort(rng.choice(n, take, replace=False))]
    centroids = sample[rng.choice(len(sample), nlist, replace=False)].copy()
    for _ in range(KMEANS_ITERATIONS):
        assign = _nearest_centroid(sample, centroids)
        order = np.argsort(assign, kind="stable")
        counts = np.bincount(assign, minlength=nlist)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        filled = counts > 0
        sums = np.add.reduceat(sample[order], starts[filled], axis=0)
        centroids[filled] = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), 1e-12)
        empty = np.flatnonzero(~filled)
        if len(empty):
            centroids[empty] = sample[rng.choice(len(sample), len(empty), replace=False)]
    return np.ascontiguousarray(centroids, dtype=np.float32)


def nearest_lists(
    x: np.ndarray, centroids: np.ndarray, nprobe: int, block: int = 8192
) -> np.ndarray:
    """Each row's ``nprobe`` nearest centroids by inner product, nearest first (int64)."""

    def one(start: int) -> np.ndarray:
        sims = x[start : start + block] @ centroids.T
        if nprobe < sims.shape[1]:
            top = np.argpartition(-sims, nprobe - 1, axis=1)[:, :nprobe]
        else:
            top = np.broadcast_to(np.arange(sims.shape[1]), sims.shape)
        order = np.argsort(-np.take_along_axis(sims, top, axis=1), axis=1, kind="stable")
        return np.take_along_axis(top, order, axis=1).astype(np.int64)

    return np.concatenate(_blocks_on_pool(one, len(x), block))


def grouped_mean_knn(
    unit_docs: np.ndarray,
    k: int,
    *,
    nprobe: int = NPROBE,
    nlist: int | None = None,
    progress: bool = False,
) -> np.ndarray:
    """Mean cosine to the ``k`` nearest other documents among those of each one's IVF probes.

    The candidates of a document are those of an inverted-file search: the members of the
    ``nprobe`` lists (spherical k-means cells, ``nlist`` ≈ 4√n by default) whose centroids are
    nearest to it, its own cell first. The work is grouped by list instead of by document: all
    documents that probe a list are compared with its members in one matrix product (blocks of
    :data:`GROUPED_BLOCK` documents), so the scan runs at BLAS speed. Each document keeps its
    ``k`` best per probed list; the ``k`` best of those are its neighbours (fewer when all its
    lists together hold fewer). The document itself is never its own neighbour.
    """
    from tqdm.auto import tqdm

    x = _as_unit_f32(unit_docs)
    n = x.shape[0]
    k = min(int(k), n - 1)
    nlist = min(n, nlist or default_nlist(n))
    nprobe = max(1, min(int(nprobe), nlist))
    steps = tqdm(total=2, desc="hub score: k-means, probes", unit="step", disable=not progress)
    centroids = kmeans_centroids(x, nlist)
    steps.update(1)
    probes = nearest_lists(x, centroids, nprobe)
    steps.update(1)
    steps.close()
    own = probes[:, 0]
    members_order = np.argsort(own, kind="stable")
    member_bounds = np.searchsorted(own[members_order], np.arange(nlist + 1))
    # position of each document inside its own list (to mask it out of its own row)
    position = np.empty(n, dtype=np.int64)
    position[members_order] = np.arange(n) - member_bounds[own[members_order]]
    flat = probes.ravel()
    pair_order = np.argsort(flat, kind="stable")  # (document, probe rank) pairs by list
    pair_bounds = np.searchsorted(flat[pair_order], np.arange(nlist + 1))
    best = np.full((n, nprobe, k), -np.inf, dtype=np.float32)

    def scan(lst: int) -> int:
        """Compare the documents probing list ``lst`` with its members; keep k best each."""
        members = members_order[member_bounds[lst] : member_bounds[lst + 1]]
        pairs = pair_order[pair_bounds[lst] : pair_bounds[lst + 1]]
        if not len(members) or not len(pairs):
            return len(pairs)
        cand = x[members].T
        size = len(members)
        kk = min(k, size)
        for start in range(0, len(pairs), GROUPED_BLOCK):
            part = pairs[start : start + GROUPED_BLOCK]
            docs, rank = part // nprobe, part % nprobe
            sims = x[docs] @ cand
            mine = np.flatnonzero(rank == 0)  # rank 0 is the document's own list
            sims[mine, position[docs[mine]]] = -np.inf
            if size > kk:
                sims = np.partition(sims, size - kk, axis=1)[:, size - kk :]
            best[docs, rank, :kk] = sims  # each (document, probe) belongs to one list only
        return len(pairs)

    # Lists run on worker threads, each product on one BLAS thread: the products are small
    # (hundreds of rows), where BLAS's own threads cost more than they save, and numpy
    # releases the GIL inside them, so the workers keep every core busy.
    bar = tqdm(total=n * nprobe, desc="hub score (grouped ivf)", unit="probe", disable=not progress)
    with _single_threaded_blas(), ThreadPoolExecutor(_workers()) as pool:
        for done in pool.map(scan, range(nlist)):
            bar.update(done)
    bar.close()
    flat_best = best.reshape(n, nprobe * k)
    top = np.partition(flat_best, flat_best.shape[1] - k, axis=1)[:, flat_best.shape[1] - k :]
    valid = np.isfinite(top)  # fewer than k candidates in all probed lists
    total = np.where(valid, top, 0.0).sum(axis=1, dtype=np.float64)
    return total / np.maximum(valid.sum(axis=1), 1)


def mean_knn_similarity(
    unit_docs: np.ndarray,
    k: int,
    *,
    method: str = "auto",
    chunk: int = 1024,
    progress: bool = False,
) -> np.ndarray:
    """Mean cosine of each row to its ``k`` nearest other rows: exact or approximate (see module).

    ``method``: ``auto`` (exact below :data:`EXACT_MAX` rows, else ``grouped``), ``exact``,
    ``grouped`` (:func:`grouped_mean_knn`), ``blocked`` (:func:`blocked_mean_knn`), ``ivf`` or
    ``hnsw`` (a FAISS index searched per document; these two also take a streamed source, see
    :func:`approximate_mean_knn`). ``progress`` (or :func:`progress_shown`) shows tqdm bars.
    """
    if method not in METHODS:
        raise ConfigError(f"unknown k-NN method {method!r}; choose one of {', '.join(METHODS)}")
    d = np.asarray(unit_docs, dtype=np.float32)
    n = d.shape[0]
    if n < 2:
        raise DataError(f"a hub score needs at least 2 documents, got {n}")
    k = min(int(k), n - 1)
    if k < 1:
        raise ConfigError(f"k must be at least 1, got {k}")
    if method == "auto":
        method = "exact" if n < EXACT_MAX else "grouped"  # numpy only: no faiss needed
    progress = progress or _PROGRESS.get()
    if method == "exact":
        return exact_mean_knn(d, k, chunk)
    if method == "grouped":
        return grouped_mean_knn(d, k, progress=progress)
    if method == "blocked":
        return blocked_mean_knn(d, k, progress=progress)
    return approximate_mean_knn(d, k, method=method, progress=progress)
