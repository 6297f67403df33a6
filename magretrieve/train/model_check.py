"""Check that a model folder's ``config.json`` describes the weights stored beside it.

Hugging Face builds the network from ``config.json`` and then fills it from the safetensors
files: a config edited by hand (``hidden_size``, ``num_hidden_layers``, ``vocab_size``)
either fails deep inside ``from_pretrained`` with a multi-page report, or, for layers the
weights lack, silently starts them from random numbers (or drops the layers it lacks).
Tensors of heads outside the base model (``cls.*`` of a masked-LM checkpoint) are ignored,
as ``from_pretrained`` ignores them. This check compares the tensor
shapes the config implies with the shapes in the safetensors headers (no weights are read)
and refuses a disagreement in one line naming the folder and the first tensor at fault.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from magretrieve.core.errors import ConfigError

#: Tensors a checkpoint may lack without harm: the pooler head is unused by mean/CLS pooling
#: and many sentence-embedding checkpoints ship without it.
OPTIONAL_PREFIXES = ("pooler.",)


def _header_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from one safetensors file's JSON header."""
    with path.open("rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    return {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}


def stored_shapes(folder: Path) -> dict[str, tuple[int, ...]] | None:
    """Shapes of every tensor in the folder's safetensors files (None: nothing to check)."""
    files = sorted(folder.glob("*.safetensors"))
    files = [f for f in files if f.name != "norm_head.safetensors"]
    if not files:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for path in files:
        try:
            shapes.update(_header_shapes(path))
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return None  # unreadable or corrupt: the loader names that file itself
    return shapes


def check_config_matches_weights(folder: Path) -> None:
    """Refuse a model folder whose ``config.json`` does not describe its weights."""
    import torch
    from transformers import AutoConfig, AutoModel

    stored = stored_shapes(folder)
    if stored is None:
        return
    config = AutoConfig.from_pretrained(str(folder))
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    prefix = f"{model.base_model_prefix}." if model.base_model_prefix else ""
    found = {
        (k[len(prefix) :] if prefix and k.startswith(prefix) else k): shape
        for k, shape in stored.items()
    }
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    for name, shape in expected.items():
        have = found.get(name)
        if have is not None and have != shape:
            raise ConfigError(
                f"{folder}: config.json disagrees with the weights: {name} is "
                f"{list(have)} in the safetensors file but {list(shape)} by config.json "
                "(was config.json edited or copied from another model?)"
            )
    # buffers (``position_ids``) are rebuilt from the config: old checkpoints store them
    buffers = {k for k, _ in model.named_buffers()}
    missing = [
        k
        for k in expected
        if k not in found and k not in buffers and not k.startswith(OPTIONAL_PREFIXES)
    ]
    children = {name for name, _ in model.named_children()}
    extra = [
        k
        for k in found
        if k not in expected and k not in buffers and k.split(".", 1)[0] in children
    ]
    if extra:
        raise ConfigError(
            f"{folder}: config.json disagrees with the weights: {len(extra)} tensor(s) in the "
            f"safetensors files have no place in the model config.json describes (first: "
            f"{extra[0]}); they would be dropped"
        )
    if missing:
        raise ConfigError(
            f"{folder}: config.json disagrees with the weights: {len(missing)} tensor(s) the "
            f"config needs are not in the safetensors files (first: {missing[0]}); "
            "they would start from random values"
        )
