"""Deprecated alias of :mod:`magretrieve.stores`, kept for one release.

``import magretrieve.adapters`` and ``magretrieve.adapters.<module>`` still work and resolve to
the same module objects as ``magretrieve.stores`` and ``magretrieve.stores.<module>``; each
import warns with a :class:`DeprecationWarning` that names the new path.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from typing import Any

from magretrieve.stores import *  # noqa: F403
from magretrieve.stores import __all__  # noqa: F401

OLD, NEW = "magretrieve.adapters", "magretrieve.stores"

warnings.warn(
    f"{OLD} is deprecated and will be removed in the next release; import {NEW} instead",
    DeprecationWarning,
    stacklevel=2,
)


class _AliasLoader(importlib.abc.Loader):
    """Loads ``magretrieve.adapters.X`` as the already-importable ``magretrieve.stores.X``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: Any) -> Any:
        return importlib.import_module(self.target)

    def exec_module(self, module: Any) -> None:  # the target module is executed already
        return None


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith(OLD + "."):
            return None
        new_name = NEW + fullname[len(OLD) :]
        if importlib.util.find_spec(new_name) is None:
            return None
        warnings.warn(
            f"{fullname} is deprecated and will be removed in the next release; "
            f"import {new_name} instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new_name))


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())


def __getattr__(name: str) -> Any:
    return getattr(importlib.import_module(NEW), name)
