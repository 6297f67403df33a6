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
    # encoders
    "Encoder": "magretrieve.encoder",
    "EncoderConfig": "magretrieve.config",
    "OnnxEncoder": "magretrieve.runtime",
    "Manifest": "magretrieve.manifest",
    # training and evaluation
    "TrainConfig": "magretrieve.trainer",
    "train": "magretrieve.trainer",
    "evaluate_retrieval": "magretrieve.evaluate",
    "retrieval_metrics": "magretrieve.metrics",
    "evaluate_sts": "magretrieve.evaluate",
    "export_model": "magretrieve.export",
    # stores and retrieval (the serving path)
    "VectorStore": "magretrieve.adapters",
    "StoreHit": "magretrieve.adapters",
    "open_store": "magretrieve.adapters",
    "Retriever": "magretrieve.retriever",
    "Hit": "magretrieve.retriever",
    "DEFAULT_K": "magretrieve.retriever",
    "index_corpus": "magretrieve.indexing",
    "index_documents": "magretrieve.indexing",
    # document priors on top of cosine (the recommended magnitude for normalization-pretrained
    # encoders): chosen on training queries, applied to a store without re-encoding
    "DocumentPrior": "magretrieve.priors",
    "prior_from_dict": "magretrieve.priors",
    "fit_prior": "magretrieve.priors.fit",
    "choose_prior": "magretrieve.priors.select",
    "CorpusPrior": "magretrieve.corpus_prior",
    "rescale_store": "magretrieve.rescale",
    # diagnosis (the subpackage is ``magretrieve.diagnose``; the function has its own name so
    # that importing a submodule can never replace it)
    "diagnose_model": "magretrieve.diagnose",
    "recommend": "magretrieve.diagnose",
}
#: Attribute names under which the lazy names are defined in their modules, where different.
_SOURCE_NAME = {"diagnose_model": "diagnose"}

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


#: Subpackages reachable as attributes before anything imported them (``magretrieve.diagnose``
#: is always this subpackage, never a function).
_SUBPACKAGES = frozenset({"adapters", "config", "diagnose", "export", "testing"})


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"magretrieve.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'magretrieve' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), _SOURCE_NAME.get(name, name))
    globals()[name] = value
    return value
