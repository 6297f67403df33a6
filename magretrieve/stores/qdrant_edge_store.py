"""Qdrant Edge (``qdrant-edge-py``): Qdrant's storage and HNSW engine in-process, no server.

Layout of a store folder ``DIR``::

    DIR/shard/                    the Edge shard (edge_config.json, WAL, segments)
    DIR/magretrieve_store.json    which model built the store, and the measured recall

The store is :class:`~magretrieve.stores.qdrant_store.QdrantStore` over the Edge client of
:mod:`._qdrant_clients`, so every Qdrant rule holds here too. Unlike embedded qdrant-client,
Edge builds a real HNSW index; ``optimize()`` builds it after a bulk load (segments below the
indexing threshold are searched exactly) and measures its recall. Updates go through Edge's
write-ahead log, so every ``add`` that returned survives a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from magretrieve.core.options import option
from magretrieve.stores import registry
from magretrieve.stores._qdrant_clients import META_FILE, SHARD_DIR, EdgeAPI
from magretrieve.stores.options import HnswOptions, RecallOptions, StoreOptions
from magretrieve.stores.qdrant_store import QdrantQuantizationOptions, QdrantStore

__all__ = ["META_FILE", "SHARD_DIR", "QdrantEdgeStore"]


class QdrantEdgeStore(QdrantStore):
    """An Edge shard in a folder, searched by dot product with HNSW."""

    kind = "qdrant-edge"

    def __init__(self, path: str | Path, dimension: int | None = None, **options: Any) -> None:
        super().__init__(dimension=dimension, api=EdgeAPI(path), **options)

    def foreign_points(self) -> int:
        """A shard without magretrieve's file beside it was not written by magretrieve."""
        if self.created_here or (self.api.path / META_FILE).is_file():
            return 0
        return self.count()


# ----------------------------------------------------------------------------- registry entry


@dataclass(frozen=True)
class EdgeOptions(StoreOptions):
    """When an Edge shard searches exactly and when it indexes a segment."""

    full_scan_threshold: int | None = option("Qdrant Edge: exact below this size (KB).", minimum=0)
    indexing_threshold: int | None = option(
        "Qdrant Edge: index segments above this size.", minimum=0
    )


EDGE_OPTIONS = (HnswOptions, QdrantQuantizationOptions, EdgeOptions, RecallOptions)

registry.register(
    registry.Backend(
        form="qdrant-edge:DIR",
        open=lambda loc, dimension, **options: QdrantEdgeStore(loc["path"], dimension, **options),
        options=EDGE_OPTIONS,
        folder=True,
        extra="qdrant-edge",
    )
)
