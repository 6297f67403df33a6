"""Make the folder Infinity's ``--engine optimum`` serves, and Infinity's own optimized graph.

Run by **Infinity's venv** python (it imports optimum, transformers and infinity_emb, none of
which the project's venv needs), with the hub off; ``serve_load.py`` calls it::

    VENV/bin/python benchmarks/_infinity_onnx.py MODEL_OUT HUB_CACHE --from SOURCE

1. ``--from SOURCE`` (a sentence-transformers folder): optimum's ONNX export of it into
   ``MODEL_OUT`` (``model.onnx`` and the tokenizer), then every file of SOURCE that the export
   did not write (``modules.json``, ``1_Pooling/``, the sentence-transformers configs). The
   engine needs an ``.onnx`` file in the folder: it does not export one itself.
2. Infinity's CPU graph optimization of ``MODEL_OUT/model.onnx``, saved where Infinity looks
   first when it is started with ``--model-id .`` from inside ``MODEL_OUT``:
   ``HUB_CACHE/infinity_onnx/<provider>/model_optimized.onnx``. Infinity makes this graph itself
   on start-up, but with optimum 2.x its call fails (it passes ``optimize_with_onnxruntime_only``,
   which optimum 2.x dropped) and it falls back to the unfused graph, quietly; this step uses
   Infinity's own configuration (level 99, not for GPU, no fp16), passing that keyword only
   where the installed optimum still accepts it.

Prints one JSON line: the provider, the optimized file, its fused operators and the versions.
"""

from __future__ import annotations

import argparse
import collections
import importlib.metadata as metadata
import inspect
import json
import shutil
from pathlib import Path

#: Fused operators counted in the optimized graph (what says the fusions took).
FUSED = ("Attention", "SkipLayerNormalization", "BiasGelu", "EmbedLayerNormalization", "FastGelu")


def provider() -> str:
    """The execution provider Infinity picks for ``--device cpu`` (its own rule)."""
    try:
        from infinity_emb.primitives import Device
        from infinity_emb.transformer.utils_optimum import device_to_onnx

        return str(device_to_onnx(Device.cpu))
    except ImportError:
        return "CPUExecutionProvider"


def export(source: Path, out: Path) -> None:
    from optimum.onnxruntime import ORTModelForFeatureExtraction
    from transformers import AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    ORTModelForFeatureExtraction.from_pretrained(source, export=True).save_pretrained(out)
    AutoTokenizer.from_pretrained(source).save_pretrained(out)
    for item in source.rglob("*"):
        target = out / item.relative_to(source)
        if item.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not target.exists() and item.suffix not in {".safetensors", ".bin"}:
            shutil.copy2(item, target)


def optimize(model: Path, save_dir: Path, ep: str) -> Path:
    from optimum.onnxruntime import ORTModelForFeatureExtraction, ORTOptimizer
    from optimum.onnxruntime.configuration import OptimizationConfig

    unoptimized = ORTModelForFeatureExtraction.from_pretrained(
        model, file_name="model.onnx", provider=ep
    )
    config: dict[str, object] = {"optimization_level": 99, "optimize_for_gpu": False, "fp16": False}
    if "optimize_with_onnxruntime_only" in inspect.signature(OptimizationConfig).parameters:
        config["optimize_with_onnxruntime_only"] = False  # Infinity's value, where it exists
    save_dir.mkdir(parents=True, exist_ok=True)
    ORTOptimizer.from_pretrained(unoptimized).optimize(
        optimization_config=OptimizationConfig(**config),
        save_dir=save_dir,
        one_external_file=True,
    )
    found = sorted(save_dir.glob("*_optimized.onnx"))
    if not found:
        raise FileNotFoundError(f"no *_optimized.onnx written in {save_dir}")
    return found[-1]


def fused_ops(graph: Path) -> dict[str, int]:
    import onnx

    counts = collections.Counter(
        n.op_type for n in onnx.load(graph, load_external_data=False).graph.node
    )
    return {op: counts[op] for op in FUSED if counts[op]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_out", type=Path, help="the folder Infinity serves")
    parser.add_argument("hub_cache", type=Path, help="HF_HOME/hub of the Infinity server")
    parser.add_argument("--from", dest="source", type=Path, help="export this folder first")
    args = parser.parse_args()
    if args.source is not None:
        export(args.source, args.model_out)
    if not (args.model_out / "model.onnx").is_file():
        raise FileNotFoundError(f"{args.model_out} holds no model.onnx")
    ep = provider()
    graph = optimize(args.model_out, args.hub_cache / "infinity_onnx" / ep, ep)
    versions = {
        name: metadata.version(name)
        for name in ("infinity-emb", "optimum", "onnxruntime", "transformers")
    }
    print(json.dumps({"provider": ep, "graph": str(graph), "fused": fused_ops(graph), **versions}))


if __name__ == "__main__":
    main()
