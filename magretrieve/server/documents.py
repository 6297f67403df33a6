"""The documents of ``POST /documents``, read by the rule ``magretrieve index`` reads a corpus line.

One rule for both ways in: ``_id`` (a string, or an integer kept as its decimal string),
``text``, an optional ``title``, and every other field kept in the payload under its own name
(``id`` and ``payload`` included). A document posted to the server is stored exactly as the
same line indexed from a corpus file, so filters and payloads do not depend on how a
document came in. Errors name the document's position (``document #N``) instead of a file line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from magretrieve.core.errors import DataError
from magretrieve.data.readers import Document, corpus_document, is_empty
from magretrieve.server.errors import InvalidRequest

#: Stands for the file name in the reader's ``FILE:LINE:`` prefix, replaced by ``document #N``.
_LABEL = Path("documents")


def request_document(obj: Any, position: int) -> Document:
    """Document ``position`` of a request as the corpus reader reads it, or a 422 naming it."""
    if not isinstance(obj, dict):
        raise InvalidRequest(
            f"document #{position}: expected a JSON object, got {type(obj).__name__}"
        )
    try:
        doc = corpus_document(obj, _LABEL, position, skip_empty=True)
    except DataError as exc:
        message = str(exc)
        prefix = f"{_LABEL}:{position}: "
        if message.startswith(prefix):
            message = message[len(prefix) :]
        raise InvalidRequest(f"document #{position}: {message}") from None
    if is_empty(doc):
        raise InvalidRequest(f"document {doc.id!r}: empty title and text")
    return doc
