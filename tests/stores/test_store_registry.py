"""The lists of store specs users read are the registry's: the ``magretrieve.stores`` docstring
names every registered form (and no other), and the error for an object ``open_store`` cannot use
is built from the registered backends, so a new backend shows up in it without anyone editing it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

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
        form="redis:URL/INDEX",
        parse=registry.parse_url_collection,
        open=lambda loc, dim, **opts: None,
        adopts=("redis", "Redis"),
        adopt=lambda obj, collection, dim, **opts: None,
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
        form="half-declared:DIR",
        parse=registry.parse_dir,
        open=lambda loc, dim, **opts: None,
        adopts=("redis", "Redis"),
        adopt=lambda obj, collection, dim, **opts: None,
    )
    with pytest.raises(ValueError, match="adopts, adopt and adopted"):
        registry.register(half)
    assert "half-declared" not in registry._BACKENDS


class MilvusClient:  # the class name pymilvus uses, declared in another module
    pass


def test_an_adopted_object_is_recognised_by_its_module_and_class_name() -> None:
    milvus = next(b for b in registry.backends() if b.prefix == "milvus")
    assert milvus.adopts == ("pymilvus", "MilvusClient")
    assert not milvus.adopts_object(MilvusClient())  # right name, wrong module
    fake = type("MilvusClient", (), {"__module__": "pymilvus.milvus_client"})()
    assert milvus.adopts_object(fake)
    other = type("Collection", (), {"__module__": "pymilvus.orm"})()
    assert not milvus.adopts_object(other)  # right module, wrong class


@pytest.mark.parametrize(
    ("module", "name", "message"),
    [
        (
            "pymilvus.milvus_client",
            "MilvusClient",
            "a pymilvus MilvusClient needs collection='name'",
        ),
        ("qdrant_client.qdrant_client", "QdrantClient", "a QdrantClient needs collection='name'"),
        ("psycopg", "Connection", "a psycopg connection needs collection='table'"),
    ],
)
def test_open_object_refuses_a_missing_collection_for_every_backend(
    module: str, name: str, message: str
) -> None:
    client = type(name, (), {"__module__": module})()
    with pytest.raises(StoreError) as info:
        registry.open_object(client, 4, None, {})
    assert str(info.value) == message


def test_client_options_are_checked_then_dropped_for_an_adopted_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    milvus = next(b for b in registry.backends() if b.prefix == "milvus")
    seen: list[tuple[Any, ...]] = []

    def adopt(obj: Any, collection: str, dim: int, **opts: Any) -> None:
        seen.append((collection, dim, opts))

    monkeypatch.setitem(registry._BACKENDS, "milvus", dataclasses.replace(milvus, adopt=adopt))
    client = type("MilvusClient", (), {"__module__": "pymilvus"})()
    registry.open_object(client, 8, "docs", {"token": "user:pw", "hnsw_m": 16})
    assert seen == [("docs", 8, {"hnsw_m": 16})]
    with pytest.raises(StoreError, match=r"--hnsw-m must be >= 2, got 1"):
        registry.open_object(client, 8, "docs", {"hnsw_m": 1})


def test_the_shape_of_a_form_picks_the_parser_when_none_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    registry.backends()
    redis = registry.Backend(form="redis:URL/COLLECTION", open=lambda loc, dim, **opts: None)
    assert redis.prefix == "redis"
    monkeypatch.setitem(registry._BACKENDS, "redis", redis)
    assert registry.backend_for("redis:http://h:6379/docs")[1] == {
        "url": "http://h:6379",
        "collection": "docs",
    }
    with pytest.raises(StoreError, match="missing collection name"):
        registry.backend_for("redis:http://h:6379")
    odd = registry.Backend(form="odd:URI#TABLE", open=lambda loc, dim, **opts: None)
    with pytest.raises(ValueError, match="no parser for the form 'odd:URI#TABLE'; give parse="):
        registry.register(odd)
    assert "odd" not in registry._BACKENDS
