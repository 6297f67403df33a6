"""The knobs of one server, as the HTTP layer imports them.

They are declared once, with the engine's, in :mod:`magretrieve.serving.settings` (so the command
line reads them without the ``server`` extra); see
:class:`~magretrieve.serving.settings.ServerSettings`.
"""

from __future__ import annotations

from magretrieve.serving.settings import ServerSettings, key_from_env

__all__ = ["ServerSettings", "key_from_env"]
