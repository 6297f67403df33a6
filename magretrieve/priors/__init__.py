"""Training-free document priors on top of cosine, one seam for all (see :mod:`.base`).

A new prior is one module with a :class:`~magretrieve.priors.base.DocumentPrior` subclass
(its terms, its JSON, its candidate grid) plus one entry in :data:`REGISTRY`; ``fit-prior
--method auto`` then tries it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from magretrieve.core.errors import ConfigError
from magretrieve.priors.base import (
    KIND,
    DocumentPrior,
    PriorTerms,
    query_vectors,
    split_stored,
    stored_vectors,
    unit,
)
from magretrieve.priors.center import CenterPrior
from magretrieve.priors.combined import CombinedPrior
from magretrieve.priors.csls import CslsPrior
from magretrieve.priors.hub import HubPrior
from magretrieve.priors.inverted_softmax import InvertedSoftmaxPrior
from magretrieve.priors.none import NoPrior

#: method name -> prior class (a combination is written ``a+b``).
REGISTRY: dict[str, type[DocumentPrior]] = {
    "none": NoPrior,
    "hub": HubPrior,
    "csls": CslsPrior,
    "inverted-softmax": InvertedSoftmaxPrior,
    "center": CenterPrior,
}
#: ``--method`` names that try part of a method's grid: name -> (method, grid options).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "csls-queries": ("csls", {"bank": "queries"}),
    "csls-corpus": ("csls", {"bank": "corpus"}),
}


def prior_from_dict(data: Any, source: str = "prior") -> DocumentPrior:
    """A prior from its JSON (``fit-prior --out``); the old ``corpus_prior`` files read as hub."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: a prior is a JSON object, got {type(data).__name__}")
    kind = data.get("kind", KIND)
    if kind == "corpus_prior":  # written before the prior family: the hub prior
        return HubPrior.from_params(data, source)
    if kind != KIND:
        raise ConfigError(f"{source}: not a document prior (kind {kind!r})")
    method = str(data.get("method", ""))
    if "+" in method:
        return CombinedPrior.from_params(data, source)
    cls = REGISTRY.get(method)
    if cls is None:
        raise ConfigError(
            f"{source}: unknown prior method {method!r}; known: {', '.join(sorted(REGISTRY))}"
        )
    return cls.from_params(data, source)


__all__ = [
    "REGISTRY",
    "CenterPrior",
    "CombinedPrior",
    "CslsPrior",
    "DocumentPrior",
    "HubPrior",
    "InvertedSoftmaxPrior",
    "NoPrior",
    "PriorTerms",
    "prior_from_dict",
    "query_vectors",
    "split_stored",
    "stored_vectors",
    "unit",
]
