"""Persistence of the FAISS store: generations of files switched by one atomic state write.

Layout of a store folder::

    DIR/faiss_store.json      state, written LAST: generation, parameters, checksums, metadata
    DIR/index-<gen>.faiss     the FAISS index (int64 ids = positions in the record table)
    DIR/records-<gen>.json    [[doc_id, payload, doc_norm] or null per int64 id], tombstones
    DIR/pending-<gen>.npy     vectors waiting to train an untrained index (only while untrained)

Saving writes a new generation (temp file + fsync + ``os.replace``) and switches
``faiss_store.json`` to it last, so a crash at any point leaves the previous consistent state
loadable; a state file whose checksums do not match its files is reported as half-written.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from magretrieve.core.errors import StoreError
from magretrieve.core.files import sha256_file
from magretrieve.stores.base import (
    atomic_write_bytes,
    atomic_write_json,
    plain_file,
    read_state_file,
    state_metadata,
)

STATE_FILE = "faiss_store.json"
FORMAT = "magretrieve-faiss-store"
#: 2: records carry doc_norm, pending vectors of an untrained index are saved.
FORMAT_VERSION = 2


@dataclass
class Saved:
    """What one generation holds, as read back (the index file is read by the caller)."""

    state: dict[str, Any]
    index_file: Path | None
    records: dict[str, Any] | None
    pending: np.ndarray | None


def has_state(path: Path) -> bool:
    return (path / STATE_FILE).is_file()


def check_no_orphans(path: Path) -> None:
    if any(path.glob("index-*.faiss")) or any(path.glob("records-*.json")):
        raise StoreError(
            f"{path}: index files without {STATE_FILE}: a save was interrupted before "
            "its first commit; delete the folder and re-index"
        )


def disk_generation(path: Path) -> int | None:
    """The committed generation on disk (None when there is no state file yet)."""
    f = path / STATE_FILE
    if not f.is_file():
        return None
    try:
        return int(json.loads(f.read_text()).get("generation", 0))
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def read(path: Path) -> Saved:
    """The committed generation, every file checked against its checksum."""
    state = read_state_file(path / STATE_FILE, FORMAT, "FAISS")
    if state.get("index_file") is None:
        return Saved(state, None, None, None)
    files = {
        "index": plain_file(path, state["index_file"], STATE_FILE),
        "records": plain_file(path, state["records_file"], STATE_FILE),
    }
    if state.get("pending_file"):
        files["pending"] = plain_file(path, state["pending_file"], STATE_FILE)
    for key, f in files.items():
        if not f.is_file():
            raise StoreError(f"{f}: missing (the store in {path} is incomplete)")
        if sha256_file(f) != state[f"{key}_sha256"]:
            raise StoreError(
                f"{f}: does not match the checksum in {STATE_FILE} (half-written or modified)"
            )
    records = json.loads(files["records"].read_text())
    pending = np.load(files["pending"], allow_pickle=False) if "pending" in files else None
    return Saved(state, files["index"], records, pending)


def metadata(state: dict[str, Any], path: Path) -> dict[str, Any] | None:
    return state_metadata(state, str(path / STATE_FILE))


def write(
    path: Path,
    gen: int,
    index_bytes: bytes,
    records: dict[str, Any],
    pending: np.ndarray | None,
    state: Callable[[dict[str, Any]], dict[str, Any]],
) -> None:
    """Write generation ``gen`` and switch the state file to it; older files are removed.

    ``state(files)`` builds the state document from the file names and checksums.
    """
    path.mkdir(parents=True, exist_ok=True)
    if not (path / STATE_FILE).is_file():
        # commit an empty generation 0 first: a crash during the first real save then
        # leaves a store that reopens (empty) and resumes, instead of orphan files
        atomic_write_json(path / STATE_FILE, state({}))
    names = {"index_file": f"index-{gen}.faiss", "records_file": f"records-{gen}.json"}
    atomic_write_bytes(path / names["index_file"], index_bytes)
    atomic_write_bytes(path / names["records_file"], json.dumps(records).encode())
    if pending is not None and len(pending):
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(pending, dtype=np.float32))
        names["pending_file"] = f"pending-{gen}.npy"
        atomic_write_bytes(path / names["pending_file"], buf.getvalue())
    files: dict[str, Any] = dict(names)
    for key, name in names.items():
        files[key.replace("_file", "_sha256")] = sha256_file(path / name)
    atomic_write_json(path / STATE_FILE, state(files))
    # older generations, and temp files of saves a crash interrupted
    keep = set(names.values())
    for stale in [
        *path.glob("index-*.faiss"),
        *path.glob("records-*.json"),
        *path.glob("pending-*.npy"),
        *path.glob(".index-*.tmp"),
        *path.glob(".records-*.tmp"),
        *path.glob(".pending-*.tmp"),
        *path.glob(f".{STATE_FILE}.*.tmp"),
    ]:
        if stale.name not in keep:
            stale.unlink(missing_ok=True)
