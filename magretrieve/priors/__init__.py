"""Training-free document priors on top of cosine, one seam for all (see :mod:`.base`).

A new prior is one module with a :class:`~magretrieve.priors.base.DocumentPrior` subclass
(its terms, its JSON, its candidate grid) plus one entry in :data:`REGISTRY`; ``fit-prior
--method auto`` then tries it too. A field prior (``field:NAME``) reads a number each document
carries in its payload instead of the vectors; ``auto`` tries every numeric field.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
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
from magretrieve.priors.document_fields import DocumentFields
from magretrieve.priors.field import FieldPrior
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
    "field": FieldPrior,
}
#: ``--method`` names that try part of a method's grid: name -> (method, grid options).
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "csls-queries": ("csls", {"bank": "queries"}),
    "csls-corpus": ("csls", {"bank": "corpus"}),
}


def prior_from_dict(data: Any, source: str = "prior") -> DocumentPrior:
    """A prior from its JSON (``fit-prior --out``)."""
    prior = _from_dict(data, source)
    prior.source = source
    return prior


def _from_dict(data: Any, source: str) -> DocumentPrior:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: a prior is a JSON object, got {type(data).__name__}")
    kind = data.get("kind", KIND)
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


def read_prior_file(path: str | Path) -> DocumentPrior:
    """The prior in a JSON file (``fit-prior --out``).

    Every field is checked (types, ranges, the query bank's shape) before the prior is used;
    a bad file is one ConfigError naming the file and the field.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (ValueError, RecursionError) as exc:  # JSON and UTF-8 errors
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return prior_from_dict(data, source=str(path))


def prior_option(beta: float | None, prior_file: str | Path | None, k: int) -> DocumentPrior | None:
    """The prior of ``--corpus-prior β`` (the hub prior) or ``--prior-file`` (None when neither)."""
    if prior_file is not None:
        if beta is not None:
            raise ConfigError("give --corpus-prior or --prior-file, not both")
        return read_prior_file(prior_file)
    if beta is not None:
        if not math.isfinite(beta):
            raise ConfigError(f"--corpus-prior must be a finite number, got {beta}")
        if k < 1:
            raise ConfigError(f"--k must be at least 1, got {k}")
        return HubPrior(beta, k)
    return None


__all__ = [
    "REGISTRY",
    "CenterPrior",
    "CombinedPrior",
    "CslsPrior",
    "DocumentFields",
    "DocumentPrior",
    "FieldPrior",
    "HubPrior",
    "InvertedSoftmaxPrior",
    "NoPrior",
    "PriorTerms",
    "prior_from_dict",
    "prior_option",
    "read_prior_file",
    "query_vectors",
    "split_stored",
    "stored_vectors",
    "unit",
]
