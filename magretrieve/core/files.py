"""File helpers every layer shares: content hashes and the plain-file-name rule.

Exports, stores and run folders record their files by name and sha256; the name comes from
data on disk (a manifest, a store's state file), so it must be a plain name inside the folder
the user chose — never ``../x`` or ``/x``, which would make loading read a file the user
never pointed at.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

__all__ = ["sha256_file", "sha256_hex", "is_plain_file_name"]


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's content, read in chunks (graphs can be hundreds of MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def sha256_hex(data: bytes | str) -> str:
    """Hex sha256 of bytes, or of a string's UTF-8 encoding."""
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()


def is_plain_file_name(name: Any) -> bool:
    """True for a non-empty string naming a file directly inside a folder.

    Refused: non-strings, ``""``, ``.``, ``..``, anything with ``/`` or ``\\`` (so no
    absolute or nested path on any platform) and NUL bytes.
    """
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\x00" not in name
        and not Path(name).is_absolute()
    )
