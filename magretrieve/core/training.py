"""The training settings, torch-free: :class:`TrainConfig`, declared once.

Training needs torch (:mod:`magretrieve.train`); its settings do not. Each setting is a field
made by :func:`magretrieve.core.options.option`: its default, bounds and, for the settings
``magretrieve train`` offers, its flag and help sit in one declaration, from which the
command derives its options (:mod:`magretrieve.cli._options`) and the config checks its own
values (the same error line from Python and from the command line). Living here, below every
layer, the settings are read by the trainer, by ``diagnose``'s probe trainings and by the
command line without importing torch (``magretrieve train --help`` stays torch-free).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from magretrieve.core.errors import ConfigError
from magretrieve.core.options import OptionClass, option

__all__ = ["PRECISIONS", "TASKS", "TrainConfig"]

TASKS = ("retrieval", "symmetric")
PRECISIONS = ("fp32", "bf16")


def _positive(help: str, default: float, flag: str | None = None) -> Any:
    """A setting that is a positive finite number: a learning rate, the logit scale, a clip."""
    return option(help, default=default, flag=flag, minimum=0, exclusive_minimum=True)


@dataclass
class TrainConfig(OptionClass):
    """Training settings; defaults follow the paper where it states them (scale 20, AdamW, clip 1).

    ``hard_negatives`` are taken from ``TrainingPair.negatives``. ``force`` trains a one-sided
    mode on a symmetric task anyway (``magretrieve train --force`` also lets the run overwrite
    a non-empty ``--out``). ``gamma_lr`` is learnable
    γ's own rate: at the encoder's rate the paper's γ stayed at 0.5. ``head_lr`` is the rate of
    a document norm head (:mod:`magretrieve.train.heads`): a zero-initialized head at the
    encoder's rate barely moves. ``precision="bf16"`` runs the forward passes under autocast:
    CPUs with bf16 matrix units (Intel AMX, avx512_bf16 on recent Xeons) run bf16 matmuls at
    roughly twice the fp32 throughput or more, while master weights, the optimizer, the side
    normalization and the loss stay float32; "fp32" stays the default because it is exactly
    reproducible. Every value is checked against its declaration when the config is made
    (and again by :meth:`validate` when training starts).
    """

    # The settings without help text here have none on the command line either.
    epochs: int = option("", default=3, flag="--epochs", minimum=1)
    batch_size: int = option("", default=32, flag="--batch-size", minimum=2)  # in-batch negatives
    lr: float = _positive("", 2e-5, "--lr")
    gamma_lr: float = _positive("Learning rate of learnable γ.", 5e-2, "--gamma-lr")
    scale: float = _positive("Logit scale 1/τ.", 20.0, "--scale")
    warmup_ratio: float = option(
        "Share of the steps the learning rate warms up over, in [0, 1).", default=0.1, minimum=0
    )
    weight_decay: float = option("AdamW weight decay of the encoder.", default=0.01, minimum=0)
    max_grad_norm: float = _positive("Gradient norm clip.", 1.0)
    seed: int = option("", default=42, flag="--seed")
    hard_negatives: int = option(
        "Hard negatives per pair (from the pair file, or mined).",
        default=0,
        flag="--hard-negatives",
        minimum=0,
    )
    task: str = option("", default="retrieval", flag="--task", choices=TASKS)
    force: bool = option(
        "Train a one-sided mode on a symmetric task anyway, or overwrite --out.",
        default=False,
        flag="--force",
    )
    max_steps: int | None = option("", flag="--max-steps", minimum=1)
    log_every: int = option(
        "Log a step record every this many steps (loss, γ, norms, gradient norm).",
        default=1,
        minimum=1,
    )
    eval_every: int | None = option(
        "Validate every this many steps (None: at the end of each epoch).", minimum=1
    )
    #: Train only these parameters' name prefixes (e.g. a norm head); None trains everything.
    trainable: list[str] | None = None
    head_lr: float = _positive("Learning rate of the norm head.", 1e-3, "--head-lr")
    precision: str = option(
        "Forward-pass precision. bf16 (autocast; weights and optimizer stay fp32) is about 2x "
        "faster on CPUs with AMX/avx512_bf16; fp32 is exactly reproducible.",
        default="fp32",
        flag="--precision",
        choices=PRECISIONS,
    )
    mini_batch_size: int | None = option(
        "Cached contrastive loss (GradCache): embed each batch in mini-batches of this many "
        "texts; same gradient, one mini-batch's activations in memory.",
        flag="--mini-batch-size",
        minimum=1,
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every setting against its declaration (a config is mutable: training checks
        it again when it starts); one error line naming the setting."""
        self.check_declared()
        if self.warmup_ratio >= 1:
            raise ConfigError(f"warmup_ratio must lie in [0, 1), got {self.warmup_ratio}")
