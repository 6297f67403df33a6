"""Indexing engines: where ``index_corpus`` runs its encoding, and the options each one takes.

``local`` (the default) is :func:`magretrieve.serving.indexing.index_documents` in this
process. Every other engine is one module here plus one :class:`Engine` entry in
:data:`ENGINES`; the module is imported only when chosen, so its dependency (e.g. ``ray`` for
``engine="ray"``, the ``magretrieve[ray]`` extra) is never imported on the default path.

An engine declares its own options as an option class (fields made by
:func:`magretrieve.core.options.option`, like every option of the project);
``magretrieve index`` derives its flags from them, so the CLI names no engine, and the values
are checked against the declarations before the engine is imported. An engine function has
the signature of :func:`magretrieve.serving.indexing.index_corpus` plus its own keyword
options, and returns an :class:`~magretrieve.serving.indexing.IndexReport`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from magretrieve.core.errors import ConfigError
from magretrieve.core.options import Option, OptionClass, option

__all__ = ["ENGINES", "Engine", "RayOptions", "engine_options", "get_engine", "option_specs"]


@dataclass(frozen=True)
class RayOptions(OptionClass):
    """The options of ``engine="ray"``: which cluster, how many encoding actors."""

    address: str | None = option(
        "Ray cluster to join (e.g. auto, ray://head:10001); default: start a local Ray.",
        flag="--address",
    )
    workers: int | None = option(
        "Ray encoding actors (default: one per CPU).", flag="--workers", minimum=1
    )
    connect_timeout: float | None = option(
        "Seconds the --address cluster gets to answer (default: 30).",
        flag="--connect-timeout",
        minimum=0,
        exclusive_minimum=True,
    )


@dataclass(frozen=True)
class Engine:
    """An indexing engine: its function, its own options, and how it treats shared ones.

    ``options``: its option class (None: it takes none). ``forwards``: options of
    ``magretrieve index`` itself (e.g. ``threads``) handed on to the engine when set. ``refuses``: options of the local path it cannot honour, each with the
    reason the user is told.
    """

    name: str
    target: str
    help: str
    options: type[OptionClass] | None = None
    forwards: tuple[str, ...] = ()
    refuses: Mapping[str, str] | None = None

    @property
    def declared(self) -> tuple[Option, ...]:
        """The engine's own options."""
        return self.options.declared() if self.options is not None else ()


ENGINES: dict[str, Engine] = {
    "local": Engine("local", "", "this process"),
    "ray": Engine(
        "ray",
        "magretrieve.engines.ray_engine:index_corpus_ray",
        "a Ray cluster (magretrieve[ray])",
        options=RayOptions,
        forwards=("threads",),
        refuses={"runtime": "Ray workers use the export's own runtime"},
    ),
}


def get_engine(name: str) -> Callable[..., Any]:
    """The indexing function of engine ``name`` (imported now, not before)."""
    engine = ENGINES.get(name)
    if engine is None or not engine.target:
        raise ConfigError(
            f"unknown indexing engine {name!r}; choose one of {', '.join(sorted(ENGINES))}"
        )
    module, _, func = engine.target.partition(":")
    return getattr(importlib.import_module(module), func)


def option_specs() -> list[Option]:
    """Every engine's own options, each name once, in registry order (for the CLI)."""
    seen: dict[str, Option] = {}
    for engine in ENGINES.values():
        for opt in engine.declared:
            seen.setdefault(opt.name, opt)
    return list(seen.values())


def engine_options(
    name: str, given: Mapping[str, Any], shared: Mapping[str, Any]
) -> dict[str, Any]:
    """The keyword options to hand engine ``name``, checked against what the user set.

    ``given`` holds every engine option from the CLI (None when unset); ``shared`` the index
    options an engine may take over or refuse (None when unset). An option of another engine,
    or a shared option the chosen engine refuses, is a ConfigError naming the flags; a value
    its declaration refuses is a ConfigError naming the option.
    """
    engine = ENGINES[name]
    own = {opt.name for opt in engine.declared}
    for other in ENGINES.values():
        theirs = [opt for opt in other.declared if opt.name not in own]
        stray = [opt.label for opt in theirs if given.get(opt.name) is not None]
        if other.name != name and stray:
            verb = "needs" if len(stray) == 1 else "need"
            raise ConfigError(f"{' and '.join(stray)} {verb} --engine {other.name}")
    for refused, reason in (engine.refuses or {}).items():
        if shared.get(refused) is not None:
            flag = "--" + refused.replace("_", "-")
            raise ConfigError(f"{flag} applies to --engine local ({reason})")
    options = {
        opt.name: opt.check(value) if (value := given.get(opt.name)) is not None else None
        for opt in engine.declared
    }
    options.update({k: shared[k] for k in engine.forwards if shared.get(k) is not None})
    return options
