"""Fixtures of the server tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tiny_model_dir) -> Path:
    """A qnorm export of the tiny model, once per module; its folder is named ``export``,
    the model id the server shows."""
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("serve") / "export"
    export_model(tiny_model_dir, out, mode="qnorm", exporter="torchscript", overwrite=True)
    return out
