"""Bearer-key check: constant-time, and only where the key is required.

With a key, every route except the probes and the public facts (``/health``, ``/ready``,
``/info``, ``/metrics``) and the search page with its packaged assets (``/``, ``/static/…``,
which hold no data: the page sends the key itself) needs ``Authorization: Bearer KEY``, which is what the OpenAI client
sends as its ``api_key``. The comparison is :func:`hmac.compare_digest` over the bytes, so the
time taken does not tell how much of a guessed key was right.
"""

from __future__ import annotations

import hmac

#: Routes open without the key (liveness, readiness, the manifest, Prometheus scraping).
OPEN_PATHS = frozenset({"/health", "/ready", "/info", "/metrics", "/"})
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


def needs_key(path: str) -> bool:
    if path.startswith(OPEN_PREFIX) and ".." not in path:
        return False
    return path not in OPEN_PATHS
