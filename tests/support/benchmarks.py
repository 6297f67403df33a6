"""Benchmark scripts of ``benchmarks/`` loaded into the tests, with ``sys.path`` left alone.

A benchmark runs as ``python benchmarks/NAME.py``: Python puts the script's folder on the
import path, and the script imports its shared helpers (``_common``, ``_quality``, ...) by
plain name. In the tests, :class:`BenchmarkHelpers` finds those helpers instead: a finder
that answers only the names of the ``_``-prefixed modules of ``benchmarks/``, so no other
module (``magretrieve`` least of all) can be shadowed by the folder's scripts.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
#: Scripts another script imports by plain name (serve_search reuses serve_load's launcher).
SHARED_SCRIPTS = ("serve_load",)


class BenchmarkHelpers(importlib.abc.MetaPathFinder):
    """Find ``_NAME`` (a top-level import) as ``benchmarks/_NAME.py``, and nothing else."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if path is not None or "." in fullname:
            return None
        if not fullname.startswith("_") and fullname not in SHARED_SCRIPTS:
            return None
        file = BENCHMARKS / f"{fullname}.py"
        if not file.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def _install_finder() -> None:
    if not any(isinstance(f, BenchmarkHelpers) for f in sys.meta_path):
        sys.meta_path.append(BenchmarkHelpers())


def benchmark_helper(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py``, a shared helper (``_servers``), by its plain name."""
    assert name.startswith("_"), f"{name}: only benchmarks' _-prefixed helpers are shared"
    _install_finder()
    return importlib.import_module(name)


def load_benchmark(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` (a script, not a package module) as a module; ``name``
    may name a study (``studies/data_size``). Its helpers resolve as in a script run.

    Registered in ``sys.modules`` first: dataclasses resolve annotations through it.
    """
    _install_finder()
    module_name = "bench_" + name.replace("/", "_")
    spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None, f"benchmarks/{name}.py not found"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
