"""Secrets out of everything magretrieve prints or records: one function for every form.

Store specs and client options carry credentials in the forms libpq, Milvus and Qdrant
accept: URI userinfo (``postgresql://user:PASS@host``), query parameters
(``?password=PASS``, ``&api_key=KEY``, ``token=...``), libpq ``key=value`` connection strings
(``password=PASS`` or ``password='a b\\'c'``), and option mappings (``{"api_key": KEY}``,
``token=...``). :func:`redact` replaces each secret with ``***`` in a string;
:func:`redact_value` does it recursively in JSON-like values (dict keys naming a secret have
their value replaced). Every :class:`~magretrieve.core.errors.MagRetrieveError` message passes
through :func:`redact`, and stores apply it to ``describe()`` and recorded metadata.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MASK = "***"

#: Parameter / option names whose value is a secret (compared case-insensitively).
SECRET_NAMES = (
    "password",
    "passwd",
    "pwd",
    "sslpassword",
    "api_key",
    "api-key",
    "apikey",
    "x-api-key",
    "access_token",
    "auth_token",
    "token",
    "secret",
    "client_secret",
    "key",
)
_NAMES = "|".join(sorted((re.escape(n) for n in SECRET_NAMES), key=len, reverse=True))
# name=value in a query string, a libpq DSN or a log line; the value quoted (libpq style,
# backslash escapes) or up to the next separator
_ASSIGN = re.compile(
    rf"(?i)(?<![\w-])({_NAMES})(\s*=\s*)('(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|[^\s&;#,)'\"]*)"
)
# a mapping repr or JSON: 'api_key': 'KEY' / "token": "KEY" / api_key: KEY
_ITEM = re.compile(
    rf"(?i)(['\"]?)(?<![\w-])({_NAMES})\1(\s*:\s*)('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s,}}\]]+)"
)
# scheme://user:PASSWORD@host (up to the last '@' before the path: a password may hold '@')
_USERINFO = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^:/@?#\s]*):[^/\s]*@")


def redact(text: str) -> str:
    """``text`` with every credential it contains replaced by ``***``."""
    if not isinstance(text, str) or not text:
        return text
    out = _USERINFO.sub(rf"\1:{MASK}@", text)
    out = _ASSIGN.sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}" if m.group(3) else m[0], out)
    return _ITEM.sub(lambda m: f"{m[1]}{m[2]}{m[1]}{m[3]}{_quoted_mask(m[4])}", out)


def _quoted_mask(value: str) -> str:
    return f"{value[0]}{MASK}{value[0]}" if value[:1] in ("'", '"') else MASK


def is_secret_name(name: Any) -> bool:
    return isinstance(name, str) and name.lower() in SECRET_NAMES


def redact_value(value: Any) -> Any:
    """A copy of a JSON-like value with secrets masked (strings redacted, secret keys hidden)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {
            k: (MASK if is_secret_name(k) and v is not None else redact_value(v))
            for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return type(value)(redact_value(v) for v in value)
    return value
