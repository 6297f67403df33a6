"""Persistence of the FAISS store: its generations of files (:class:`._generation.GenerationFiles`).

Layout of a store folder::

    DIR/faiss_store.json      state, written LAST: generation, parameters, checksums, metadata
    DIR/index-<gen>.faiss     the FAISS index (int64 ids = positions in the record table)
    DIR/records-<gen>.json    [[doc_id, payload, doc_norm] or null per int64 id], tombstones
    DIR/pending-<gen>.npy     vectors waiting to train an untrained index (only while untrained)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.stores._generation import GenerationFiles
from magretrieve.stores.base import state_metadata

STATE_FILE = "faiss_store.json"
FORMAT = "magretrieve-faiss-store"
#: 2: records carry doc_norm, pending vectors of an untrained index are saved.
FORMAT_VERSION = 2
FILES = GenerationFiles(
    STATE_FILE,
    FORMAT,
    "FAISS",
    {"index": "index-{gen}.faiss", "records": "records-{gen}.json", "pending": "pending-{gen}.npy"},
)
has_state = FILES.has_state
disk_generation = FILES.disk_generation
check_no_orphans = FILES.check_no_orphans


@dataclass
class Saved:
    """What one generation holds, as read back (the index file is read by the caller)."""

    state: dict[str, Any]
    index_file: Path | None
    records: dict[str, Any] | None
    pending: np.ndarray | None


def read(path: Path) -> Saved:
    """The committed generation, every file checked against its checksum."""
    state = FILES.read_state(path)
    if state.get("index_file") is None:
        return Saved(state, None, None, None)
    index_file = FILES.checked(path, state, "index")
    records = json.loads(FILES.checked(path, state, "records").read_text())
    pending = None
    if state.get("pending_file"):
        pending = np.load(FILES.checked(path, state, "pending"), allow_pickle=False)
    return Saved(state, index_file, records, pending)


def metadata(state: dict[str, Any], path: Path) -> dict[str, Any] | None:
    return state_metadata(state, str(path / STATE_FILE))
