"""Static int8 for OpenVINO: NNCF post-training quantization of an export's fp32 graphs.

Why a second int8 scheme. onnxruntime's dynamic int8 (:mod:`magretrieve.export.quantize`)
quantizes activations per batch at run time and keeps the fused attention fp32, which caps
its document speed-up. NNCF's static scheme measures activation ranges once, on calibration
texts, and OpenVINO runs the whole encoder in int8 (attention products included), with
SmoothQuant and bias correction for transformers (``ModelType.TRANSFORMER``): the fastest
document encoding this package writes, for a small NDCG@10 loss
(benchmarks/results/encode_speed.md).

The result is OpenVINO IR (``query.xml``/``document.xml`` + ``.bin``), not ONNX: OpenVINO
reads the fp32 ONNX graph (onnxruntime's fused operators included), NNCF quantizes that, and
only OpenVINO runs the quantized model, so the manifest lists ``openvino`` as its runtime.
The NNCF form that stays ONNX (QDQ nodes, on the unfused graph) lost more NDCG@10 than the
export's quality budget allows, however it was calibrated, so it is not what this writes.

Fixed activation scales have a side effect worth having: a text's vector no longer depends on
which other texts share its batch (dynamic int8's per-batch scales make it depend on them).

Needs the ``openvino-int8`` extra (``openvino`` and ``nncf``), at export time only.
"""

from __future__ import annotations

import contextlib
import logging
import random
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from magretrieve.core.errors import ConfigError, DataError, MagRetrieveError, first_line
from magretrieve.core.extras import require_all
from magretrieve.core.text import blank

#: Calibration texts per side when the caller does not say (documents and queries each).
DEFAULT_CALIBRATION_SIZE = 320
#: Seed of the calibration sample, so that an export is reproducible from its inputs.
CALIBRATION_SEED = 0
#: Runtimes (magretrieve.serving.onnx_encoder.RUNTIMES) that can run a static-int8 export; the first is the
#: default. bf16 also runs it, faster but less exact.
STATIC_INT8_RUNTIMES = ("openvino", "openvino-bf16")


def import_nncf() -> tuple[Any, Any]:
    """``(nncf, openvino)``, or a one-line MissingExtra naming the extra that installs them."""
    nncf, openvino = require_all(
        ["nncf", "openvino"], what="--quantize int8-static", extra="openvino-int8"
    )
    return nncf, openvino


@dataclass(frozen=True)
class Calibration:
    """Texts that set a static-int8 graph's activation ranges, per side, and where they came from."""

    texts: dict[str, list[str]]
    #: The calibration folder's name (not its path: the manifest must not carry one machine's).
    source: str


def calibration_texts(folder: str | Path, size: int) -> Calibration:
    """Up to ``size`` documents and ``size`` queries from a BEIR-layout folder, sampled with a seed.

    Only ``corpus.jsonl`` and ``queries.jsonl`` are read (no judgements are needed), so a
    corpus the model will never be evaluated on serves as well; out-of-domain calibration is
    what the committed measurement used (cranfield for a scifact evaluation).
    """
    from magretrieve.data.readers import load_corpus, load_queries

    if size < 1:
        raise ConfigError(f"--calibration-size must be at least 1, got {size}")
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise DataError(
            f"{root}: not a folder (calibration data is a BEIR folder with corpus.jsonl "
            "and queries.jsonl)"
        )
    for name in ("corpus.jsonl", "queries.jsonl"):
        if not (root / name).is_file():
            raise DataError(f"{root / name}: missing (calibration needs documents and queries)")
    documents = [d.full_text for d in load_corpus(root / "corpus.jsonl", allow_empty=True).values()]
    documents = [t for t in documents if not blank(t)]
    queries = list(load_queries(root / "queries.jsonl").values())
    if not documents:
        raise DataError(f"{root / 'corpus.jsonl'}: every document is empty")
    rng = random.Random(CALIBRATION_SEED)
    texts = {
        "document": rng.sample(documents, min(size, len(documents))),
        "query": rng.sample(queries, min(size, len(queries))),
    }
    return Calibration(texts=texts, source=root.resolve().name)


def quantize_side(fp32_encoder: Any, side: str, texts: list[str], dst_xml: Path) -> dict[str, Any]:
    """Quantize one side's fp32 graph with NNCF, calibrated on ``texts``; write OpenVINO IR.

    Calibration feeds one text at a time, tokenized exactly as serving tokenizes it
    (:class:`~magretrieve.serving.onnx_encoder.OnnxEncoder`: prefix, truncation), so no padding tokens
    enter the activation ranges. Weights that stay fp32 are saved as fp32 (OpenVINO would
    otherwise compress them to fp16).
    """
    nncf, ov = import_nncf()
    source = fp32_encoder.manifest.path(side)
    items = [fp32_encoder.feed([enc], side) for enc in fp32_encoder.tokenize(texts, side)]
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # NNCF logs progress bars and hints at INFO
    try:
        # NNCF draws its progress bars on stdout, where `export --json` prints the manifest
        with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
            warnings.simplefilter("ignore")
            model = ov.Core().read_model(str(source))
            quantized = nncf.quantize(
                model,
                nncf.Dataset(items),
                model_type=nncf.ModelType.TRANSFORMER,
                subset_size=len(items),
            )
    except Exception as exc:  # OpenVINO and NNCF raise their own types; one line, no trace
        raise MagRetrieveError(
            f"{source.name}: static int8 failed ({type(exc).__name__}: {first_line(exc)}); "
            "export without --quantize, or with --quantize int8"
        ) from None
    finally:
        root.setLevel(level)
    ov.save_model(quantized, str(dst_xml), compress_to_fp16=False)
    return {
        "method": "nncf.quantize",
        "model_type": "TRANSFORMER",
        "calibration_texts": len(items),
        "nncf": str(nncf.__version__),
        "openvino": str(ov.get_version()),
    }
