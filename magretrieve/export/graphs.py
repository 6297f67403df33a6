"""Turning an :class:`~magretrieve.train.encoder.Encoder` into one ONNX graph per side.

The wrapped module calls the encoder's own ``forward`` (transformer + pooling + /norm_scale)
and ``side_vectors`` (``x/‖x‖^γ`` via :func:`magretrieve.train.torch_similarity.partial_normalize_torch`),
so the graph computes exactly what the PyTorch encoder computes, and anything the encoder
adds on a side later (a norm head) flows into the graph without changes here.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from magretrieve.core.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from magretrieve.train.encoder import Encoder

logger = logging.getLogger(__name__)

OUTPUT_NAME = "sentence_embedding"
EXPORTERS = ("dynamo", "torchscript")
#: Opset of each exporter: 18 is the dynamo exporter's native one; the TorchScript exporter
#: is most tested at 17.
OPSETS = {"dynamo": 18, "torchscript": 17}
#: Texts traced into the graph: two lengths, so the example batch has padding and the
#: attention-mask path (not a "no padding" shortcut) is what gets exported.
EXAMPLE_TEXTS = (
    "statins reduce the risk of heart disease in patients with high blood pressure",
    "what causes cancer",
)


class SideGraph(nn.Module):
    """``encoder.side_vectors(encoder(...), side)`` with positional token inputs, for export."""

    def __init__(self, encoder: Encoder, side: str) -> None:
        super().__init__()
        if side not in ("query", "document"):
            raise ConfigError(f"side must be 'query' or 'document', got {side!r}")
        self.encoder = encoder
        self.side = side
        # If the encoder's forward learns a ``side`` argument (a side-specific head), use it.
        self._forward_takes_side = "side" in inspect.signature(encoder.forward).parameters

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        kwargs = {"side": self.side} if self._forward_takes_side else {}
        raw = self.encoder(input_ids, attention_mask, token_type_ids, **kwargs)
        return self.encoder.side_vectors(raw, self.side)


@contextlib.contextmanager
def eager_attention(encoder: Encoder) -> Iterator[str]:
    """Trace the transformer with its plain ("eager") attention, restoring the setting after.

    transformers 5 defaults to SDPA attention, whose exported pattern onnxruntime's
    transformer optimizer cannot fuse; the eager softmax(QKᵀ/√d + mask)V pattern traced by
    the TorchScript exporter fuses into one ``Attention`` operator (docs/export.md). Both
    compute the same function, and parity checks the graph either way. Yields the attention
    implementation that was traced.
    """
    transformer = getattr(encoder, "transformer", None)
    config = getattr(transformer, "config", None)
    before = getattr(config, "_attn_implementation", None)
    setter = getattr(transformer, "set_attn_implementation", None)
    if before in (None, "eager") or not callable(setter):
        yield before or "default"
        return
    try:
        setter("eager")
    except Exception as exc:  # a model without an eager path: export what it has
        logger.info("keeping %s attention for export (%s)", before, exc)
        yield before
        return
    try:
        yield "eager"
    finally:
        setter(before)


def input_names(encoder: Encoder) -> list[str]:
    """Graph inputs in ``forward`` order; token_type_ids only when the model uses them."""
    return ["input_ids", "attention_mask"] + (
        ["token_type_ids"] if encoder.uses_token_type_ids else []
    )


def example_inputs(encoder: Encoder, side: str) -> tuple[torch.Tensor, ...]:
    batch = encoder.tokenize(list(EXAMPLE_TEXTS), side)
    return tuple(batch[name].cpu() for name in input_names(encoder))


def export_side(
    encoder: Encoder, side: str, path: str | Path, exporter: str = "dynamo"
) -> dict[str, object]:
    """Write ``path`` (one self-contained .onnx file) for ``side``; return exporter facts.

    Learnable γ become constants of the graph: the encoder is in eval mode with gradients
    off, and the exporters fold ``sigmoid(logits)`` into a fixed value.
    """
    if exporter not in EXPORTERS:
        raise ConfigError(f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    path = Path(path)
    module = SideGraph(encoder, side).eval()
    names = input_names(encoder)
    args = example_inputs(encoder, side)
    opset = OPSETS[exporter]
    # The dynamo exporter logs one warning per torchvision operator it cannot register;
    # torchvision is irrelevant to text encoders, so keep that noise out of the user's console.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with torch.no_grad(), warnings.catch_warnings(), eager_attention(encoder) as attention:
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            batch = torch.export.Dim("batch")
            seq = torch.export.Dim("sequence")
            program = torch.onnx.export(
                module,
                args,
                input_names=names,
                output_names=[OUTPUT_NAME],
                dynamic_shapes={name: {0: batch, 1: seq} for name in names},
                opset_version=opset,
                dynamo=True,
                optimize=True,
                verbose=False,
            )
            program.save(str(path), external_data=False)
        else:
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=names,
                output_names=[OUTPUT_NAME],
                dynamic_axes={name: {0: "batch", 1: "sequence"} for name in names}
                | {OUTPUT_NAME: {0: "batch"}},
                opset_version=opset,
                dynamo=False,
                do_constant_folding=True,
            )
    return {"name": f"torch.onnx ({exporter})", "opset": opset, "attention": attention}
