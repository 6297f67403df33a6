"""Python warnings of client libraries go to the log, not to the CLI user's terminal.

Database clients warn about their own affairs (``qdrant_client``: "Api key is used with an
insecure connection", "Failed to obtain server version"), printed by Python as two lines with
the source line that raised them. The command's own one-line error or result already says
what the user needs; the library's remarks are kept, one line each, in the ``magretrieve.cli``
log at DEBUG level (shown with ``magretrieve -v``), connection secrets masked. Warnings raised by magretrieve itself
(deprecations) are shown as before.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any

from magretrieve.core.redact import redact

log = logging.getLogger("magretrieve.cli")

_OWN = "magretrieve"


def _raiser() -> str:
    """Module name of the code that called ``warnings.warn`` (``""`` if not found)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name not in ("warnings", __name__):
            return name
        frame = frame.f_back  # type: ignore[assignment]
    return ""


def route_library_warnings() -> None:
    """Install the routing (idempotent; the previous ``showwarning`` handles our own)."""
    current = warnings.showwarning
    if getattr(current, "_magretrieve_route", False):
        return

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: Any = None,
        line: str | None = None,
    ) -> None:
        raiser = _raiser()
        if raiser == _OWN or raiser.startswith(_OWN + "."):
            current(message, category, filename, lineno, file, line)
            return
        text = redact(" ".join(str(message).split())) or category.__name__
        log.debug("%s: %s (from %s)", category.__name__, text, raiser or filename)

    show._magretrieve_route = True  # type: ignore[attr-defined]
    warnings.showwarning = show
