"""The document norm head as serving sees it: its spec, its weights and ``g(d̂)`` in numpy.

A norm head gives a document vector the magnitude ``exp(g(d̂))`` from its unit vector
(``d̂ · exp(g(d̂))``). Training it needs torch (:mod:`magretrieve.train.heads`); applying a
trained head to stored unit vectors (``magretrieve rescale``) and describing it in a manifest do
not, and live here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import ConfigError

HEAD_KINDS = ("none", "linear", "mlp")
#: File holding the head's weights beside the transformer in a run folder.
HEAD_FILE = "norm_head.safetensors"
#: Hidden width of the 2-layer MLP head when none is configured.
DEFAULT_HIDDEN = 64


def check_head_config(kind: str, hidden: int, bound: float) -> None:
    """Refuse an unknown head kind, a non-positive MLP width or a negative bound."""
    if kind not in HEAD_KINDS:
        raise ConfigError(f"unknown norm head {kind!r}; choose one of {', '.join(HEAD_KINDS)}")
    if kind == "mlp" and int(hidden) < 1:
        raise ConfigError(f"norm_head_hidden must be at least 1 for an MLP head, got {hidden}")
    if not (bound >= 0 and np.isfinite(bound)):
        raise ConfigError(f"norm_head_bound must be 0 (unbounded) or positive, got {bound}")


def head_spec(kind: str, hidden: int, bound: float) -> dict[str, Any]:
    """The head as the export manifest describes it (``graphs.document.head``)."""
    spec: dict[str, Any] = {
        "kind": kind,
        "input": "unit_document_vector",
        "output": "d_hat * exp(g(d_hat))",
        "bound": float(bound) if bound > 0 else None,
        "weights": HEAD_FILE,
    }
    if kind == "mlp":
        spec["hidden"] = int(hidden)
        spec["activation"] = "silu"
    return spec


#: Key of :attr:`NormHeadSpec.frozen_encoder` in a configuration's ``extra`` on disk.
FROZEN_KEY = "frozen_encoder"


@dataclass(frozen=True)
class NormHeadSpec:
    """The document norm head of an encoder: what it is and how it was trained.

    ``kind`` is ``"none"``, ``"linear"`` or ``"mlp"`` (``hidden`` units, SiLU); ``bound`` > 0
    bounds ``g`` to ±bound via ``bound·tanh(g/bound)`` (0: unbounded). ``frozen_encoder``
    records that only the head was trained (``train --freeze-encoder``): the encoder's unit
    vectors are then the base model's, which is what lets ``rescale --head`` apply the head
    to a cosine store built by that base model.
    """

    kind: str = "none"
    hidden: int = DEFAULT_HIDDEN
    bound: float = 0.0
    frozen_encoder: bool = False

    @property
    def enabled(self) -> bool:
        return self.kind != "none"

    def validate(self) -> None:
        """Refuse an unknown kind, a non-positive MLP width or a negative bound."""
        check_head_config(self.kind, self.hidden, self.bound)

    def manifest_entry(self) -> dict[str, Any]:
        """The head as the export manifest describes it (``graphs.document.head``)."""
        return head_spec(self.kind, self.hidden, self.bound)

    def log_magnitude(self, unit: np.ndarray, weights: Mapping[str, np.ndarray]) -> np.ndarray:
        """``g(d̂)`` of unit document vectors with this head's trained ``weights``."""
        return log_magnitude_numpy(unit, weights, self.kind, self.bound)


def load_head_weights(folder: str | Path) -> dict[str, np.ndarray]:
    """The head's weights as numpy arrays (torch-free), refusing a missing file clearly."""
    from safetensors.numpy import load_file

    path = Path(folder) / HEAD_FILE
    if not path.is_file():
        raise ConfigError(
            f"{path}: missing; the config names a norm head but its weights are absent"
        )
    try:
        return load_file(str(path))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except Exception as exc:  # safetensors raises its own error type on a truncated file
        raise ConfigError(
            f"{path}: not a readable safetensors file, truncated or corrupt ({exc})"
        ) from None


def log_magnitude_numpy(
    unit: np.ndarray, weights: Mapping[str, np.ndarray], kind: str, bound: float = 0.0
) -> np.ndarray:
    """Torch-free ``g(d̂)`` for unit vectors (n, dim): same maths as the torch head."""
    x = np.asarray(unit, dtype=np.float64)
    if kind == "mlp":
        h = x @ np.asarray(weights["inner.weight"], dtype=np.float64).T + weights["inner.bias"]
        x = h / (1.0 + np.exp(-h))  # SiLU
    elif kind != "linear":
        raise ConfigError(f"unknown norm head {kind!r}")
    g: np.ndarray = (x @ np.asarray(weights["out.weight"], dtype=np.float64).T).reshape(-1) + float(
        np.asarray(weights["out.bias"]).reshape(-1)[0]
    )
    if bound > 0:
        g = bound * np.tanh(g / bound)
    return g
