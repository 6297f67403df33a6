"""The norm head as a typed spec inside EncoderConfig, and its unchanged JSON form on disk."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from magretrieve.core.config import EncoderConfig
from magretrieve.core.errors import ConfigError
from magretrieve.core.norm_head import NormHeadSpec, head_spec

#: A run's magretrieve_config.json as `train --norm-head mlp --freeze-encoder
#: --calibrate-scale` writes it from a sentence-transformers model with a Normalize stage.
ON_DISK = {
    "mode": "qnorm",
    "gamma_q": 1.0,
    "gamma_d": 0.0,
    "pooling": "mean",
    "max_query_length": 128,
    "max_document_length": 256,
    "query_prefix": "",
    "document_prefix": "",
    "norm_scale": 2.5,
    "norm_head": "mlp",
    "norm_head_hidden": 8,
    "norm_head_bound": 3.0,
    "base_model": "tiny",
    "version": 1,
    "extra": {
        "removed_normalize": True,
        "frozen_encoder": True,
        "norm_calibration": {"c": 2.5, "documents": 10},
    },
}


def test_the_flat_fields_and_the_frozen_flag_read_as_one_typed_spec() -> None:
    cfg = EncoderConfig.from_dict(json.loads(json.dumps(ON_DISK)))
    assert cfg.head == NormHeadSpec(kind="mlp", hidden=8, bound=3.0, frozen_encoder=True)
    assert cfg.head.enabled
    assert cfg.extra == {"removed_normalize": True, "norm_calibration": {"c": 2.5, "documents": 10}}
    # written back: the same keys in the same order, byte for byte
    assert json.dumps(cfg.to_dict()) == json.dumps(ON_DISK)


def test_no_head_writes_the_defaults_and_no_flag() -> None:
    data = EncoderConfig().to_dict()
    assert (data["norm_head"], data["norm_head_hidden"], data["norm_head_bound"]) == (
        "none",
        64,
        0.0,
    )
    assert data["extra"] == {}
    assert list(data) == [
        "mode", "gamma_q", "gamma_d", "pooling", "max_query_length", "max_document_length",
        "query_prefix", "document_prefix", "norm_scale", "norm_head", "norm_head_hidden",
        "norm_head_bound", "base_model", "version", "extra",
    ]  # fmt: skip
    assert EncoderConfig.from_dict(data).head == NormHeadSpec()


def test_the_option_names_set_the_spec() -> None:
    cfg = EncoderConfig(mode="qnorm")
    cfg.norm_head, cfg.norm_head_hidden, cfg.norm_head_bound = "linear", 5, 1.5
    assert cfg.head == NormHeadSpec("linear", 5, 1.5)
    assert (cfg.norm_head, cfg.norm_head_hidden, cfg.norm_head_bound) == ("linear", 5, 1.5)


@pytest.mark.parametrize(
    ("head", "needle"),
    [
        (NormHeadSpec("quadratic"), "unknown norm head 'quadratic'"),
        (NormHeadSpec("mlp", hidden=0), "norm_head_hidden must be at least 1"),
        (NormHeadSpec("linear", bound=-1.0), "norm_head_bound must be 0"),
    ],
)
def test_a_bad_spec_is_refused(head: NormHeadSpec, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        EncoderConfig(mode="qnorm", head=head).validate()


def test_a_head_needs_a_mode_that_keeps_document_magnitude() -> None:
    with pytest.raises(ConfigError, match="a norm head needs a mode that keeps document"):
        EncoderConfig(mode="cosine", head=NormHeadSpec("linear")).validate()


def test_log_magnitude_and_manifest_entry_by_hand() -> None:
    weights = {"out.weight": np.array([[2.0, -1.0]]), "out.bias": np.array([0.5])}
    unit = np.array([[1.0, 0.0], [0.6, 0.8]])
    # g = 2·x − y + 0.5: 2.5 and 1.2 − 0.8 + 0.5 = 0.9; bounded by 1: tanh(g)
    np.testing.assert_allclose(NormHeadSpec("linear").log_magnitude(unit, weights), [2.5, 0.9])
    bounded = NormHeadSpec("linear", bound=1.0).log_magnitude(unit, weights)
    np.testing.assert_allclose(bounded, [math.tanh(2.5), math.tanh(0.9)])
    assert NormHeadSpec("mlp", hidden=4, bound=2.0).manifest_entry() == head_spec("mlp", 4, 2.0)
    assert NormHeadSpec("mlp", hidden=4).manifest_entry()["hidden"] == 4
