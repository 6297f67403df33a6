"""The per-document numbers a field prior reads: payload fields and the document's own length.

A corpus or a store carries a payload per document (``citations``, ``year``, a click count,
a quality grade, ...). :class:`DocumentFields` reads one field as a float column (NaN where a
document lacks it) and refuses, in one line naming the field and the documents at fault, a
field that no document has, a value that is not a number, NaN or infinite. ``_length`` is not
a payload field: it is the number of words of the document's title and text.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from magretrieve.core.errors import DataError

#: The derived field: words in the document's title and text (whitespace-separated).
LENGTH_FIELD = "_length"
#: Document ids quoted in an error before "and N more".
SHOWN_IDS = 5
#: Payload keys that are never a prior's field (the id, and the text the length counts).
NOT_FIELDS = frozenset({"_id", "id", "title", "text"})


def quote_ids(ids: Sequence[str], total: int | None = None) -> str:
    """``'a', 'b' and 3 more``: the first few ids of the documents at fault."""
    total = len(ids) if total is None else total
    shown = ", ".join(repr(str(i)) for i in ids[:SHOWN_IDS])
    return shown + (f" and {total - SHOWN_IDS} more" if total > SHOWN_IDS else "")


def is_number(value: Any) -> bool:
    """A JSON number (booleans are not numbers here)."""
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def word_count(payload: Mapping[str, Any]) -> int:
    """Words of the document's title and text."""
    return len(f"{payload.get('title') or ''} {payload.get('text') or ''}".split())


class DocumentFields:
    """The payloads of a corpus (aligned with its document ids), read a column at a time.

    Columns are cached: choosing a prior reads the same field for every candidate.
    """

    def __init__(self, ids: Sequence[str], payloads: Sequence[Mapping[str, Any]]) -> None:
        if len(ids) != len(payloads):
            raise ValueError(f"{len(ids)} ids for {len(payloads)} payloads")
        self.ids = [str(i) for i in ids]
        self.payloads = list(payloads)
        self._columns: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def column(self, name: str, require_any: bool = True) -> np.ndarray:
        """The field as float64 (NaN: the document lacks it or holds null).

        Raises one DataError naming the field and the documents at fault when a value is not
        a number, NaN or infinite, or (``require_any``) when no document has the field.
        """
        if name in self._columns:
            out = self._columns[name]
            if require_any and np.isnan(out).all():
                raise self._missing(name)
            return out
        if name == LENGTH_FIELD:
            out = np.array([word_count(p) for p in self.payloads], dtype=np.float64)
            self._columns[name] = out
            return out
        out = np.full(len(self.ids), np.nan)
        wrong: list[int] = []
        not_finite: list[int] = []
        for row, payload in enumerate(self.payloads):
            value = payload.get(name)
            if value is None:
                continue
            if not is_number(value):
                wrong.append(row)
            elif not math.isfinite(float(value)):
                not_finite.append(row)
            else:
                out[row] = float(value)
        if wrong:
            first = self.payloads[wrong[0]][name]
            raise DataError(
                f"field {name!r} is not a number in {len(wrong)} document(s): "
                f"{quote_ids([self.ids[r] for r in wrong])} (e.g. {_short(first)})"
            )
        if not_finite:
            raise DataError(
                f"field {name!r} is NaN or infinite in {len(not_finite)} document(s): "
                f"{quote_ids([self.ids[r] for r in not_finite])}"
            )
        self._columns[name] = out
        if require_any and np.isnan(out).all():
            raise self._missing(name)
        return out

    def _missing(self, name: str) -> DataError:
        return DataError(
            f"field {name!r} is missing from all {len(self.ids)} documents ({quote_ids(self.ids)})"
        )

    def ids_where(self, mask: np.ndarray) -> list[str]:
        return [self.ids[r] for r in np.flatnonzero(mask)]

    def numeric_fields(self) -> list[str]:
        """Fields a prior could use: every value present is a finite number, at least two
        values differ; then the document's length (when it varies). Sorted by name."""
        names: set[str] = set()
        for payload in self.payloads:
            names.update(k for k in payload if isinstance(k, str) and k not in NOT_FIELDS)
        usable = []
        for name in sorted(names):
            if name == LENGTH_FIELD:
                continue
            try:
                values = self.column(name)
            except DataError:
                continue
            present = values[~np.isnan(values)]
            if present.size and present.min() < present.max():
                usable.append(name)
        length = self.column(LENGTH_FIELD)
        if length.size and length.min() < length.max():
            usable.append(LENGTH_FIELD)
        return usable


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
