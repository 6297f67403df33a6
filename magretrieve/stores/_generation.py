"""A commit counter for database folders whose engine does not tell readers about new writes.

Embedded ``chroma:`` and ``lancedb:`` commit every write straight into their folder, but a
reader process keeps answering from what it loaded (Chroma's in-memory HNSW segment, the
LanceDB table version it opened). Their writer (the holder of :mod:`._writer_lock`) therefore
bumps a small marker file in the folder after each committed write; a reader compares the
number it read at open with the file's (one tiny read) and reopens when they differ. A folder
written before the marker existed reads as generation 0.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: The marker file in the store folder: the decimal generation, replaced atomically.
MARKER = ".magretrieve-generation"


def read(folder: Path) -> int:
    """The generation committed in ``folder`` (0: no marker yet)."""
    try:
        return int((Path(folder) / MARKER).read_text().strip() or 0)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return 0


def bump(folder: Path) -> int:
    """Count one more committed write; the caller holds the folder's writer lock."""
    gen = read(folder) + 1
    tmp = Path(folder) / f"{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(f"{gen}\n")
    os.replace(tmp, Path(folder) / MARKER)  # readers see the old number or the new, never half
    return gen


class MarkerGeneration:
    """``generation`` / ``disk_generation`` / ``_committed`` for a store whose writer lock
    (``_writer``, None for a server client) guards a folder counted by the marker; the store
    sets ``_generation`` when it loads the folder."""

    _writer: Any
    _generation: int | None

    def _committed(self) -> None:
        """After each write: bump the folder's generation marker, so readers reload."""
        if self._writer is not None:
            self._generation = bump(self._writer.folder)

    @property
    def generation(self) -> int | None:
        return self._generation

    def disk_generation(self) -> int | None:
        return read(self._writer.folder) if self._writer is not None else None
