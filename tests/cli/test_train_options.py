"""``magretrieve train`` derives its training flags from :class:`TrainConfig`'s declarations."""

from __future__ import annotations

import click

from magretrieve.cli import main
from magretrieve.core.training import TrainConfig
from tests.support.cli import run


def _command(name: str) -> click.Command:
    command = main.get_command(click.Context(main), name)
    assert command is not None
    return command


def test_every_flagged_setting_is_a_train_option_as_declared() -> None:
    params = {p.name: p for p in _command("train").params}
    flagged = [o for o in TrainConfig.declared() if o.flag is not None]
    assert [o.name for o in flagged] == [
        "epochs", "batch_size", "lr", "gamma_lr", "scale", "seed", "hard_negatives", "task",
        "force", "max_steps", "head_lr", "precision", "mini_batch_size",
    ]  # fmt: skip
    for o in flagged:
        param = params[o.name]
        assert isinstance(param, click.Option)
        assert param.opts == [o.flag] and param.default == o.default, o.name
        assert param.help == (o.help or None), o.name
    # unset on the command line, every setting is the config's default
    ctx = _command("train").make_context(
        "train", ["--model", "M", "--train", "T", "--out", "O"], resilient_parsing=True
    )
    assert TrainConfig(**{o.name: ctx.params[o.name] for o in flagged}) == TrainConfig()
    # diagnose's probe trainings take --seed from the same declaration
    seed = next(p for p in _command("diagnose").params if p.name == "seed")
    assert (seed.opts, seed.default) == (["--seed"], TrainConfig().seed)


def test_a_bad_setting_is_one_line_before_anything_loads(tmp_path) -> None:
    args = ["train", "--model", str(tmp_path / "no-model"), "--train", str(tmp_path / "no-data")]
    res = run(*args, "--out", str(tmp_path / "run"), "--batch-size", "1")
    assert res.exit_code == 1 and res.output.strip() == "Error: --batch-size must be >= 2, got 1"
    res = run(*args, "--out", str(tmp_path / "run"), "--lr", "-1e-5")
    assert res.exit_code == 1 and res.output.strip() == "Error: --lr must be > 0, got -1e-05"
    assert not (tmp_path / "run").exists()
