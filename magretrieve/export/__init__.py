"""Export a magretrieve encoder to ONNX: a query graph, a document graph and a manifest.

Installed as ``magretrieve.export``; needs the ``train`` extra (torch, onnx, onnxscript).
Serving the result needs only ``magretrieve[serve]`` (see :mod:`magretrieve.serving.onnx_encoder`).
"""

from __future__ import annotations

from magretrieve.export.build import export_model

__all__ = ["export_model"]
