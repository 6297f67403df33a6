"""The record file of FAISS and ScaNN saves is encoded in slices (other threads run between
them) and reads back as the one ``json.dumps`` would."""

from __future__ import annotations

import json

import pytest

from magretrieve.stores import _record_table


@pytest.mark.parametrize(
    "doc",
    [
        {"records": [], "tombstones": []},
        {"records": [None]},
        {
            "records": [
                ["a", {"x": "é\\u2028"}, 1.5],
                None,
                ["b", {}, 2.0],
                ["c", {"n": [1]}, 0.1],
            ],
            "tombstones": [1],
            "built": 2,
        },
    ],
)
def test_sliced_json_reads_back_as_one_dumps(monkeypatch, doc):
    monkeypatch.setattr(_record_table, "JSON_SLICE", 3)  # 4 records: two slices
    data = _record_table.json_bytes(doc)
    assert json.loads(data) == doc
    assert data == json.dumps(doc).encode()  # byte for byte, key order included
