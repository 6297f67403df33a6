"""Indexing engines: where ``index_corpus`` runs its encoding.

``local`` (the default) is :func:`magretrieve.serving.indexing.index_documents` in this process. Every
other engine is one module here plus one entry in :data:`ENGINES` ("module:function"); the
module is imported only when chosen, so its dependency (e.g. ``ray`` for ``engine="ray"``, the
``magretrieve[ray]`` extra) is never imported on the default path.

An engine function has the signature of :func:`magretrieve.serving.indexing.index_corpus` plus its own
keyword options, and returns an :class:`~magretrieve.serving.indexing.IndexReport`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from magretrieve.core.errors import ConfigError

ENGINES: dict[str, str] = {
    "local": "",
    "ray": "magretrieve.engines.ray_engine:index_corpus_ray",
}


def get_engine(name: str) -> Callable[..., Any]:
    """The indexing function of engine ``name`` (imported now, not before)."""
    if name not in ENGINES or not ENGINES[name]:
        raise ConfigError(
            f"unknown indexing engine {name!r}; choose one of {', '.join(sorted(ENGINES))}"
        )
    module, _, func = ENGINES[name].partition(":")
    return getattr(importlib.import_module(module), func)
