"""The record table of the stores that keep their own index (FAISS, ScaNN): string ids,
payloads and norms per int64 row (the FAISS id, the ScaNN row).

FAISS knows vectors by int64 ids; the store gives id ``n`` to the ``n``-th record ever added,
so the table is a list indexed by FAISS id. A record is ``[doc_id, payload, doc_norm]`` or
``None`` once deleted/replaced. ``doc_norm`` is the stored vector's exact norm, kept here so a
search never reconstructs vectors (and stays exact under lossy codes such as PQ). Indexes that
cannot remove ids (HNSW) get tombstones: FAISS ids filtered out of results.

The ScaNN store keeps the same table, by row number. :class:`RecordTableMixin` gives both
stores the id-map primitives read from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from magretrieve.stores.base import IdMapMixin

#: Records encoded per ``json.dumps`` call by :func:`json_bytes`.
JSON_SLICE = 20_000


def json_bytes(doc: Mapping[str, Any], key: str = "records") -> bytes:
    """``json.dumps(doc).encode()`` for a document whose ``key`` holds a long list, encoded
    :data:`JSON_SLICE` items at a time. One ``json.dumps`` holds the GIL until it is done (about a
    second for a million records), so a save that runs beside searches would stall them;
    between slices other threads run."""
    items = doc[key]
    parts = [json.dumps(items[i : i + JSON_SLICE])[1:-1] for i in range(0, len(items), JSON_SLICE)]
    rest = json.dumps({k: v for k, v in doc.items() if k != key})[1:-1]
    text = f'{{"{key}": [' + ", ".join(parts) + "]" + (f", {rest}" if rest else "") + "}"
    return text.encode()


class RecordTable:
    """``records[fid] = [doc_id, payload, doc_norm] | None``, ``row[doc_id] = fid``, tombstones."""

    def __init__(self) -> None:
        self.records: list[list[Any] | None] = []
        self.row: dict[str, int] = {}
        self.tombstones: set[int] = set()

    def __len__(self) -> int:
        return len(self.row)

    @property
    def next_fid(self) -> int:
        return len(self.records)

    def fids_of(self, ids: Sequence[str]) -> list[int]:
        return [self.row[i] for i in ids if i in self.row]

    def append(
        self, ids: Sequence[str], payloads: Sequence[Mapping[str, Any]], norms: np.ndarray
    ) -> np.ndarray:
        """Give the batch the next FAISS ids; returns them."""
        start = len(self.records)
        fids = np.arange(start, start + len(ids), dtype=np.int64)
        for doc_id, payload, norm, fid in zip(ids, payloads, norms, fids, strict=True):
            self.records.append([doc_id, dict(payload), float(norm)])
            self.row[doc_id] = int(fid)
        return fids

    def drop(self, fids: Sequence[int], *, tombstone: bool) -> None:
        """Forget records (``tombstone``: the index still holds their vectors)."""
        for fid in fids:
            rec = self.records[fid]
            if rec is not None:
                self.row.pop(rec[0], None)
            self.records[fid] = None
            if tombstone:
                self.tombstones.add(int(fid))

    def live(self, fid: int) -> list[Any] | None:
        if fid < 0 or fid in self.tombstones or fid >= len(self.records):
            return None
        return self.records[fid]

    def to_json(self) -> dict[str, Any]:
        return {"records": self.records, "tombstones": sorted(self.tombstones)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordTable:
        """Records of format 1 (``[doc_id, payload]``) get their norm filled in on first use."""
        table = cls()
        table.records = list(data["records"])
        table.tombstones = {int(t) for t in data["tombstones"]}
        for n, rec in enumerate(table.records):
            if rec is None:
                continue
            if not isinstance(rec, list) or len(rec) not in (2, 3) or not isinstance(rec[1], dict):
                raise ValueError(f"record {n} is not [doc_id, payload, doc_norm]")
            table.row[str(rec[0])] = n
        return table

    @classmethod
    def sequential(cls, norms: np.ndarray) -> RecordTable:
        """Records ``'0'..'n-1'`` for an adopted index that holds unnamed vectors."""
        table = cls()
        table.records = [[str(i), {}, float(n)] for i, n in enumerate(norms)]
        table.row = {str(i): i for i in range(len(norms))}
        return table


class RecordTableMixin(IdMapMixin):
    """Id-map primitives of a store that keeps its own :class:`RecordTable` in ``_table``.

    The ids, the count and deletion are read from the table; the store implements
    :meth:`_drop_rows`, which takes the rows' vectors out of its index (or leaves them there
    as tombstones) and drops their records. List it before ``VectorStore`` in the bases.
    """

    _table: RecordTable

    @property
    def _row(self) -> dict[str, int]:  # type: ignore[override]
        return self._table.row

    def _drop_rows(self, rows: list[int]) -> None:
        """Forget these rows of the table (live rows, each once)."""
        raise NotImplementedError

    def _delete(self, ids: list[str]) -> int:
        with self._lock:
            rows = self._table.fids_of(ids)
            if rows:
                self._begin_write()
                self._drop_rows(rows)
                self._dirty = True
            return len(rows)

    def _count(self) -> int:
        return len(self._table)
