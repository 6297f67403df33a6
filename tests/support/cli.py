"""The ``magretrieve`` CLI in process, with every export replaced by a :class:`FakeEncoder`."""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result

from magretrieve.cli import main
from tests.support.fake_encoder import FakeEncoder


@pytest.fixture
def use_fake(monkeypatch):
    """Make every Retriever.load use a FakeEncoder; returns a setter for its fingerprint."""
    state = {"fingerprint": "a" * 64, "mode": "qnorm", "fail_after": None, "dim": 24}

    def load(export_dir, threads=None, device="cpu", runtime=None):
        enc = FakeEncoder(state["mode"], state["fingerprint"], state["dim"])
        enc.fail_after = state["fail_after"]
        state.setdefault("encoders", []).append(enc)
        return enc

    monkeypatch.setattr("magretrieve.serving.retriever.load_encoder", load)
    return state


def run(*args: str) -> Result:
    """``magretrieve ARGS`` through click's test runner (exceptions caught, in the result)."""
    return CliRunner().invoke(main, list(args), catch_exceptions=True)
