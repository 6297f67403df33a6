"""Bearer-key check: constant-time, and only where the key is required.

With a key, every route except the probes and the public facts (``/health``, ``/ready``,
``/info``, ``/metrics``), the search page and the API docs with its schema and their packaged
assets (``/``, ``/docs``, ``/openapi.json``, ``/static/…``, which hold no data: the pages send
the key themselves), read with GET or HEAD, needs
``Authorization: Bearer KEY``, which is what the OpenAI client sends as its ``api_key``. The
comparison is :func:`hmac.compare_digest` over the bytes, so the time taken does not tell how
much of a guessed key was right.
"""

from __future__ import annotations

import hmac

#: Routes open without the key (liveness, readiness, the manifest, Prometheus scraping, the
#: search page, the API docs and the schema they read: the same for every server of a version).
OPEN_PATHS = frozenset({"/health", "/ready", "/info", "/metrics", "/", "/docs", "/openapi.json"})
#: Methods the open paths are open for: reading only. ``POST /`` (TEI's ``/embed`` alias)
#: encodes texts and needs the key like every other encoding route.
OPEN_METHODS = frozenset({"GET", "HEAD"})
#: Prefix of the packaged page assets (scripts, styles, Swagger UI), open like the page.
OPEN_PREFIX = "/static/"


def authorized(header: bytes | None, key: bytes) -> bool:
    """Whether an ``Authorization`` header value carries the key as a bearer token."""
    if not header:
        return False
    scheme, _, token = header.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(token.strip(), key)


def needs_key(path: str, method: str = "GET") -> bool:
    """Whether a request needs the key: everything but reading the open paths and assets."""
    if method.upper() not in OPEN_METHODS:
        return True
    if path.startswith(OPEN_PREFIX) and ".." not in path:
        return False
    return path not in OPEN_PATHS
