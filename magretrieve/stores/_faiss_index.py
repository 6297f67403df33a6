"""Building and adopting FAISS indexes around factory strings, with owning references.

Everything here is about the FAISS *object*: the aliases (``flat``/``hnsw``/``ivf`` are names
for factory strings), checking a factory string or an index object (metric, normalization,
kind), training an untrained index on a buffer of the first vectors (the FAISS idiom for IVF,
IVF-PQ, OPQ...), and setting search-time knobs through ``faiss.ParameterSpace``.

Ownership: ``faiss.downcast_index`` returns a *non-owning* proxy of the same C++ object. A
proxy kept after its owner is garbage-collected points at freed memory, and the next
``add_with_ids`` dies with SIGSEGV. :class:`IndexHandle` therefore keeps every owning Python
object (the factory result, the object a user passed, the ID-map wrapper) alive as long as
the handle, and downcast proxies are used only for inspection.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.extras import require

#: Build-time defaults (the aliases' parameters).
DEFAULTS: dict[str, Any] = {
    "hnsw_m": 32,
    "ef_construction": 200,
    "ef_search": 128,
    "nlist": None,  # IVF alias: ~4·sqrt(n) at training time
    "nprobe": 16,
}
ALIASES = ("flat", "hnsw", "ivf")
#: Vectors per centroid FAISS wants for k-means training (it warns below 39).
POINTS_PER_CENTROID = 39
#: Cap on the training buffer (FAISS samples at most 256 points per centroid anyway).
MAX_TRAIN = 200_000

_DEFAULT_THREADS = 0


def faiss_module() -> Any:
    """``import faiss`` (or a MissingExtra naming the extra)."""
    global _DEFAULT_THREADS
    faiss = require("faiss")
    if not _DEFAULT_THREADS:
        _DEFAULT_THREADS = max(1, faiss.omp_get_max_threads())
    return faiss


def default_threads() -> int:
    faiss_module()
    return _DEFAULT_THREADS


def alias_factory(index_type: str, params: dict[str, Any], n: int | None = None) -> str | None:
    """The factory string an alias stands for (``None`` for ``ivf`` before nlist is known).

    ``ivf`` without ``nlist`` waits for the training buffer: nlist ~ 4·√n, at least one list
    per 39 vectors.
    """
    kind = index_type.lower()
    if kind == "flat":
        return "Flat"
    if kind == "hnsw":
        return f"HNSW{int(params['hnsw_m'])},Flat"
    if kind == "ivf":
        nlist = params.get("nlist")
        if nlist is None:
            if n is None:
                return None
            nlist = max(1, min(int(4 * math.sqrt(n)), n // POINTS_PER_CENTROID or 1))
        return f"IVF{int(nlist)},Flat"
    raise ValueError(index_type)


@dataclass
class IndexHandle:
    """A FAISS index ready for ``add_with_ids``/``search``, plus the objects that own it.

    - ``index``: the object called (an ``IndexIDMap2`` around indexes without their own ids,
      the index itself for IVF, whose ids are native);
    - ``owners``: every owning Python object the index's memory belongs to;
    - ``kind``: ``flat``/``hnsw``/``ivf``/another class name (under pre-transforms);
    - ``lossy``: codes are compressed (PQ, SQ...), so reconstructed vectors are approximate;
    - ``normalizes``: an ``L2norm`` pre-transform rescales vectors (magnitude would be lost).
    """

    index: Any
    owners: list[Any] = field(default_factory=list)
    kind: str = "flat"
    lossy: bool = False
    normalizes: bool = False

    @property
    def is_trained(self) -> bool:
        return bool(self.index.is_trained)

    @property
    def ntotal(self) -> int:
        return int(self.index.ntotal)


def inspect_index(index: Any) -> dict[str, Any]:
    """Metric, normalization, kind, lossiness and the core of a FAISS index object.

    Only inspects: the proxies it makes are dropped, so it never matters who owns ``index``.
    """
    faiss = faiss_module()
    top = faiss.downcast_index(index)
    normalizes = refined = False
    core = top
    while True:
        if isinstance(core, faiss.IndexPreTransform):
            for i in range(core.chain.size()):
                vt = faiss.downcast_VectorTransform(core.chain.at(i))
                if isinstance(vt, faiss.NormalizationTransform):
                    normalizes = True
            core = faiss.downcast_index(core.index)
        elif isinstance(core, (faiss.IndexIDMap, faiss.IndexIDMap2)):
            core = faiss.downcast_index(core.index)
        elif isinstance(core, faiss.IndexRefine):
            refined = True
            core = faiss.downcast_index(core.base_index)
        else:
            break
    if isinstance(core, faiss.IndexHNSW):
        kind = "hnsw"
        storage = faiss.downcast_index(core.storage)
        lossy = not isinstance(storage, faiss.IndexFlat)
    elif isinstance(core, faiss.IndexIVF):
        kind = "ivf"
        lossy = not isinstance(core, faiss.IndexIVFFlat)
    elif isinstance(core, faiss.IndexFlat):
        kind, lossy = "flat", False
    else:
        kind, lossy = type(core).__name__, True
    metric = {faiss.METRIC_INNER_PRODUCT: "inner_product", faiss.METRIC_L2: "L2"}.get(
        top.metric_type, f"faiss metric {top.metric_type}"
    )
    return {
        "metric": metric,
        "normalizes": normalizes,
        "kind": kind,
        "lossy": lossy,
        "has_id_map": isinstance(top, (faiss.IndexIDMap, faiss.IndexIDMap2)),
        # a refine stage adds without ids (IndexRefine has no add_with_ids): ID-map it
        "native_ids": isinstance(core, faiss.IndexIVF) and not refined,
    }


def check_inner_product(info: dict[str, Any], where: str) -> None:
    if info["metric"] != "inner_product":
        raise StoreError(
            f"{where}: FAISS index metric {info['metric']} is not inner product; magretrieve "
            "stores are searched by inner product (METRIC_INNER_PRODUCT). An L2 index would "
            "rank by distance and ignore the magnitude the model keeps"
        )


_FACTORY_OK = re.compile(r"^[A-Za-z0-9_,.:+\-=()/]+$")


def _keeps_inner_products(vt: Any) -> bool:
    """True for a transform under which inner products (and so rankings) are unchanged.

    Only square orthogonal rotations (random rotation, OPQ without a dimension cut) qualify;
    normalization is told apart by :func:`inspect_index`. PCA centres and cuts dimensions,
    ITQ centres, a dimension remap drops coordinates: each changes which document wins.
    """
    faiss = faiss_module()
    rotation = isinstance(vt, (faiss.RandomRotationMatrix, faiss.OPQMatrix))
    return isinstance(vt, faiss.NormalizationTransform) or (rotation and vt.d_in == vt.d_out)


def check_factory_index(index: Any, factory: str, where: str) -> None:
    """Refuse what a magretrieve store cannot serve: IP-changing transforms, NSG graphs.

    A transform that changes inner products is accepted behind a refine stage (``,RFlat``),
    which re-scores the candidates on the original vectors. NSG builds its graph once, on
    the first ``add``: a second batch (every resumed or incremental index) fails.
    """
    faiss = faiss_module()
    core = faiss.downcast_index(index)
    refined = False
    while True:
        if isinstance(core, faiss.IndexRefine):
            refined = True
            core = faiss.downcast_index(core.base_index)
        elif isinstance(core, faiss.IndexPreTransform):
            for i in range(core.chain.size()):
                vt = faiss.downcast_VectorTransform(core.chain.at(i))
                if not refined and not _keeps_inner_products(vt):
                    raise StoreError(
                        f"{where}: FAISS index type {factory!r}: its {type(vt).__name__} "
                        "transform changes inner products, so rankings ignore the magnitude "
                        "the model keeps; add a refine stage on the original vectors "
                        f"(e.g. '{factory},RFlat')"
                    )
            core = faiss.downcast_index(core.index)
        elif isinstance(core, (faiss.IndexIDMap, faiss.IndexIDMap2)):
            core = faiss.downcast_index(core.index)
        else:
            break
    if isinstance(core, faiss.IndexNSG):
        raise StoreError(
            f"{where}: FAISS index type {factory!r}: an NSG graph is built once and cannot "
            "add vectors later (a resumed or incremental index would fail); use 'HNSW32,Flat'"
        )


def make_factory_index(dimension: int, factory: str, where: str) -> Any:
    """``faiss.index_factory(d, factory, METRIC_INNER_PRODUCT)``, its error as a StoreError.

    Index types a store cannot serve correctly are refused (:func:`check_factory_index`).
    """
    faiss = faiss_module()
    if not factory or not _FACTORY_OK.match(factory):
        raise StoreError(
            f"{where}: unknown FAISS index type {factory!r}: use flat, hnsw, ivf or a "
            "faiss.index_factory string such as 'HNSW32,Flat' or 'IVF256,PQ16'"
        )
    # the numbers inside the string get the same bounds as the options (HNSW0 aborts in FAISS)
    from magretrieve.stores.registry import check_option

    for pattern, option in ((r"HNSW(\d+)", "hnsw_m"), (r"IVF(\d+)", "nlist")):
        for value in re.findall(pattern, factory):
            try:
                check_option(option, int(value), where)
            except StoreError as exc:
                raise StoreError(f"{exc} (in the factory string {factory!r})") from None
    try:
        index = faiss.index_factory(int(dimension), factory, faiss.METRIC_INNER_PRODUCT)
    except (RuntimeError, ValueError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise StoreError(
            f"{where}: unknown FAISS index type {factory!r}: use flat, hnsw, ivf or a "
            f"faiss.index_factory string ({first})"
        ) from None
    check_factory_index(index, factory, where)
    return index


def wrap(index: Any, where: str, *, allow_filled: bool = False) -> IndexHandle:
    """An :class:`IndexHandle` around an owning index object (built or passed by a user).

    Indexes without their own ids get an ``IndexIDMap2`` (so FAISS ids are positions in the
    record table and vectors can be read back); IVF keeps its native ids with a hash-table
    direct map (for ``reconstruct`` and ``remove_ids``).
    """
    faiss = faiss_module()
    info = inspect_index(index)
    check_inner_product(info, where)
    handle = IndexHandle(
        index=index,
        owners=[index],
        kind=info["kind"],
        lossy=info["lossy"],
        normalizes=info["normalizes"],
    )
    if info["has_id_map"]:
        if index.ntotal > 0 and not allow_filled:
            raise StoreError(
                f"{where}: a non-empty FAISS ID-map index cannot be adopted (its int64 ids have "
                "no string ids or payloads); pass an empty index or one without an ID map"
            )
        return handle
    if info["native_ids"]:
        if index.ntotal > 0 and not allow_filled:
            raise StoreError(
                f"{where}: a non-empty FAISS IVF index cannot be adopted; pass it empty"
            )
        set_direct_map(index)
        return handle
    if index.ntotal > 0 and not allow_filled:
        return handle  # vectors without ids: adopted with sequential ids by the caller
    idmap = faiss.IndexIDMap2(index)
    handle.index = idmap
    handle.owners.append(idmap)
    return handle


def set_direct_map(index: Any) -> None:
    """IVF (under any pre-transform): a hash-table direct map, for reconstruct/remove by id."""
    faiss = faiss_module()
    core = faiss.downcast_index(index)
    while isinstance(core, faiss.IndexPreTransform):
        core = faiss.downcast_index(core.index)
    if isinstance(core, faiss.IndexIVF) and core.direct_map.type != faiss.DirectMap.Hashtable:
        core.set_direct_map_type(faiss.DirectMap.Hashtable)


def train_target(factory_index: Any) -> int:
    """How many buffered vectors an untrained index should be trained on.

    39 points per centroid of the largest k-means inside (IVF lists, 2^nbits PQ centroids),
    capped at :data:`MAX_TRAIN`; FAISS itself subsamples to 256 points per centroid.
    """
    faiss = faiss_module()
    centroids = 1
    stack = [faiss.downcast_index(factory_index)]
    while stack:
        idx = stack.pop()
        if isinstance(idx, faiss.IndexPreTransform):
            stack.append(faiss.downcast_index(idx.index))
            continue
        if isinstance(idx, (faiss.IndexIDMap, faiss.IndexIDMap2)):
            stack.append(faiss.downcast_index(idx.index))
            continue
        if isinstance(idx, faiss.IndexIVF):
            centroids = max(centroids, int(idx.nlist))
            pq = getattr(idx, "pq", None)
            if pq is not None:
                centroids = max(centroids, 1 << int(pq.nbits))
        elif hasattr(idx, "pq"):
            centroids = max(centroids, 1 << int(idx.pq.nbits))
    return min(MAX_TRAIN, POINTS_PER_CENTROID * centroids)


def min_train(factory_index: Any) -> int:
    """The fewest vectors k-means accepts (one per centroid of the largest k-means)."""
    return max(1, train_target(factory_index) // POINTS_PER_CENTROID)


def train(handle: IndexHandle, vectors: np.ndarray, where: str) -> None:
    """Train an untrained index on ``vectors`` (the first vectors added), as FAISS recommends."""
    need = min_train(handle.index)
    if len(vectors) < need:
        raise StoreError(
            f"{where}: the FAISS index needs at least {need} vectors to train, got {len(vectors)}; "
            "add more documents first, or choose fewer IVF lists / PQ bits"
        )
    _no_polysemous(handle.index)
    try:
        handle.index.train(np.ascontiguousarray(vectors, dtype=np.float32))
    except RuntimeError as exc:
        raise StoreError(f"{where}: FAISS training failed ({str(exc).splitlines()[0]})") from None
    set_direct_map(handle.index)


def _no_polysemous(index: Any) -> None:
    """Skip polysemous PQ training (on by default in factory ``PQ`` strings).

    It reorders PQ centroids for Hamming-distance filtering (``polysemous_ht``), which the
    store never uses, and costs far more than the k-means itself.
    """
    faiss = faiss_module()
    stack = [faiss.downcast_index(index)]
    while stack:
        idx = stack.pop()
        if isinstance(idx, (faiss.IndexPreTransform, faiss.IndexIDMap, faiss.IndexIDMap2)):
            stack.append(faiss.downcast_index(idx.index))
        elif hasattr(idx, "do_polysemous_training"):
            idx.do_polysemous_training = False


def set_search_parameters(handle: IndexHandle, params: dict[str, Any]) -> None:
    """Apply ``ef_search``/``nprobe`` through ``faiss.ParameterSpace`` (reaches nested indexes)."""
    faiss = faiss_module()
    space = faiss.ParameterSpace()
    if handle.kind == "hnsw" and params.get("ef_search") is not None:
        space.set_index_parameter(handle.index, "efSearch", int(params["ef_search"]))
    if handle.kind == "ivf" and params.get("nprobe") is not None:
        space.set_index_parameter(handle.index, "nprobe", int(params["nprobe"]))


def _exhaustive(handle: IndexHandle) -> tuple[Any, Any] | None:
    """(ID map, HNSW index) or (None, IVF index) where the index can search exactly."""
    faiss = faiss_module()
    top = faiss.downcast_index(handle.index)
    if handle.kind == "hnsw" and isinstance(top, (faiss.IndexIDMap, faiss.IndexIDMap2)):
        core = faiss.downcast_index(top.index)
        if isinstance(core, faiss.IndexHNSW):
            return top, core
    if handle.kind == "ivf" and isinstance(top, faiss.IndexIVF):
        return None, top
    return None


def searches_exhaustively(handle: IndexHandle) -> bool:
    """Whether :func:`exhaustive_search` answers for this index (an HNSW graph under the
    store's ID map, an IVF index without pre-transforms or refine stages)."""
    return _exhaustive(handle) is not None


def exhaustive_search(handle: IndexHandle, q: np.ndarray, k: int) -> tuple[Any, Any] | None:
    """The index's own exact search, or None where it has none: an HNSW graph's storage
    scanned whole (its ``IndexFlat`` under the ID map, labels mapped back through it), every
    list of an IVF index probed. Scores are what the ANN search would compute (decoded codes
    for a lossy storage), so the answer is exact search over what the index holds."""
    faiss = faiss_module()
    parts = _exhaustive(handle)
    if parts is None:
        return None
    idmap, core = parts
    if idmap is None:
        return core.search(q, k, params=faiss.SearchParametersIVF(nprobe=int(core.nlist)))
    scores, rows = faiss.downcast_index(core.storage).search(q, k)
    labels = faiss.vector_to_array(idmap.id_map)
    return scores, np.where(rows >= 0, labels[np.maximum(rows, 0)], -1)


def read_parameters(handle: IndexHandle) -> dict[str, Any]:
    """Build/search settings held by the index itself (HNSW M/ef, IVF nlist/nprobe)."""
    faiss = faiss_module()
    core = faiss.downcast_index(handle.index)
    while True:
        if isinstance(core, (faiss.IndexPreTransform, faiss.IndexIDMap, faiss.IndexIDMap2)):
            core = faiss.downcast_index(core.index)
        elif isinstance(core, faiss.IndexRefine):
            core = faiss.downcast_index(core.base_index)
        else:
            break
    if isinstance(core, faiss.IndexHNSW):
        return {
            "hnsw_m": int(core.hnsw.nb_neighbors(1)),
            "ef_construction": int(core.hnsw.efConstruction),
            "ef_search": int(core.hnsw.efSearch),
        }
    if isinstance(core, faiss.IndexIVF):
        return {"nlist": int(core.nlist), "nprobe": int(core.nprobe)}
    return {}


def set_build_parameters(handle: IndexHandle, params: dict[str, Any]) -> None:
    """HNSW efConstruction (before any vector is added)."""
    faiss = faiss_module()
    if handle.kind == "hnsw" and params.get("ef_construction") is not None:
        core = faiss.downcast_index(handle.index)
        while not isinstance(core, faiss.IndexHNSW):
            core = faiss.downcast_index(core.index)
        core.hnsw.efConstruction = int(params["ef_construction"])


def serialize(handle: IndexHandle) -> bytes:
    return faiss_module().serialize_index(handle.index).tobytes()


def read(path: str, where: str) -> IndexHandle:
    """An index file written by :func:`serialize` (the owning object read_index returns)."""
    return wrap(faiss_module().read_index(path), where, allow_filled=True)
