"""The training settings, declared once and torch-free: defaults, checks, conversions."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import asdict, replace

import numpy as np
import pytest

from magretrieve.core.errors import ConfigError
from magretrieve.core.training import TrainConfig


def test_defaults_are_the_declared_ones() -> None:
    cfg = TrainConfig()
    assert (cfg.epochs, cfg.batch_size, cfg.lr, cfg.gamma_lr, cfg.scale) == (
        3,
        32,
        2e-5,
        5e-2,
        20.0,
    )
    assert (cfg.warmup_ratio, cfg.weight_decay, cfg.max_grad_norm, cfg.seed) == (0.1, 0.01, 1.0, 42)
    assert (cfg.hard_negatives, cfg.task, cfg.force, cfg.max_steps) == (0, "retrieval", False, None)
    assert (cfg.log_every, cfg.eval_every, cfg.trainable, cfg.head_lr) == (1, None, None, 1e-3)
    assert (cfg.precision, cfg.mini_batch_size) == ("fp32", None)
    for declared in TrainConfig.declared():
        assert getattr(cfg, declared.name) == declared.default, declared.name
    assert "trainable" not in TrainConfig.keywords()  # a list: a plain field, no option


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ({"epochs": 0}, "--epochs must be >= 1, got 0"),
        ({"batch_size": 1}, "--batch-size must be >= 2, got 1"),
        ({"lr": 0.0}, "--lr must be > 0, got 0.0"),
        ({"scale": float("inf")}, "--scale must be a finite number, got inf"),
        ({"hard_negatives": -1}, "--hard-negatives must be >= 0, got -1"),
        ({"max_steps": 0}, "--max-steps must be >= 1, got 0"),
        ({"task": "sts"}, "--task must be one of retrieval, symmetric, got 'sts'"),
        ({"precision": "fp16"}, "--precision must be one of fp32, bf16, got 'fp16'"),
        ({"force": "yes"}, "--force must be true or false, got 'yes'"),
        ({"log_every": 0}, "log_every must be >= 1, got 0"),  # Python-only: named by keyword
        ({"weight_decay": -0.1}, "weight_decay must be >= 0, got -0.1"),
        ({"warmup_ratio": 1.0}, "warmup_ratio must lie in [0, 1), got 1.0"),
        ({"warmup_ratio": -0.5}, "warmup_ratio must be >= 0, got -0.5"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(given: dict, says: str) -> None:
    with pytest.raises(ConfigError) as bad:
        TrainConfig(**given)
    assert str(bad.value) == says


def test_values_are_converted_and_a_changed_config_is_checked_again() -> None:
    cfg = TrainConfig(epochs=np.int64(2), lr=1, batch_size="8")  # type: ignore[arg-type]
    assert (cfg.epochs, cfg.lr, cfg.batch_size) == (2, 1.0, 8)
    assert type(cfg.epochs) is int and type(cfg.lr) is float
    assert asdict(cfg)["lr"] == 1.0  # what a training log records
    assert replace(cfg, hard_negatives=2).hard_negatives == 2
    with pytest.raises(ConfigError, match="--hard-negatives must be >= 0"):
        replace(cfg, hard_negatives=-2)
    cfg.epochs = 0  # a config is mutable; training checks it again when it starts
    with pytest.raises(ConfigError, match="--epochs must be >= 1, got 0"):
        cfg.validate()


def test_the_settings_import_no_torch() -> None:
    code = (
        "import sys, magretrieve\n"
        "from magretrieve.core.training import TrainConfig\n"
        "assert magretrieve.TrainConfig is TrainConfig\n"
        "TrainConfig(epochs=1)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
