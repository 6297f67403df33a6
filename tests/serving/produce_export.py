"""Write a tiny exported model and its PyTorch reference vectors for the torch-free serving test.

Run with a Python that has the ``train`` extra (torch); the serving test then runs in a
venv with only ``magretrieve[serve]``::

    python tests/serving/produce_export.py OUT_DIR
    MAGRETRIEVE_SERVING_EXPORT=OUT_DIR/export python -m pytest tests/serving
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conftest import build_tiny_bert  # noqa: E402

TEXTS = [
    "what does statin cause",
    "a",
    "wing flow and boundary layer pressure at high speed " * 10,
    "lung cancer",
]


def main(out: Path) -> None:
    from magretrieve.encoder import Encoder
    from magretrieve.export import export_model

    encoder = Encoder.load(build_tiny_bert(out / "model"), mode="qnorm", device="cpu")
    export_model(encoder, out / "export", exporter="torchscript", overwrite=True)
    np.savez(
        out / "expected.npz",
        queries=encoder.encode_queries(TEXTS),
        documents=encoder.encode_documents(TEXTS),
    )
    (out / "texts.json").write_text(json.dumps(TEXTS))
    print(out / "export")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
