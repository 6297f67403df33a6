"""Exports of the tiny BERT, made once per test session and shared by the modules that need one."""

from __future__ import annotations

from pathlib import Path

import pytest


def tiny_export_dir(
    tmp_path_factory: pytest.TempPathFactory,
    model_dir: Path,
    mode: str = "qnorm",
    name: str | None = None,
) -> Path:
    """Export ``model_dir`` once per test session (TorchScript exporter: ~2 s, not ~20 s).

    Cached by name under the session's base temp folder, so the reliability test modules
    (bad input, crash safety, concurrency, network) share one export.
    """
    from magretrieve.export import export_model

    out = tmp_path_factory.getbasetemp() / "reliability-exports" / (name or mode)
    if not (out / "magretrieve.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        export_model(model_dir, out, mode=mode, exporter="torchscript", overwrite=True)
    return out
