"""The server's encoder: ``OnnxEncoder`` whose onnxruntime sessions do not spin between runs.

onnxruntime's intra-op threads spin-wait for work after each parallel section by default,
which is fastest when nothing else wants the cores. In the server something always does: the
event loop parses requests and writes answers while the batcher's graph runs, and on a small
machine spinning threads take its time slices. ``spinning=False`` (the server's default,
``--onnx-spinning`` to turn it back on) sets ``session.intra_op.allow_spinning=0``; everything
else is the session :class:`~magretrieve.serving.runtime.OnnxEncoder` opens.
"""

from __future__ import annotations

from typing import Any

from magretrieve.core.errors import ManifestError
from magretrieve.serving.runtime import PROVIDERS, RUNTIMES, OnnxEncoder


class ServingEncoder(OnnxEncoder):
    """An :class:`OnnxEncoder` with a choice of onnxruntime thread spinning."""

    #: Whether onnxruntime's intra-op threads spin-wait (onnxruntime's own default: True).
    spinning: bool = False

    def _open_session(self, side: str) -> Any:
        if self.spinning or RUNTIMES[self.runtime][0] != "onnxruntime":
            return super()._open_session(side)
        import onnxruntime as ort

        path = self.manifest.path(side)
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        providers: list[Any] = [PROVIDERS["cpu"]]
        if self.device == "cuda":
            providers.insert(0, (PROVIDERS["cuda"], {"use_tf32": 0}))
        try:
            return ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ManifestError(f"{path}: onnxruntime cannot load the graph ({exc})") from None
