"""The ``magretrieve`` command line: a thin layer over the Python API.

Each command lives in its own ``cmd_<name>.py`` module and registers itself on
:data:`main`; commands import torch (or onnxruntime, faiss, qdrant) only inside their body.
"""

from __future__ import annotations

import importlib
import pkgutil

from magretrieve.cli._group import main

for _info in pkgutil.iter_modules(__path__):
    if _info.name.startswith("cmd_"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["main"]
