"""iter_documents_to_index: the one corpus check both indexing engines run before writing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from magretrieve.core.errors import DataError
from magretrieve.data.readers import iter_documents_to_index


def _corpus(path: Path, *docs: dict) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def test_yields_each_document_with_its_line_and_hands_empty_ones_over(tmp_path: Path) -> None:
    path = _corpus(
        tmp_path / "c.jsonl",
        {"_id": "a", "text": "one"},
        {"_id": "e", "title": "", "text": "  "},
        {"_id": "b", "title": "t", "text": ""},
    )
    empty: list[str] = []
    got = [
        (line, d.id)
        for line, d in iter_documents_to_index(path, skip_empty=True, on_empty=empty.append)
    ]
    assert got == [(1, "a"), (3, "b")] and empty == ["e"]
    with pytest.raises(
        DataError, match=r"c.jsonl:2: document 'e' has empty title and text .*--skip-empty"
    ):
        list(iter_documents_to_index(path))


def test_a_duplicate_id_names_both_lines(tmp_path: Path) -> None:
    path = _corpus(
        tmp_path / "c.jsonl",
        {"_id": "a", "text": "x"},
        {"_id": "b", "text": "y"},
        {"_id": "a", "text": "z"},
    )
    with pytest.raises(
        DataError, match=r"c.jsonl:3: duplicate document id 'a' \(first on line 1\)"
    ):
        list(iter_documents_to_index(path))


def test_the_ray_engine_counts_through_it(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    from magretrieve.engines.ray_engine import check_corpus

    path = _corpus(
        tmp_path / "c.jsonl",
        {"_id": "a", "text": "x"},
        {"_id": "e", "text": ""},
        {"_id": "b", "text": "y"},
    )

    class Store:
        def existing(self, ids: list[str]) -> set[str]:
            return {i for i in ids if i == "b"}

    class Retriever:
        store = Store()

    assert check_corpus(Retriever(), path, skip_empty=True) == (2, {"b"}, ["e"])  # type: ignore[arg-type]
    with pytest.raises(DataError, match="no document to index"):
        check_corpus(Retriever(), _corpus(tmp_path / "e.jsonl", {"_id": "e", "text": ""}), True)  # type: ignore[arg-type]
