"""Export manifests for tests: a valid model-free export folder, and edits made by tests that
need a broken or an older manifest."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path


def set_manifest_field(manifest: dict, key: str, value: object) -> None:
    """Set a manifest field where it lives: encoder settings sit under ``"encoder"`` (format 2)."""
    from magretrieve.core.manifest import ENCODER_FIELDS

    if key in ENCODER_FIELDS and isinstance(manifest.get("encoder"), dict):
        manifest["encoder"][key] = value
    else:
        manifest[key] = value


FILES = {"query.onnx": b"query graph bytes", "document.onnx": b"doc graph", "tokenizer.json": b"{}"}


def manifest_graph(file: str, gamma: float, contract: str) -> dict:
    """One graph entry of a format-2 manifest."""
    return {
        "file": file,
        "inputs": ["input_ids", "attention_mask"],
        "output": "sentence_embedding",
        "gamma": gamma,
        "contract": contract,
        "head": None,
    }


def write_manifest_folder(folder: Path, sealed: bool = True, **overrides) -> dict:
    """A valid export folder without models: the ``FILES`` bytes and a format-2 manifest that
    hashes them (``overrides`` set fields where they live; ``sealed=False`` skips the seal)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    hashes = {name: hashlib.sha256(data).hexdigest() for name, data in FILES.items()}
    from magretrieve.core.config import EncoderConfig

    encoder = EncoderConfig(
        mode="qnorm", gamma_q=1.0, gamma_d=0.0, max_query_length=64, query_prefix="query: "
    ).to_dict()
    data = {
        "format": "magretrieve-export",
        "format_version": 2,
        "encoder": encoder,
        "dimension": 384,
        "index_metric": "inner_product",
        "graphs": {
            "query": manifest_graph("query.onnx", 1.0, "unit_norm"),
            "document": manifest_graph("document.onnx", 0.0, "magnitude_keeping"),
        },
        "tokenizer": "tokenizer.json",
        "model_fingerprint": hashes["document.onnx"],
        "quantization": None,
        "files": hashes,
        "exporter": {"name": "torch.onnx (dynamo)", "opset": 18},
        "versions": {},
        "parity": {"max_abs_diff": 1e-7, "max_rel_norm_err": 1e-8},
    }
    for key, value in overrides.items():
        set_manifest_field(data, key, value)
    from magretrieve.core.manifest import MANIFEST_NAME, seal

    if sealed:
        seal(data)  # model_fingerprint and manifest_sha256, as Manifest.save writes them
    (folder / MANIFEST_NAME).write_text(json.dumps(data))
    return data
