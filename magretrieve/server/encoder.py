"""The server's encoder: ``OnnxEncoder`` with a choice of onnxruntime thread spinning.

onnxruntime's intra-op threads spin-wait for work after each parallel section by default. On a
replica that owns its cores that is the faster choice: the batcher runs graph after graph, and
threads that are already awake start the next one at once (measured in
``benchmarks/results/serve_load.md``, docs/serve.md). Where other processes share the cores (a
database on the same host, several replicas), spinning threads take their time slices and the
event loop's too; ``spinning=False`` (``--no-onnx-spinning``) sets
``session.intra_op.allow_spinning=0`` so the threads sleep between runs.
"""

from __future__ import annotations

from typing import Any

from magretrieve.serving.runtime import OnnxEncoder

#: onnxruntime's session config key for intra-op thread spinning.
SPINNING_KEY = "session.intra_op.allow_spinning"


class ServingEncoder(OnnxEncoder):
    """An :class:`OnnxEncoder` whose onnxruntime sessions spin or sleep between runs."""

    #: Whether onnxruntime's intra-op threads spin-wait (onnxruntime's own default: True).
    spinning: bool = True

    def _session_options(self) -> Any:
        options = super()._session_options()
        options.add_session_config_entry(SPINNING_KEY, "1" if self.spinning else "0")
        return options
