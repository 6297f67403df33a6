"""The local database servers of ``benchmarks/_servers.py``, for the test fixtures: one
launcher for the tests and the store benchmarks."""

from __future__ import annotations

import sys
from pathlib import Path

_BENCHMARKS = str(Path(__file__).resolve().parents[1] / "benchmarks")
if _BENCHMARKS not in sys.path:  # the folder holds no `magretrieve`: nothing is shadowed
    sys.path.append(_BENCHMARKS)

from _servers import chroma_server, free_ports, milvus_server  # noqa: E402

__all__ = ["chroma_server", "free_ports", "milvus_server"]
