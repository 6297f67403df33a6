"""Store options, declared once: typed option classes per index kind, and their checks.

An index kind's knobs are one frozen dataclass (the LanceDB ``index.py`` / qdrant-client
``HnswConfigDiff`` style): :class:`HnswOptions` (``m``, ``ef_construction``, ``ef_search``),
:class:`IvfOptions` (``nlist``, ``nprobe``) and :class:`IndexOptions`, the index a store builds
(its kind, those two, and the recall to tune to). Each field declares its ``open_store``
keyword, type, bounds, CLI flag and help once (:func:`knob`); the registry derives the option
table, the ``magretrieve index``/``search`` flags and the validation from these classes, and a
store receives one checked :class:`IndexOptions` instead of a list of keywords.

Options a single backend takes (``token``, ``quantization``, ...) are :class:`StoreOption`
objects in its registry entry.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from magretrieve.core.errors import StoreError


@dataclass(frozen=True)
class StoreOption:
    """One ``open_store`` keyword: its type, bounds, CLI flag and help.

    ``cli`` is the flag of ``magretrieve index`` (and ``rescale``); ``search`` says the option
    is a search-time knob also offered by ``magretrieve search``. Options with ``cli=None``
    are Python-only.
    """

    name: str
    type: type
    help: str
    cli: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple[str, ...] | None = None
    search: bool = False

    def check(self, value: Any, where: str = "") -> Any:
        """``value`` converted to the option's type, or a StoreError naming the option."""
        label = self.cli or self.name
        prefix = f"{where}: " if where else ""
        if self.type is bool:
            if not isinstance(value, bool):
                raise StoreError(f"{prefix}{label} must be true or false, got {value!r}")
            return value
        if self.type is str:
            if not isinstance(value, str):
                raise StoreError(f"{prefix}{label} must be a string, got {value!r}")
            if self.choices is not None and value not in self.choices:
                raise StoreError(
                    f"{prefix}{label} must be one of {', '.join(self.choices)}, got {value!r}"
                )
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:  # numpy scalars and numeric strings from config files
                value = float(value) if self.type is float else int(str(value))
            except (TypeError, ValueError):
                raise StoreError(
                    f"{prefix}{label} must be {'a number' if self.type is float else 'an integer'}"
                    f", got {value!r}"
                ) from None
        if self.type is int:
            if isinstance(value, float) and not value.is_integer():
                raise StoreError(f"{prefix}{label} must be an integer, got {value!r}")
            value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                raise StoreError(f"{prefix}{label} must be a finite number, got {value!r}")
        low, high = self.minimum, self.maximum
        if low is not None and (value <= low if self.exclusive_minimum else value < low):
            bound = f"> {low:g}" if self.exclusive_minimum else f">= {low:g}"
            raise StoreError(f"{prefix}{label} must be {bound}, got {value!r}")
        if high is not None and value > high:
            raise StoreError(f"{prefix}{label} must be <= {high:g}, got {value!r}")
        return value


def knob(keyword: str, typ: type, help: str, **declared: Any) -> Any:
    """A field of an option class: ``None`` (not given) by default, declared as the
    ``open_store`` keyword ``keyword`` with its type, bounds, CLI flag and help."""
    return field(default=None, metadata={"option": StoreOption(keyword, typ, help, **declared)})


class OptionClass:
    """What the option classes share: their declarations, and building one from keywords."""

    __dataclass_fields__: ClassVar[dict[str, Any]]
    #: Nested option classes: field name -> class (filled from the keywords of that class).
    _nested: ClassVar[Mapping[str, type[OptionClass]]] = {}

    @classmethod
    def declared(cls) -> tuple[StoreOption, ...]:
        """Every option this class (and the classes nested in it) declares."""
        out: list[StoreOption] = []
        for f in dataclasses.fields(cls):
            if f.name in cls._nested:
                out.extend(cls._nested[f.name].declared())
            else:
                out.append(f.metadata["option"])
        return tuple(out)

    @classmethod
    def keywords(cls) -> tuple[str, ...]:
        """The ``open_store`` keywords of :meth:`declared`."""
        return tuple(o.name for o in cls.declared())

    @classmethod
    def take(cls, given: dict[str, Any], where: str = "") -> Any:
        """An instance from the keywords in ``given`` (removed from it), each checked: a
        value of the wrong type or out of bounds is a StoreError naming the option."""
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in cls._nested:
                values[f.name] = cls._nested[f.name].take(given, where)
                continue
            option: StoreOption = f.metadata["option"]
            value = given.pop(option.name, None)
            values[f.name] = option.check(value, where) if value is not None else None
        return cls(**values)

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

    def as_keywords(self) -> dict[str, Any]:
        """The values as ``open_store`` keywords (None where not given)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in self._nested:
                out.update(value.as_keywords())
            else:
                out[f.metadata["option"].name] = value
        return out


@dataclass(frozen=True)
class HnswOptions(OptionClass):
    """An HNSW graph: links per node and the build and search breadths."""

    m: int | None = knob(
        "hnsw_m",
        int,
        "HNSW M, links per node (FAISS default 32, Qdrant 16).",
        cli="--hnsw-m",
        minimum=2,
        maximum=1024,
    )
    ef_construction: int | None = knob(
        "ef_construction",
        int,
        "HNSW efConstruction (FAISS 200, Qdrant 100).",
        cli="--ef-construction",
        minimum=1,
        maximum=100_000,
    )
    ef_search: int | None = knob(
        "ef_search",
        int,
        "HNSW efSearch / Qdrant hnsw_ef (FAISS 128); raised to k when smaller.",
        cli="--ef-search",
        minimum=1,
        maximum=100_000,
        search=True,
    )


@dataclass(frozen=True)
class IvfOptions(OptionClass):
    """An inverted file: its lists (partitions) and how many a query probes."""

    nlist: int | None = knob(
        "nlist", int, "IVF lists (default ~4·√n).", cli="--nlist", minimum=1, maximum=1 << 24
    )
    nprobe: int | None = knob(
        "nprobe",
        int,
        "IVF lists probed (FAISS 16).",
        cli="--nprobe",
        minimum=1,
        maximum=1 << 24,
        search=True,
    )


@dataclass(frozen=True)
class RecallOptions(OptionClass):
    """The recall@10 an ANN index is tuned to, by measurement."""

    target_recall: float | None = knob(
        "target_recall",
        float,
        "After building an ANN index, tune efSearch/nprobe/hnsw_ef by measurement to reach "
        "this recall@10 against exact search at the highest speed (e.g. 0.99).",
        cli="--target-recall",
        minimum=0.0,
        maximum=1.0,
        exclusive_minimum=True,
    )


#: The help of ``--faiss-index`` before the registry adds each backend's index kinds.
INDEX_TYPE_HELP = "The vector index a store builds, always by inner product; by backend:"


@dataclass(frozen=True)
class IndexOptions(OptionClass):
    """The index a store builds and searches: its kind, HNSW and IVF knobs, target recall."""

    index_type: str | None = knob("index_type", str, INDEX_TYPE_HELP, cli="--faiss-index")
    hnsw: HnswOptions = field(default_factory=HnswOptions)
    ivf: IvfOptions = field(default_factory=IvfOptions)
    target_recall: float | None = field(
        default=None, metadata=dataclasses.fields(RecallOptions)[0].metadata
    )
    _nested: ClassVar[Mapping[str, type[OptionClass]]] = {"hnsw": HnswOptions, "ivf": IvfOptions}

    def build(self) -> dict[str, Any]:
        """The build options (compared with the recorded ones on reopen)."""
        return {
            "index_type": self.index_type,
            "hnsw_m": self.hnsw.m,
            "ef_construction": self.hnsw.ef_construction,
            "nlist": self.ivf.nlist,
        }
