"""The HTTP service over an export and its store (``magretrieve serve``; extra ``server``).

HTTP only: FastAPI + uvicorn + pydantic in front of the serving layer, which does the work —
:class:`~magretrieve.serving.engine.EmbeddingEngine` (limits, tokenizing, dynamic batching,
the graphs) and :class:`~magretrieve.serving.retriever.Retriever` (search, the payload filter,
writes). One module per job: :mod:`.app` (the factory), :mod:`.models` (request/response
bodies), :mod:`.sides` (the side rules), :mod:`.auth`, :mod:`.middleware`, :mod:`.metrics`,
:mod:`.errors` (typed errors to status codes, one table), :mod:`.state`, :mod:`.store_holder`
(store calls, reloads, shutdown), :mod:`.documents` (the corpus line rule of ``/documents``),
:mod:`.connections` (idle and slow connections), and the routes in ``routes_*``.
"""

from __future__ import annotations

from typing import Any

from magretrieve.core.extras import require_all

__all__ = ["create_app"]

#: The modules of the ``server`` extra; without them the layer refuses in one line (MissingExtra).
REQUIRED = ("fastapi", "starlette", "pydantic", "uvicorn", "orjson", "prometheus_client")
require_all(REQUIRED, what="magretrieve serve", extra="server")


def create_app(*args: Any, **kwargs: Any) -> Any:
    """See :func:`magretrieve.server.app.create_app` (imported on first call: FastAPI is an extra)."""
    from magretrieve.server.app import create_app as _create_app

    return _create_app(*args, **kwargs)
