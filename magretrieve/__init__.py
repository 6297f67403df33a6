"""magretrieve: dense retrieval that puts embedding magnitude to work.

``import magretrieve`` is torch-free: training and export names load torch only when used.
"""

from __future__ import annotations

import importlib
from typing import Any

from magretrieve.core.errors import (
    ConfigError,
    DataError,
    MagRetrieveError,
    ManifestError,
    StoreError,
    SymmetryError,
)
from magretrieve.core.similarity import MODES, Similarity
from magretrieve.core.version import __version__
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

# Public names whose modules are imported on first use (torch, onnxruntime, faiss, qdrant
# are heavy or optional; serving must not pay for training).
_LAZY: dict[str, str] = {
    # encoders
    "Encoder": "magretrieve.train.encoder",
    "EncoderConfig": "magretrieve.core.config",
    "OnnxEncoder": "magretrieve.serving.onnx_encoder",
    "Manifest": "magretrieve.core.manifest",
    # training and evaluation
    "train_model": "magretrieve.train.trainer",
    "TrainConfig": "magretrieve.core.training",
    "evaluate_retrieval": "magretrieve.evaluation.retrieval",
    "retrieval_metrics": "magretrieve.core.metrics",
    "evaluate_sts": "magretrieve.evaluation.retrieval",
    "export_model": "magretrieve.export",
    # stores and retrieval (the serving path)
    "VectorStore": "magretrieve.stores",
    "StoreHit": "magretrieve.stores",
    "open_store": "magretrieve.stores",
    "Retriever": "magretrieve.serving.retriever",
    "Hit": "magretrieve.serving.retriever",
    "DEFAULT_K": "magretrieve.serving.retriever",
    "index_corpus": "magretrieve.serving.indexing",
    "index_documents": "magretrieve.serving.indexing",
    # document priors on top of cosine (the recommended magnitude for normalization-pretrained
    # encoders): chosen on training queries, applied to a store without re-encoding
    "DocumentPrior": "magretrieve.priors",
    "prior_from_dict": "magretrieve.priors",
    "fit_prior": "magretrieve.priors.fit",
    "choose_prior": "magretrieve.priors.select",
    "rescale_store": "magretrieve.priors.rescale",
    # diagnosis
    "diagnose_model": "magretrieve.diagnose",
    "recommend": "magretrieve.diagnose",
}
#: Attribute names under which the lazy names are defined in their modules, where different.
#: A function never shares its name with a subpackage (``magretrieve.train`` and
#: ``magretrieve.diagnose`` are folders), since importing a submodule binds the subpackage's name.
_SOURCE_NAME = {"train_model": "train", "diagnose_model": "diagnose"}

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
    *_LAZY,
]


#: Layer subpackages reachable as attributes before anything imported them.
_SUBPACKAGES = ("diagnose", "export", "priors", "stores", "train")


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'magretrieve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _SOURCE_NAME.get(name, name))
    globals()[name] = value
    return value
