"""ScaNN's AVX2 kernels, switched on where ScaNN's own CPU check misses them.

ScaNN picks its SIMD kernels (the LUT16 scan of quantized codes, the float re-scoring) from
flags its library sets when it loads, from its own CPUID check. On some virtual machines that
check answers "no AVX2" although the CPU and the OS both have it (seen on 2-core AMD EPYC
and Intel Xeon VMs exposing AVX2, FMA, AVX-512 and the AVX register state), and every search
then runs the SSE4 kernels: the same hits for more CPU per query
(``benchmarks/results/scann_kernels.md``).

numpy's runtime dispatch check (CPUID and XGETBV, the one its own kernels rely on) is
trusted instead: when numpy finds AVX2 and FMA3, ScaNN's ``should_use_avx2`` flag is switched
on before any searcher is built or loaded. AVX-512 stays as ScaNN chose (ScaNN ships it as
experimental). ``MAGRETRIEVE_SCANN_AVX2=0`` leaves ScaNN's own choice.

This reaches into ScaNN's library by symbol name with ``ctypes`` because ScaNN offers no
Python switch; a ScaNN build without the symbol is left alone.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

logger = logging.getLogger(__name__)

#: ScaNN's flag (a C++ ``bool`` in its pybind library) that selects the AVX2/FMA kernels.
AVX2_SYMBOL = "_ZN14research_scann14flags_internal15should_use_avx2E"
#: Set to ``0`` to keep the kernels ScaNN chose itself.
ENV = "MAGRETRIEVE_SCANN_AVX2"

_state: str | None = None


def cpu_has_avx2() -> bool:
    """AVX2 and FMA3 usable here, by numpy's runtime check (CPU and OS support)."""
    import importlib

    try:
        umath = importlib.import_module("numpy._core._multiarray_umath")
    except ImportError:  # pragma: no cover - numpy < 2
        umath = importlib.import_module("numpy.core._multiarray_umath")
    features: dict[str, bool] = getattr(umath, "__cpu_features__", {})
    return bool(features.get("AVX2")) and bool(features.get("FMA3"))


def _flag() -> ctypes.c_bool | None:
    """ScaNN's flag in its loaded library, or None (not loaded, or another build)."""
    module = sys.modules.get("scann_pybind")
    path = getattr(module, "__file__", None)
    if not path:
        return None
    try:
        return ctypes.c_bool.in_dll(ctypes.CDLL(path), AVX2_SYMBOL)
    except (OSError, ValueError):
        return None


def ensure_avx2() -> str:
    """Which kernels ScaNN searches with after the check: ``avx2`` (ScaNN found it),
    ``avx2 (switched on)``, ``sse4`` or ``unknown`` (no flag to read). Call after ScaNN's
    module is imported; the answer is computed once per process."""
    global _state
    if _state is not None:
        return _state
    flag = _flag()
    if flag is None:
        _state = "unknown"
    elif flag.value:
        _state = "avx2"
    elif os.environ.get(ENV, "1") != "0" and cpu_has_avx2():
        flag.value = True
        _state = "avx2 (switched on)"
        logger.debug("ScaNN's CPU check missed AVX2 that numpy finds; its AVX2 kernels are on")
    else:
        _state = "sse4"
    return _state
