"""The lists of store specs users read are the registry's: the ``magretrieve.stores`` docstring
names every registered form (and no other), and the error for an object ``open_store`` cannot use
is built from the registered backends, so a new backend shows up in it without anyone editing it.
"""

from __future__ import annotations

import re

import pytest

import magretrieve.stores
from magretrieve import open_store
from magretrieve.core.errors import StoreError
from magretrieve.stores import registry


def _docstring_forms() -> list[str]:
    doc = magretrieve.stores.__doc__ or ""
    block = doc.split("Specs (the contract", 1)[1].split("\n\n", 2)[1]
    return [line.split()[0] for line in block.splitlines() if line.strip()]


def test_docstring_lists_every_registered_spec_form_in_order() -> None:
    assert _docstring_forms() == list(registry.spec_forms())


def test_docstring_names_every_adopted_object_kind() -> None:
    doc = magretrieve.stores.__doc__ or ""
    for kind in ("FAISS index", "QdrantClient", "psycopg", "MilvusClient"):
        assert kind in doc
    adopters = {b.prefix for b in registry.backends() if b.adopts is not None}
    assert adopters == {"faiss", "qdrant", "pgvector", "milvus"}


def test_unusable_object_error_lists_every_spec_and_adopted_object() -> None:
    with pytest.raises(StoreError) as info:
        open_store(object())
    message = str(info.value)
    assert message.startswith("cannot use a object as a store; pass a spec (")
    for form in registry.spec_forms():
        assert form in message
    objects = registry.adopted_objects()
    assert len(objects) == 4
    assert message.endswith(f"a VectorStore, {', '.join(objects[:-1])} or {objects[-1]}")
    assert "\n" not in message


def test_unusable_object_error_follows_a_newly_registered_backend(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry.backends()  # load the built-in entries before adding one
    backend = registry.Backend(
        prefix="redis",
        form="redis:URL/INDEX",
        parse=registry.parse_url_collection,
        open=lambda loc, dim, opts: None,
        adopts=lambda obj: False,
        adopt=lambda obj, dim, collection, opts: None,
        adopted="a redis.Redis client (collection=INDEX)",
    )
    monkeypatch.setitem(registry._BACKENDS, "redis", backend)
    with pytest.raises(StoreError) as info:
        open_store(object())
    message = str(info.value)
    assert "redis:URL/INDEX" in message
    assert re.search(r"or a redis\.Redis client \(collection=INDEX\)$", message)


def test_an_adopting_backend_must_name_what_it_adopts() -> None:
    registry.backends()
    half = registry.Backend(
        prefix="half-declared",
        form="half-declared:DIR",
        parse=registry.parse_dir,
        open=lambda loc, dim, opts: None,
        adopts=lambda obj: False,
        adopt=lambda obj, dim, collection, opts: None,
    )
    with pytest.raises(ValueError, match="adopts, adopt and adopted"):
        registry.register(half)
    assert "half-declared" not in registry._BACKENDS
