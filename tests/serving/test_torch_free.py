"""Serving in an environment with only ``magretrieve[serve]``: no torch, no transformers.

Skipped unless ``MAGRETRIEVE_SERVING_EXPORT`` names an export folder made by
``tests/serving/produce_export.py`` (``scripts/check_serving.sh`` does both steps).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

EXPORT = os.environ.get("MAGRETRIEVE_SERVING_EXPORT")
pytestmark = pytest.mark.skipif(
    not EXPORT, reason="set MAGRETRIEVE_SERVING_EXPORT (scripts/check_serving.sh)"
)


def test_environment_has_no_torch_or_transformers() -> None:
    if os.environ.get("MAGRETRIEVE_SERVING_REQUIRE_NO_TORCH") != "1":
        pytest.skip("not running in the serve-only venv")
    assert importlib.util.find_spec("torch") is None
    assert importlib.util.find_spec("transformers") is None


def test_onnx_encoder_matches_pytorch_reference() -> None:
    import magretrieve
    from magretrieve import OnnxEncoder

    folder = Path(EXPORT)
    texts = json.loads((folder.parent / "texts.json").read_text())
    expected = np.load(folder.parent / "expected.npz")
    enc = OnnxEncoder.load(folder, threads=1)
    assert enc.similarity.mode == "qnorm" and magretrieve.MODES
    np.testing.assert_allclose(enc.encode_queries(texts), expected["queries"], atol=1e-5)
    np.testing.assert_allclose(enc.encode_documents(texts), expected["documents"], atol=1e-5)
    assert "torch" not in sys.modules and "transformers" not in sys.modules


def test_tampered_export_refused(tmp_path: Path) -> None:
    from magretrieve import ManifestError, OnnxEncoder

    copy = shutil.copytree(EXPORT, tmp_path / "copy")
    (copy / "tokenizer.json").write_text((copy / "tokenizer.json").read_text() + " ")
    with pytest.raises(ManifestError, match="tokenizer.json"):
        OnnxEncoder.load(copy)
