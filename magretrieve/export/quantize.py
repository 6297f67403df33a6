"""int8 quantization and BERT graph fusion with onnxruntime's own tools.

* :func:`optimize_bert` runs ``onnxruntime.transformers.optimizer`` (attention, LayerNorm,
  GELU, embedding fusions) on BERT-like graphs; it reports which fusions applied, because
  whether they apply depends on the exporter's graph shape. The fused graph is still fp32
  and must pass the same parity check as the plain one.
* :func:`quantize_int8` applies ``quantize_dynamic`` (int8 weights, activations quantized
  per batch at run time), the recommended scheme for transformer encoders on CPU.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

from magretrieve.core.errors import ConfigError

logger = logging.getLogger(__name__)

QUANTIZATIONS = ("int8",)
#: Operators quantized to int8. The fused ``Attention`` stays fp32: quantized (QAttention) it
#: costs several times the NDCG@10 of the rest of int8 for a modest document speed-up and no
#: faster batch-1 queries (docs/export.md, "int8: which operators"). The embedding
#: (``EmbedLayerNormalization``) is quantized: it holds half the weights, and keeping it fp32
#: would double the int8 graph's size for a difference inside int8's batch-to-batch spread.
#: Unfused graphs have plain ``MatMul``/``Gather`` nodes.
INT8_OPERATORS = ("MatMul", "EmbedLayerNormalization", "Gather")
#: Model types the onnxruntime transformer optimizer knows for encoder-only models.
BERT_LIKE = {"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra", "camembert"}


def optimizer_model_type(model_type: str) -> str | None:
    """The optimizer's ``model_type`` for a Hugging Face ``config.model_type`` (None: skip)."""
    if model_type not in BERT_LIKE:
        return None
    return (
        "bert"
        if model_type in {"roberta", "xlm-roberta", "mpnet", "electra", "camembert"}
        else model_type
    )


def optimize_bert(
    src: str | Path, dst: str | Path, *, model_type: str, num_heads: int, hidden_size: int
) -> dict[str, Any]:
    """Fuse a BERT-like fp32 graph into onnxruntime's fused operators; return fusion counts.

    The optimizer works at the ONNX level (``opt_level=0`` = no runtime-specific nodes), so
    the result runs on any onnxruntime CPU build.
    """
    kind = optimizer_model_type(model_type)
    if kind is None:
        raise ConfigError(
            f"--optimize applies to BERT-like encoders ({', '.join(sorted(BERT_LIKE))}); "
            f"this model is {model_type!r}"
        )
    from onnxruntime.transformers import optimizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = optimizer.optimize_model(
            str(src),
            model_type=kind,
            num_heads=num_heads,
            hidden_size=hidden_size,
            opt_level=0,
            use_gpu=False,
        )
    stats = {k: int(v) for k, v in model.get_fused_operator_statistics().items() if v}
    model.save_model_to_file(str(dst), use_external_data_format=False)
    return {"model_type": kind, "fused_operators": stats}


def quantize_int8(
    src: str | Path, dst: str | Path, operators: tuple[str, ...] | None = INT8_OPERATORS
) -> dict[str, Any]:
    """Dynamic int8 quantization: int8 weights per output channel, uint8 activations at run time.

    Per-channel weights matter: per-tensor int8 moves vectors and document norms several times
    further from fp32 than per-channel does (docs/export.md). Only :data:`INT8_OPERATORS` are quantized: the fused attention stays
    fp32 (its quantized form cost most of int8's NDCG loss), the word-embedding table shrinks.
    ``DefaultTensorType`` lets the quantizer through fused com.microsoft operators that ONNX
    shape inference cannot type. ``operators=None`` quantizes every type the quantizer knows
    (QAttention included), as ``benchmarks/studies/int8_operators.py`` compares.
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    # quantize_dynamic logs a "consider pre-processing" hint on the root logger; the
    # pre-processing (symbolic shape inference) fails on fused graphs, and is not needed.
    root.setLevel(max(level, logging.ERROR))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            quantize_dynamic(
                model_input=str(src),
                model_output=str(dst),
                weight_type=QuantType.QInt8,
                per_channel=True,
                op_types_to_quantize=None if operators is None else list(operators),
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
    finally:
        root.setLevel(level)
    return {
        "method": "onnxruntime.quantization.quantize_dynamic",
        "weight_type": "QInt8",
        "per_channel": True,
        "operators": "all" if operators is None else list(operators),
    }
