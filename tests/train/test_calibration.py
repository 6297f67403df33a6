"""Norm calibration: c = mean raw document norm, stored in the config, carried by the export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from magretrieve.core.errors import DataError
from magretrieve.train.calibration import calibrate, mean_document_norm
from magretrieve.train.encoder import Encoder

DOCS = [
    "statins reduce heart risk in patients",
    "cancer cell protein gene",
    "wing flow over the plane at high speed",
    "vitamin dose and blood pressure study",
    "smoking and lung cancer",
    "the brain of the mouse",
]


def test_c_is_the_mean_raw_norm_and_divides_vectors(tiny_model_dir: Path) -> None:
    enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    raw = enc.embed(DOCS, "document")
    expected = float(np.linalg.norm(raw, axis=1).mean())
    assert expected > 1.5  # a random BERT's raw norms are far from 1
    c = calibrate(enc, DOCS + DOCS[:2])  # duplicates do not count twice
    assert c == pytest.approx(expected, rel=1e-6)
    assert enc.config.norm_scale == c
    # after calibration: same directions, norms divided by c, mean stored norm exactly 1
    stored = enc.encode_documents(DOCS)
    np.testing.assert_allclose(stored, raw / c, rtol=1e-5, atol=1e-6)
    assert np.linalg.norm(stored, axis=1).mean() == pytest.approx(1.0, rel=1e-5)
    # queries are unit-norm under qnorm whatever c is
    np.testing.assert_allclose(np.linalg.norm(enc.encode_queries(DOCS), axis=1), 1.0, atol=1e-6)
    # measuring again on the calibrated encoder still measures the raw encoder
    assert mean_document_norm(enc, DOCS) == pytest.approx(expected, rel=1e-6)


def test_sampling_is_seeded_and_empty_refused(tiny_model_dir: Path) -> None:
    enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    a = mean_document_norm(enc, DOCS, sample=3, seed=7)
    assert a == mean_document_norm(enc, DOCS, sample=3, seed=7)
    with pytest.raises(DataError):
        mean_document_norm(enc, [])


def test_calibration_ignores_the_head(tiny_model_dir: Path) -> None:
    plain = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    headed = Encoder.load(tiny_model_dir, "qnorm", norm_head="linear", device="cpu")
    assert calibrate(headed, DOCS) == pytest.approx(mean_document_norm(plain, DOCS), rel=1e-6)
    assert headed.norm_head is not None


def test_calibrated_scale_round_trips_through_save_and_export(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from magretrieve.core.manifest import Manifest
    from magretrieve.export.build import export_model
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    enc = Encoder.load(tiny_model_dir, "qnorm", device="cpu")
    raw_norms = np.linalg.norm(enc.embed(DOCS, "document"), axis=1)
    c = calibrate(enc, DOCS)
    back = Encoder.load(enc.save(tmp_path / "run"), device="cpu")
    assert back.config.norm_scale == c
    out = export_model(back, tmp_path / "exp", exporter="torchscript")
    manifest = Manifest.load(out)
    assert manifest.norm_scale == pytest.approx(c, rel=1e-7)
    onnx = OnnxEncoder.load(out)
    onnx_docs = onnx.encode_documents(DOCS)
    np.testing.assert_allclose(onnx_docs, back.encode_documents(DOCS), atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(onnx_docs, axis=1), raw_norms / c, rtol=1e-4)
