"""The errors of the embedding engine (:mod:`magretrieve.serving.engine`), typed by what went wrong.

Each one is a :class:`~magretrieve.core.errors.MagRetrieveError` (a one-line message naming the
input at fault), so an in-process caller catches them like any other user error, and the HTTP
server maps each class to its status code in one table (:data:`magretrieve.server.errors.STATUS`)
instead of choosing a code where the error is raised.
"""

from __future__ import annotations

from magretrieve.core.errors import MagRetrieveError


class InvalidInput(MagRetrieveError):
    """A call is refused as sent: no texts, a blank one, a side that does not exist, a
    malformed payload filter."""


class InputTooLarge(MagRetrieveError):
    """Too many texts, a text over the character limit, or one over the side's max length
    while cutting it was refused."""


class Overloaded(MagRetrieveError):
    """The engine takes no more texts now; the same call may succeed later."""


class QueueFull(Overloaded):
    """More calls are waiting for the graphs than the engine's ``max_queue``."""


class Draining(Overloaded):
    """The engine (or the server around it) is shutting down and takes no new calls."""
