"""Two facts about a text that every layer checks the same way: does it hold a lone surrogate
(not Unicode), and does it hold anything to encode."""

from __future__ import annotations

import unicodedata

#: Unicode categories no tokenizer reads as content: controls, format characters (zero-width
#: spaces and joiners, the BOM), separators, and combining marks without a base character.
_INVISIBLE = frozenset({"Cc", "Cf", "Zs", "Zl", "Zp", "Mn", "Me"})


def blank(text: str) -> bool:
    """True when ``text`` holds nothing to encode: only whitespace, controls, zero-width and
    other format characters, or combining marks. Such a text tokenizes to the special tokens
    alone, and every one of them gets the same vector."""
    return all(c.isspace() or unicodedata.category(c) in _INVISIBLE for c in text)


def lone_surrogate(text: str) -> int | None:
    """Position of the first lone surrogate in ``text`` (``\\udc80`` etc.), or None.

    A lone surrogate is a valid JSON escape and what Python makes of a mis-encoded shell
    argument, but not Unicode text: tokenizers, UTF-8 encoders, databases and JSON writers
    fail on it.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None
