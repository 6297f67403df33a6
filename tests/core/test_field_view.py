"""FieldView: the manifest's encoder settings and the config's norm-head names read one owner."""

from __future__ import annotations

import pytest

from magretrieve.core.config import EncoderConfig
from magretrieve.core.field_view import FieldView
from magretrieve.core.manifest import Manifest
from magretrieve.core.norm_head import NormHeadSpec


def _manifest(encoder: EncoderConfig) -> Manifest:
    return Manifest(
        encoder=encoder, dimension=4, graphs={}, tokenizer="t", files={}, model_fingerprint="f"
    )


def test_manifest_views_read_the_encoder_and_refuse_writes() -> None:
    enc = EncoderConfig(mode="qnorm", gamma_q=1.0, gamma_d=0.0, query_prefix="q: ")
    m = _manifest(enc)
    assert (m.mode, m.gamma_d, m.query_prefix, m.max_document_length) == ("qnorm", 0.0, "q: ", 256)
    enc.query_prefix = "query: "
    assert m.query_prefix == "query: "  # a view, not a copy
    with pytest.raises(AttributeError, match="read-only view of encoder.mode"):
        m.mode = "cosine"  # type: ignore[misc]
    assert m.mode == "qnorm" and "mode" not in vars(m)


def test_config_head_names_replace_the_head() -> None:
    cfg = EncoderConfig(mode="qnorm", gamma_q=1.0, gamma_d=0.0)
    before = cfg.head
    cfg.norm_head, cfg.norm_head_hidden, cfg.norm_head_bound = "mlp", 8, 2.5
    assert cfg.head == NormHeadSpec(kind="mlp", hidden=8, bound=2.5)
    assert before == NormHeadSpec()  # replaced, never mutated in place
    assert (cfg.norm_head, cfg.norm_head_hidden, cfg.norm_head_bound) == ("mlp", 8, 2.5)


def test_the_class_attribute_is_the_view() -> None:
    view = Manifest.__dict__["gamma_q"]
    assert isinstance(view, FieldView) and Manifest.gamma_q is view
    assert (view.holder, view.field, view.name) == ("encoder", "gamma_q", "gamma_q")
