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
    rf"(?i)(?<![\w-])({_NAMES})(\s*=\s*)('(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?|(?:\\.|[^\s&;#,)'\"\\])*)"
)
# a mapping repr or JSON: 'api_key': 'KEY' / "token": "KEY" (the name quoted, so prose such
# as "unknown key: 'x'" is left alone)
_ITEM = re.compile(
    rf"(?i)(['\"])({_NAMES})\1(\s*:\s*)('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|[^\s,}}\]]+)"
)
# scheme://user:PASSWORD@host (up to the last '@' before the path: a password may hold '@')
_USERINFO = re.compile(r"(?i)([a-z][a-z0-9+.-]*://[^:/@?#\s]*):[^/\s]*@")
_USERINFO_PASSWORD = re.compile(r"(?i)[a-z][a-z0-9+.-]*://[^:/@?#\s]*:([^/\s]*)@")


#: Secrets seen in specs and options of this process (see :func:`remember_secrets`): a
#: driver may quote part of one in a form no pattern knows (libpq names the "host" it failed
#: to resolve after splitting ``u:pa@ss@host`` at the first ``@``).
_KNOWN: set[str] = set()
#: Shorter values are not remembered (masking every "ab" would garble messages).
MIN_REMEMBERED = 4


def remember_secrets(text: str | None = None, options: Mapping[str, Any] | None = None) -> None:
    """Remember the credentials in a spec / connection string and in secret-named options, so
    :func:`redact` masks them wherever they (or their ``@``-separated parts) appear later."""
    found: list[str] = []
    if isinstance(text, str):
        for m in _USERINFO_PASSWORD.finditer(text):
            found.append(m.group(1))
            found.extend(m.group(1).split("@"))
        for m in _ASSIGN.finditer(text):
            value = m.group(3).strip("'\"")
            found.append(value)
            found.extend(value.replace("\\'", "'").split())
    for key, value in (options or {}).items():
        if is_secret_name(key) and isinstance(value, str):
            found.append(value)
            found.extend(value.split(":"))
    _KNOWN.update(f for f in found if len(f) >= MIN_REMEMBERED)


def redact(text: str) -> str:
    """``text`` with every credential it contains replaced by ``***``."""
    if not isinstance(text, str) or not text:
        return text
    out = text
    for known in sorted(_KNOWN, key=len, reverse=True):
        if known in out:
            out = out.replace(known, MASK)
    out = _USERINFO.sub(rf"\1:{MASK}@", out)
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
