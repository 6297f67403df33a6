"""The project's own error types.

Every error a *user* can cause (bad files, bad flags, mismatched stores) is a
``MagRetrieveError``. The CLI prints these as one clear line and exits non-zero,
without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class MagRetrieveError(Exception):
    """Base class of every user-facing error raised by magretrieve.

    Messages are redacted on construction (:func:`magretrieve.core.redact.redact`): a
    connection string quoted in an error never shows its password, token or API key.
    """

    def __init__(self, *args: object) -> None:
        from magretrieve.core.redact import redact

        super().__init__(*(redact(a) if isinstance(a, str) else a for a in args))


class DataError(MagRetrieveError):
    """A data file (corpus, queries, qrels, pairs) is malformed; the message names file and line or id."""


class ConfigError(MagRetrieveError):
    """A mode, γ value, flag combination or model folder is invalid."""


class ManifestError(MagRetrieveError):
    """An export folder's manifest is missing, tampered with, or of an unknown version."""


class StoreError(MagRetrieveError):
    """A vector store is misconfigured, incompatible with the model, or corrupt."""


class WriterLockHeld(StoreError):
    """Another process holds the store's writer lock (its message names that process)."""


class SymmetryError(ConfigError):
    """A one-sided mode was asked for on a symmetric task."""


def first_line(exc: BaseException, limit: int = 300) -> str:
    """The first non-empty line of a foreign exception's message (or its type's name), cut.

    onnxruntime, OpenVINO and NNCF put multi-line internal traces into their messages; a
    user-facing error quotes only the first line.
    """
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:limit]
