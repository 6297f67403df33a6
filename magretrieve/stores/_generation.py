"""Generations of a store folder: what a reader compares to see another process's writes.

Two kinds. Embedded databases (:class:`MarkerGeneration`) commit each write themselves and
only need a counter readers can compare; folder stores that save their own files
(:class:`GenerationFiles`, :class:`SavedGenerations`: FAISS and ScaNN) write each save as a new
generation of files switched by one atomic state write.

The marker: embedded ``chroma:`` and ``lancedb:`` commit every write straight into their folder, but a
reader process keeps answering from what it loaded (Chroma's in-memory HNSW segment, the
LanceDB table version it opened). Their writer (the holder of :mod:`._writer_lock`) therefore
bumps a small marker file in the folder after each committed write; a reader compares the
number it read at open with the file's (one tiny read) and reopens when they differ. A folder
written before the marker existed reads as generation 0.

Both kinds also record the folder's **id**, a random one minted when the folder is created
(in the state file; in the marker at its first write). A folder deleted and built again
counts its generations from the start, so a reader could hold the very number the new folder
reaches; the id tells them apart, and a reader treats another id as newer whatever the
generations say. A folder written before ids existed reads as :data:`~.base.LEGACY_STORE_ID`
and keeps that id through later writes.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from magretrieve.core.errors import StoreError
from magretrieve.core.files import sha256_file
from magretrieve.stores.base import (
    LEGACY_STORE_ID,
    StoreVersion,
    atomic_write_bytes,
    atomic_write_json,
    new_store_id,
    plain_file,
    read_state_file,
    state_store_id,
)

#: The marker file in the store folder: ``<generation> <store id>``, replaced atomically (a
#: marker written before ids existed holds the generation alone).
MARKER = ".magretrieve-generation"


def read_version(folder: Path) -> StoreVersion:
    """The id and generation committed in ``folder`` (generation 0: no marker yet)."""
    try:
        parts = (Path(folder) / MARKER).read_text().split()
        gen = int(parts[0]) if parts else 0
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return StoreVersion(LEGACY_STORE_ID, 0)
    return StoreVersion(state_store_id(parts[1] if len(parts) > 1 else None), gen)


def read(folder: Path) -> int:
    """The generation committed in ``folder`` (0: no marker yet)."""
    return read_version(folder).generation


def bump(folder: Path) -> StoreVersion:
    """Count one more committed write; the caller holds the folder's writer lock.

    The first write of a folder mints its id; later ones keep it (a legacy marker stays
    legacy, so a reader sees the generation move, not another folder)."""
    marker = Path(folder) / MARKER
    held = read_version(folder)
    store_id = held.store_id if marker.is_file() else new_store_id()
    version = StoreVersion(store_id, held.generation + 1)
    tmp = Path(folder) / f"{MARKER}.{os.getpid()}.tmp"
    shown = "" if store_id == LEGACY_STORE_ID else f" {store_id}"
    tmp.write_text(f"{version.generation}{shown}\n")
    os.replace(tmp, marker)  # readers see the old marker or the new, never half
    return version


class MarkerGeneration:
    """``version`` / ``disk_version`` / ``_committed`` for a store whose writer lock
    (``_writer``, None for a server client) guards a folder counted by the marker; the store
    sets ``_version`` (:func:`read_version`) when it loads the folder."""

    _writer: Any
    _version: StoreVersion | None

    def _begin_write(self) -> None:
        raise NotImplementedError

    def _before_create(self) -> bool:
        """Creating is a write: take the writer lock first (and look again: another process
        may have created it meanwhile)."""
        self._begin_write()
        return True

    def _committed(self) -> None:
        """After each write: bump the folder's generation marker, so readers reload."""
        if self._writer is not None:
            self._version = bump(self._writer.folder)

    @property
    def version(self) -> StoreVersion | None:
        return self._version

    def disk_version(self) -> StoreVersion | None:
        return read_version(self._writer.folder) if self._writer is not None else None

    def close(self) -> None:
        """Release the folder's writer lock (a server client holds none)."""
        if self._writer is not None:
            self._writer.release()


# ----------------------------------------------------------------------------- file generations


@dataclass(frozen=True)
class GenerationFiles:
    """The folder layout of a store saved in generations (FAISS, ScaNN).

    Each save writes its files under new names (``records-<gen>.json``, ...: temp file + fsync
    + ``os.replace``), then switches the state file to them last, so a crash at any point leaves
    the previous consistent generation loadable; the state file records each file's checksum,
    so a half-written or modified file is reported, never loaded. ``files`` maps each kind of
    file to its name pattern (``{"records": "records-{gen}.json"}``), ``folders`` the kinds
    saved as a folder (ScaNN's searcher).
    """

    state_file: str
    format: str
    what: str
    files: Mapping[str, str]
    folders: Mapping[str, str] = field(default_factory=dict)

    def has_state(self, path: Path) -> bool:
        return (path / self.state_file).is_file()

    def disk_version(self, path: Path) -> StoreVersion | None:
        """The committed id and generation on disk (None when there is no state file yet)."""
        try:
            state = json.loads((path / self.state_file).read_text())
            return StoreVersion(
                state_store_id(state.get("store_id")), int(state.get("generation", 0))
            )
        except (OSError, ValueError, AttributeError, TypeError):
            return None

    def disk_generation(self, path: Path) -> int | None:
        """The committed generation on disk (None when there is no state file yet)."""
        version = self.disk_version(path)
        return version.generation if version is not None else None

    def check_no_orphans(self, path: Path) -> None:
        """Refuse files of a first save that never committed its state file."""
        patterns = [*self.files.values(), *self.folders.values()]
        if any(any(path.glob(p.format(gen="*"))) for p in patterns):
            raise StoreError(
                f"{path}: store files without {self.state_file}: a save was interrupted before "
                "its first commit; delete the folder and re-index"
            )

    def read_state(self, path: Path) -> dict[str, Any]:
        return read_state_file(path / self.state_file, self.format, self.what)

    def checked(self, path: Path, state: Mapping[str, Any], key: str) -> Path:
        """``path/<state[key_file]>``: a plain name, present, matching its recorded checksum."""
        f = plain_file(path, state[f"{key}_file"], self.state_file)
        if not f.is_file():
            raise StoreError(f"{f}: missing (the store in {path} is incomplete)")
        if sha256_file(f) != state[f"{key}_sha256"]:
            raise StoreError(
                f"{f}: does not match the checksum in {self.state_file} (half-written or modified)"
            )
        return f

    def begin(self, path: Path, empty_state: dict[str, Any]) -> None:
        """Before a save: commit an empty generation 0 first when there is no state yet, so a
        crash during the first real save leaves a store that reopens (empty) and resumes,
        instead of orphan files."""
        path.mkdir(parents=True, exist_ok=True)
        if not self.has_state(path):
            atomic_write_json(path / self.state_file, empty_state)

    def commit(
        self,
        path: Path,
        gen: int,
        blobs: Mapping[str, bytes],
        state: Callable[[dict[str, Any]], dict[str, Any]],
        saved: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Write generation ``gen`` and switch the state file to it; older files are removed.

        ``blobs`` are the file contents by kind; ``saved`` names what this generation keeps
        besides them (a folder written already, ``{"scann_dir": "scann-3"}``, and other state
        fields). ``state(files)`` builds the state document from the file names and checksums.
        Returns those names and checksums.
        """
        self.begin(path, state({}))
        files: dict[str, Any] = dict(saved or {})
        for key, data in blobs.items():
            name = self.files[key].format(gen=gen)
            atomic_write_bytes(path / name, data)
            files[f"{key}_file"] = name
            files[f"{key}_sha256"] = sha256_file(path / name)
        atomic_write_json(path / self.state_file, state(files))
        self.remove_stale(path, {v for v in files.values() if isinstance(v, str)})
        return files

    def remove_stale(self, path: Path, keep: set[str]) -> None:
        """Older generations, and what saves a crash interrupted left behind."""
        stale = [path.glob(f".{self.state_file}.*.tmp")]
        for pattern in self.files.values():
            stale += [path.glob(pattern.format(gen="*")), path.glob(_temp(pattern))]
        for f in itertools.chain(*stale):
            if f.name not in keep:
                f.unlink(missing_ok=True)
        for pattern in self.folders.values():
            for d in itertools.chain(path.glob(pattern.format(gen="*")), path.glob(_temp(pattern))):
                if d.name not in keep and d.is_dir():
                    shutil.rmtree(d, ignore_errors=True)


def _temp(pattern: str) -> str:
    """The temp names a write of ``pattern`` uses (``.records-*.tmp``)."""
    return "." + pattern.split("{gen}")[0] + "*.tmp"


class SavedGenerations:
    """``version`` / ``disk_version`` / ``_begin_write`` / ``close`` of a folder store saved in
    :class:`GenerationFiles` (``_files``) and guarded by a writer lock (``_writer``, None for
    a store held in memory only). The store keeps ``_store_id`` (:func:`~.base.new_store_id`
    when it creates the folder, the state file's otherwise) and writes it into every state.
    List it before ``VectorStore`` in the bases."""

    _files: ClassVar[GenerationFiles]
    #: Attributes an object keeps when it catches up with a newer generation on disk.
    _kept_on_catch_up: ClassVar[tuple[str, ...]] = ("_writer",)
    _path: Path | None
    _writer: Any
    _generation: int
    _store_id: str
    _dirty: bool

    def _reopened(self) -> Any:
        """The store as committed on disk now (a new object of this class)."""
        raise NotImplementedError

    @property
    def version(self) -> StoreVersion | None:
        if self._path is None:
            return None
        return StoreVersion(self._store_id, self._generation)

    def disk_version(self) -> StoreVersion | None:
        return self._files.disk_version(self._path) if self._path is not None else None

    def _begin_write(self) -> None:
        """First write of this object: take the folder's writer lock, then catch up with a
        state another writer committed since this object was opened."""
        if self._writer is None or self._writer.held:
            return
        self._writer.acquire()
        on_disk = self.disk_version()
        if on_disk is not None and on_disk != self.version and not self._dirty:
            kept = {name: getattr(self, name) for name in self._kept_on_catch_up}
            fresh = self._reopened()
            self.__dict__.update(fresh.__dict__)
            self.__dict__.update(kept)

    def close(self) -> None:
        """Release the writer lock; a folder this object created but never saved is removed."""
        if self._writer is not None:
            self._writer.release()
            if self._path is not None and not self._files.has_state(self._path):
                self._writer.discard_empty()
