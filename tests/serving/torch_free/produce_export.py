"""Write the fixtures of the torch-free serving tests, with a Python that has torch.

Run with a Python that has the ``train`` extra; the serving tests then run in a venv with only
``magretrieve[serve,faiss,qdrant-edge]`` (``scripts/check_serving.sh`` does both steps)::

    python tests/serving/torch_free/produce_export.py OUT_DIR
    MAGRETRIEVE_SERVING_EXPORT=OUT_DIR/export pytest tests/serving/torch_free

OUT_DIR then holds: ``export`` (qnorm) and ``export-cosine`` (ONNX graphs of a tiny random BERT),
``expected.npz`` (PyTorch reference vectors of ``texts.json``), ``beir`` (the tiny BEIR set),
``head-run`` (a frozen-encoder linear norm head with random weights) and ``head_expected.npz``
(PyTorch's magnitudes of that head on the cosine document vectors of the tiny corpus).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

TEXTS = [
    "what does statin cause",
    "a",
    "wing flow and boundary layer pressure at high speed " * 10,
    "lung cancer",
]

#: the tests' tiny-model builders, loaded from their file: this script runs outside pytest,
#: from any folder, against the installed wheel
TINY_MODELS = Path(__file__).resolve().parents[2] / "support" / "tiny_models.py"


def _tiny_models():
    spec = importlib.util.spec_from_file_location("tiny_models", TINY_MODELS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(out: Path) -> None:
    import torch

    from magretrieve.data.readers import load_corpus
    from magretrieve.export import export_model
    from magretrieve.train.encoder import Encoder

    tiny = _tiny_models()
    model = tiny.build_tiny_bert(out / "model")
    encoder = Encoder.load(model, mode="qnorm", device="cpu")
    export_model(encoder, out / "export", exporter="torchscript", overwrite=True)
    np.savez(
        out / "expected.npz",
        queries=encoder.encode_queries(TEXTS),
        documents=encoder.encode_documents(TEXTS),
    )
    (out / "texts.json").write_text(json.dumps(TEXTS))

    beir = tiny.write_tiny_beir(out / "beir")
    cosine = Encoder.load(model, mode="cosine", device="cpu")
    export_model(cosine, out / "export-cosine", exporter="torchscript", overwrite=True)

    # A frozen-encoder norm head with random (not zero) weights, as `train --freeze-encoder` saves.
    head = Encoder.load(model, mode="qnorm", norm_head="linear", device="cpu")
    torch.manual_seed(1)
    with torch.no_grad():
        for param in head.norm_head.parameters():
            param.normal_(0.0, 0.5)
    head.config.head = replace(head.config.head, frozen_encoder=True)
    head.save(out / "head-run")
    docs = list(load_corpus(beir / "corpus.jsonl").values())
    units = cosine.encode_documents([d.full_text for d in docs])
    with torch.no_grad():
        log_m = head.norm_head(torch.from_numpy(units)).reshape(-1).numpy()
    np.savez(out / "head_expected.npz", ids=np.array([d.id for d in docs]), magnitude=np.exp(log_m))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
