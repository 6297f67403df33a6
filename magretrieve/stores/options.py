"""Store options, declared once: typed option classes per index kind, and their checks.

An index kind's knobs are one frozen dataclass (the LanceDB ``index.py`` / qdrant-client
``HnswConfigDiff`` style): :class:`HnswOptions` (``m``, ``ef_construction``, ``ef_search``),
:class:`IvfOptions` (``nlist``, ``nprobe``) and :class:`IndexOptions`, the index a store builds
(its kind, those two, and the recall to tune to); :class:`AnnotatedOptions` is the
``prefetch`` of the annotated cosine stores. A backend's own options (Qdrant's quantization,
ScaNN's leaves, ...) are option classes of the same kind, declared in its module beside its
registry entry. Each field declares its ``open_store`` keyword, type, bounds, CLI flag and
help once (:func:`magretrieve.core.options.option`); the registry derives the option table,
the ``magretrieve index``/``search`` flags and the validation from these classes, and a store
receives one checked :class:`IndexOptions` instead of a list of keywords.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from magretrieve.core.errors import StoreError
from magretrieve.core.options import Option, OptionClass, option

__all__ = [
    "AnnotatedOptions",
    "HnswOptions",
    "IndexOptions",
    "IndexTypeOptions",
    "IvfOptions",
    "RecallOptions",
    "StoreOption",
    "StoreOptions",
]

#: One store option: the project's one declared-option type
#: (:class:`magretrieve.core.options.Option`), under the name the store registry used first.
StoreOption = Option


class StoreOptions(OptionClass):
    """An option class of a store: its checks raise :class:`StoreError`."""

    error = StoreError

    @classmethod
    def of(
        cls,
        options: Any,
        knobs: Mapping[str, Any],
        where: str,
        accepts: tuple[str, ...] | None = None,
    ) -> Any:
        """What a store constructor is given: an instance (``options``) or its keywords
        (``knobs``, each checked), not both. Keywords outside ``accepts`` are refused as not
        applying to the store; keywords of no option at all are a TypeError, as Python's."""
        given = dict(knobs)
        if accepts is not None:
            bad = sorted(k for k, v in given.items() if v is not None and k not in accepts)
            if bad:
                raise StoreError(f"{where}: option(s) {bad} do not apply to this store")
        if options is not None:
            if any(v is not None for v in given.values()):
                raise StoreError(f"{where}: give the options object or its keywords, not both")
            return options
        made = cls.take(given, where)
        if given:
            raise TypeError(f"unexpected keyword argument(s) {sorted(given)}")
        return made


@dataclass(frozen=True)
class HnswOptions(StoreOptions):
    """An HNSW graph: links per node and the build and search breadths."""

    m: int | None = option(
        "HNSW M, links per node (FAISS default 32, Qdrant 16).",
        name="hnsw_m",
        flag="--hnsw-m",
        minimum=2,
        maximum=1024,
    )
    ef_construction: int | None = option(
        "HNSW efConstruction (FAISS 200, Qdrant 100).",
        flag="--ef-construction",
        minimum=1,
        maximum=100_000,
    )
    ef_search: int | None = option(
        "HNSW efSearch / Qdrant hnsw_ef (FAISS 128); raised to k when smaller.",
        flag="--ef-search",
        minimum=1,
        maximum=100_000,
        search=True,
    )


@dataclass(frozen=True)
class IvfOptions(StoreOptions):
    """An inverted file: its lists (partitions) and how many a query probes."""

    nlist: int | None = option(
        "IVF lists (default ~4·√n).", flag="--nlist", minimum=1, maximum=1 << 24
    )
    nprobe: int | None = option(
        "IVF lists probed (FAISS 16).",
        flag="--nprobe",
        minimum=1,
        maximum=1 << 24,
        search=True,
    )


@dataclass(frozen=True)
class RecallOptions(StoreOptions):
    """The recall@10 an ANN index is tuned to, by measurement."""

    target_recall: float | None = option(
        "After building an ANN index, tune efSearch/nprobe/hnsw_ef by measurement to reach "
        "this recall@10 against exact search at the highest speed (e.g. 0.99).",
        flag="--target-recall",
        minimum=0.0,
        maximum=1.0,
        exclusive_minimum=True,
    )


#: The help of ``--faiss-index`` before the registry adds each backend's index kinds.
INDEX_TYPE_HELP = "The vector index a store builds, always by inner product; by backend:"


@dataclass(frozen=True)
class IndexTypeOptions(StoreOptions):
    """The kind of index a store builds (each backend names its own kinds)."""

    index_type: str | None = option(INDEX_TYPE_HELP, flag="--faiss-index")


@dataclass(frozen=True)
class IndexOptions(StoreOptions):
    """The index a store builds and searches: its kind, HNSW and IVF knobs, target recall."""

    index_type: str | None = field(
        default=None, metadata=dataclasses.fields(IndexTypeOptions)[0].metadata
    )
    hnsw: HnswOptions = field(default_factory=HnswOptions)
    ivf: IvfOptions = field(default_factory=IvfOptions)
    target_recall: float | None = field(
        default=None, metadata=dataclasses.fields(RecallOptions)[0].metadata
    )
    _nested: ClassVar[Mapping[str, type[StoreOptions]]] = {"hnsw": HnswOptions, "ivf": IvfOptions}

    def build(self) -> dict[str, Any]:
        """The build options (compared with the recorded ones on reopen)."""
        return {
            "index_type": self.index_type,
            "hnsw_m": self.hnsw.m,
            "ef_construction": self.hnsw.ef_construction,
            "nlist": self.ivf.nlist,
        }


@dataclass(frozen=True)
class AnnotatedOptions(StoreOptions):
    """An annotated Cosine collection or table (``magretrieve annotate``): its re-ranking."""

    prefetch: int | None = option(
        "Annotated Cosine collection/table (magretrieve annotate): cosine candidates "
        "re-ranked by cos·m(d) (default 100, or the value recorded by annotate).",
        flag="--prefetch",
        minimum=1,
        maximum=100_000,
        search=True,
    )


def check_dimension(dimension: int, where: str) -> int:
    """The dimension a store is created with: a positive integer (a bool is refused; numpy
    integers are integers)."""
    if isinstance(dimension, bool) or not isinstance(dimension, numbers.Integral):
        raise StoreError(f"{where}: dimension must be a positive integer, got {dimension!r}")
    if int(dimension) < 1:
        raise StoreError(f"{where}: dimension must be a positive integer, got {dimension!r}")
    return int(dimension)
