"""Example specs the shared store tests run, keyed by registry prefix (test fixtures, not code).

Every registered backend (``magretrieve.stores.registry.backends()``) must have an entry here:
:func:`examples` fails naming a backend that has none, so a new store cannot join the
registry without joining the congruence, injection and secrets suites. A backend that needs
a service the test session does not start is listed in :data:`NEEDS_SERVICE` with the reason
and where its code path is covered instead.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from magretrieve.stores import registry

#: Set by the test session (tests/conftest.py) to the URI of the PostgreSQL it started.
PG_URI_ENV = "MAGRETRIEVE_TEST_PGVECTOR_URI"


@dataclass(frozen=True)
class Example:
    """A spec the shared store tests run against.

    ``exact``: searched exactly; ``lossy``: vectors come back approximately (PQ/SQ codes);
    ``deletes_hide_others``: after deletes the backend's own search can stop finding a few
    live documents (a known upstream bug; the tests then check recall instead of identity).
    """

    name: str
    spec: str
    options: dict[str, Any] = field(default_factory=dict)
    exact: bool = True
    lossy: bool = False
    deletes_hide_others: bool = False

    @property
    def prefix(self) -> str:
        return self.spec.split(":", 1)[0]


def _pgvector(tmp: Path) -> list[Example]:
    uri = os.environ.get(PG_URI_ENV)
    if not uri:  # no pgserver in this venv: the store congruence suite fails on it
        return []
    table = "t_" + hashlib.sha1(str(tmp).encode()).hexdigest()[:12]
    return [Example("pgvector", f"pgvector:{uri}#{table}", {"index_type": "flat"})]


def _milvus(tmp: Path) -> list[Example]:
    if importlib.util.find_spec("milvus_lite") is None:  # the store congruence suite fails on it
        return []
    return [Example("milvus-lite", f"milvus:{tmp / 'milvus.db'}/test")]


def _chroma(tmp: Path) -> list[Example]:
    if importlib.util.find_spec("chromadb") is None:  # the store congruence suite fails on it
        return []
    # Chroma has only HNSW: an ef above the tests' corpus sizes searches every vector, until
    # deletes and upserts leave a live record unreachable (chroma-core/chroma#7758, 1.5.9)
    return [
        Example(
            "chroma",
            f"chroma:{tmp / 'chroma'}/test",
            {"ef_search": 512},
            deletes_hide_others=True,
        )
    ]


def _lancedb(tmp: Path) -> list[Example]:
    if importlib.util.find_spec("lancedb") is None:  # the store congruence suite fails on it
        return []
    return [Example("lancedb", f"lancedb:{tmp / 'lancedb'}/test")]


def _scann(tmp: Path) -> list[Example]:
    if importlib.util.find_spec("scann") is None:  # the store congruence suite fails on it
        return []
    return [
        # below exact_below (20,000 by default) the store searches exactly
        Example("scann", f"scann:{tmp / 'scann'}"),
        # a searcher built by optimize() from 100 vectors on, every leaf searched
        Example(
            "scann-built",
            f"scann:{tmp / 'scann-built'}",
            {"exact_below": 100, "leaves_to_search": 1 << 20},
            exact=False,
        ),
    ]


#: Example specs of every registered backend, by prefix.
BY_PREFIX: dict[str, Callable[[Path], list[Example]]] = {
    "faiss": lambda tmp: [
        Example("faiss-flat", f"faiss:{tmp / 'faiss'}"),
        Example("faiss-hnsw", f"faiss:{tmp / 'faiss-hnsw'}", {"index_type": "hnsw"}, exact=False),
        Example(
            "faiss-ivf",
            f"faiss:{tmp / 'faiss-ivf'}",
            {"index_type": "ivf", "nlist": 4},
            exact=False,
        ),
        Example(
            "faiss-factory-hnsw",
            f"faiss:{tmp / 'faiss-fh'}",
            {"index_type": "HNSW16,Flat"},
            exact=False,
        ),
        Example(
            "faiss-ivfpq",
            f"faiss:{tmp / 'faiss-ivfpq'}",
            {"index_type": "IVF4,PQ4x4"},
            exact=False,
            lossy=True,
        ),
    ],
    "memory": lambda tmp: [
        Example("memory", "memory:"),
        Example("memory-dir", f"memory:{tmp / 'memory'}"),
    ],
    "qdrant-local": lambda tmp: [Example("qdrant-local", f"qdrant-local:{tmp / 'qdrant'}/test")],
    "qdrant-memory": lambda tmp: [Example("qdrant-memory", "qdrant-memory:test")],
    "qdrant-edge": lambda tmp: [Example("qdrant-edge", f"qdrant-edge:{tmp / 'edge'}")],
    "pgvector": _pgvector,
    "milvus": _milvus,
    "chroma": _chroma,
    "lancedb": _lancedb,
    "scann": _scann,
}

#: Registered backends the session cannot run, with where their code is covered instead.
NEEDS_SERVICE = {
    "qdrant": "a Qdrant server; QdrantStore runs the same code over qdrant-local/-memory and "
    "through QdrantClient objects in test_stores.py",
}


def missing_backends() -> list[str]:
    """Registered prefixes with neither examples here nor a NEEDS_SERVICE reason."""
    return sorted(
        b.prefix for b in registry.backends() if b.prefix not in BY_PREFIX | NEEDS_SERVICE
    )


def examples(tmp: Path) -> list[Example]:
    """Every registered backend's example specs under ``tmp``; a backend without any fails."""
    missing = missing_backends()
    if missing:
        raise AssertionError(
            f"registered store backend(s) {missing} have no example spec in tests/support/store_examples.py"
        )
    out: list[Example] = []
    for b in registry.backends():
        out.extend(BY_PREFIX.get(b.prefix, lambda tmp: [])(tmp))
    return out


def exact_example(prefix: str, tmp: Path) -> Example | None:
    """The first exactly-searched example of a backend, one that persists where the backend
    can (None when the session has none)."""
    exact = [e for e in BY_PREFIX[prefix](tmp) if e.exact]
    persisting = [e for e in exact if _persists(e.spec)]
    return (persisting or exact or [None])[0]


def _persists(spec: str) -> bool:
    backend, loc = registry.backend_for(spec)
    return backend.persists(loc)
