"""magretrieve: dense retrieval that puts embedding magnitude to work.

``import magretrieve`` is torch-free: training and export names load torch only when used.
"""

from __future__ import annotations

import importlib
from typing import Any

from magretrieve import similarity
from magretrieve.data import (
    Document,
    RetrievalDataset,
    SentencePair,
    TrainingPair,
    load_beir,
    load_corpus,
    load_pairs,
    load_sentence_pairs,
    load_training_data,
)
from magretrieve.errors import (
    ConfigError,
    DataError,
    MagRetrieveError,
    ManifestError,
    StoreError,
    SymmetryError,
)
from magretrieve.similarity import MODES, Similarity

__version__ = "0.1.0"

# Public names whose modules are imported on first use (torch, onnxruntime, faiss, qdrant
# are heavy or optional; serving must not pay for training).
_LAZY: dict[str, str] = {
    "Encoder": "magretrieve.encoder",
    "EncoderConfig": "magretrieve.encoder",
    "TrainConfig": "magretrieve.trainer",
    "train": "magretrieve.trainer",
    "evaluate_retrieval": "magretrieve.evaluate",
    "evaluate_sts": "magretrieve.evaluate",
    "OnnxEncoder": "magretrieve.runtime",
    "Retriever": "magretrieve.retriever",
    "Hit": "magretrieve.retriever",
    "export_model": "magretrieve.export",
    "open_store": "magretrieve.adapters",
    "diagnose": "magretrieve.diagnose",
}

__all__ = [
    "MODES",
    "ConfigError",
    "DataError",
    "Document",
    "MagRetrieveError",
    "ManifestError",
    "RetrievalDataset",
    "SentencePair",
    "Similarity",
    "StoreError",
    "SymmetryError",
    "TrainingPair",
    "__version__",
    "load_beir",
    "load_corpus",
    "load_pairs",
    "load_sentence_pairs",
    "load_training_data",
    "similarity",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'magretrieve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
