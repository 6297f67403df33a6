"""The export's ONNX graphs run by OpenVINO instead of onnxruntime (``runtime="openvino"``).

OpenVINO reads the same ``query.onnx``/``document.onnx`` files, onnxruntime's fused operators
included, so an fp32 export folder serves on either runtime without re-exporting. Where it
helps: documents in fp32 a little faster than onnxruntime with the same vectors, and in bf16
(CPUs with AVX512-BF16 or AMX) much faster with vectors within rounding of fp32; and it is
the only runtime of static int8 exports (OpenVINO IR, ``export --quantize int8-static``),
the fastest on documents. Measured in ``benchmarks/results/encode_speed.md`` and
docs/export.md, "Runtimes".

:class:`OpenVinoSession` offers the three calls :class:`~magretrieve.serving.onnx_encoder.OnnxEncoder` makes
of an onnxruntime session (``get_inputs``, ``get_outputs``, ``run``), so the encoder's
batching, probing and pipelines stay one code path. OpenVINO is an optional extra
(``pip install 'magretrieve[openvino]'``), imported only when this runtime is asked for.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError, ManifestError, first_line
from magretrieve.core.extras import require

#: Inference precisions this runtime offers, and OpenVINO's name for each. fp32 is forced:
#: OpenVINO's CPU default on bf16-capable CPUs is bf16, which would silently change vectors.
PRECISIONS = {"fp32": "f32", "bf16": "bf16"}


@dataclass(frozen=True)
class _Port:
    """What ``get_inputs()``/``get_outputs()`` return: a named graph port, as onnxruntime's."""

    name: str


def import_openvino() -> Any:
    """``openvino``, or a one-line MissingExtra saying which extra installs it."""
    return require("openvino", what="runtime 'openvino'")


def bf16_native() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX), as OpenVINO reports it."""
    return "BF16" in import_openvino().Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


class OpenVinoSession:
    """One compiled graph; thread-safe (each calling thread gets its own infer request)."""

    def __init__(self, path: str | Path, *, threads: int, precision: str = "fp32") -> None:
        if precision not in PRECISIONS:
            raise ConfigError(
                f"unknown precision {precision!r} for OpenVINO; choose one of "
                f"{', '.join(PRECISIONS)}"
            )
        if precision == "bf16" and not bf16_native():
            raise ConfigError(
                "precision bf16: this CPU has no native bf16 (AVX512-BF16 or AMX); use fp32"
            )
        core = import_openvino().Core()
        try:
            self._compiled = core.compile_model(
                str(path),
                "CPU",
                {
                    "INFERENCE_PRECISION_HINT": PRECISIONS[precision],
                    "INFERENCE_NUM_THREADS": threads,
                    "NUM_STREAMS": 1,
                    "PERFORMANCE_HINT": "LATENCY",
                },
            )
        except Exception as exc:  # OpenVINO raises RuntimeError subclasses of its own
            raise ManifestError(
                f"{path}: OpenVINO cannot load the graph ({first_line(exc)})"
            ) from None
        self.precision = precision
        self._inputs = [_Port(p.get_any_name()) for p in self._compiled.inputs]
        self._outputs = [_Port(p.get_any_name()) for p in self._compiled.outputs]
        self._local = threading.local()

    def get_inputs(self) -> list[_Port]:
        return list(self._inputs)

    def get_outputs(self) -> list[_Port]:
        return list(self._outputs)

    def run(self, output_names: list[str] | None, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Outputs named ``output_names`` (None: all), as onnxruntime's ``run`` returns them."""
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self._compiled.create_infer_request()
        request.infer(feed)
        names = output_names or [p.name for p in self._outputs]
        # copies: the request reuses its output buffers on the next call
        return [np.array(request.get_tensor(name).data, copy=True) for name in names]
