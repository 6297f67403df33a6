"""One payload filter for every way to search: ``Retriever.search(where=...)``, ``magretrieve
search --where`` and the server's ``/search`` ``filter`` answer the same hits on the same store,
and refuse a malformed filter in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from magretrieve.cli import main
from magretrieve.server import create_app
from magretrieve.serving.errors import InvalidInput
from magretrieve.serving.retriever import Retriever

DOCS = [
    {"_id": "a1", "text": "statins lower cholesterol", "group": "a", "flag": True, "n": 1},
    {"_id": "a2", "text": "statins and heart disease", "group": "a", "flag": 1, "n": 2.0},
    {"_id": "a3", "text": "cholesterol in the blood", "group": "a", "flag": False},
    {"_id": "b1", "text": "wing flow at high speed", "group": "b", "flag": True, "note": None},
    {"_id": "b2", "text": "boundary layer pressure", "group": "b", "n": 1},
    {"_id": "c1", "text": "lung cancer screening", "note": "x"},
]
QUERY = "statins cholesterol"
#: filter -> the ids it keeps, worked out by hand from DOCS (true is not 1, 1 equals 1.0, null
#: matches a field that holds null and not a missing one)
EXPECTED = [
    ({"group": "a"}, {"a1", "a2", "a3"}),
    ({"flag": True}, {"a1", "b1"}),
    ({"flag": 1}, {"a2"}),
    ({"n": 1}, {"a1", "b2"}),
    ({"n": 2}, {"a2"}),
    ({"note": None}, {"b1"}),
    ({"group": "b", "flag": True}, {"b1"}),
    ({"group": "zzz"}, set()),
    ({}, {d["_id"] for d in DOCS}),
]


@pytest.fixture(scope="module")
def indexed(tmp_path_factory, tiny_model_dir) -> tuple[Path, str]:
    from magretrieve.export import export_model

    root = tmp_path_factory.mktemp("filter")
    export = root / "export"
    export_model(tiny_model_dir, export, mode="qnorm", exporter="torchscript", overwrite=True)
    spec = f"faiss:{root / 'ix'}"
    with Retriever.load(export, spec, for_writing=True) as retriever:
        retriever.add_documents(DOCS)
    return export, spec


def python_ids(export: Path, spec: str, where: dict) -> list[str]:
    with Retriever.load(export, spec, create=False) as retriever:
        return [h.id for h in retriever.search(QUERY, k=len(DOCS), where=where)]


def cli_ids(export: Path, spec: str, where: dict) -> list[str]:
    args = ["search", str(export), "--store", spec, QUERY, "-k", str(len(DOCS)), "--json"]
    result = CliRunner().invoke(main, [*args, "--where", json.dumps(where)])
    assert result.exit_code == 0, result.output
    return [h["id"] for h in json.loads(result.stdout)["hits"]]


@pytest.fixture(scope="module")
def client(indexed):
    export, spec = indexed
    with TestClient(create_app(export, spec)) as c:
        yield c


def http_ids(client: TestClient, where: dict) -> list[str]:
    r = client.post("/search", json={"query": QUERY, "k": len(DOCS), "filter": where})
    assert r.status_code == 200, r.text
    return [h["id"] for h in r.json()["hits"]]


@pytest.mark.parametrize("where,expected", EXPECTED, ids=[json.dumps(w) for w, _ in EXPECTED])
def test_python_cli_and_http_keep_the_same_hits(indexed, client, where, expected) -> None:
    export, spec = indexed
    from_python = python_ids(export, spec, where)
    assert set(from_python) == expected
    assert cli_ids(export, spec, where) == from_python  # same hits, same order
    assert http_ids(client, where) == from_python


def test_filtered_hits_are_the_unfiltered_ranking_restricted(indexed) -> None:
    export, spec = indexed
    with Retriever.load(export, spec, create=False) as retriever:
        everything = retriever.search(QUERY, k=len(DOCS))
        kept = retriever.search(QUERY, k=2, where={"group": "a"})
    in_a = [h.id for h in everything if h.payload.get("group") == "a"][:2]
    assert [h.id for h in kept] == in_a and [h.rank for h in kept] == [1, 2]


def test_a_malformed_filter_is_one_line_everywhere(indexed, client) -> None:
    export, spec = indexed
    with Retriever.load(export, spec, create=False) as retriever:
        with pytest.raises(InvalidInput, match="field 'tags' holds a list"):
            retriever.search(QUERY, where={"tags": ["x"]})
        with pytest.raises(InvalidInput, match="where must be an object"):
            retriever.search(QUERY, where=["group"])  # type: ignore[arg-type]
    base = ["search", str(export), "--store", spec, QUERY]
    for where, words in (
        ("[1]", "--where: expected a JSON object of payload field: value, got list"),
        ("{not json", "--where: not JSON"),
        ('{"tags": ["x"]}', "where: field 'tags' holds a list"),
    ):
        result = CliRunner().invoke(main, [*base, "--where", where])
        assert result.exit_code == 1
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and words in lines[0] and "Traceback" not in result.output
    r = client.post("/search", json={"query": QUERY, "filter": {"tags": ["x"]}})
    assert r.status_code == 422 and "filter" in r.json()["error"]["message"]


def test_the_framework_retrievers_filter_the_same_way(indexed) -> None:
    from magretrieve.integrations.haystack import MagRetrieveRetriever as HaystackRetriever
    from magretrieve.integrations.langchain import MagRetrieveRetriever as LangChainRetriever
    from magretrieve.integrations.llama_index import MagRetrieveRetriever as LlamaRetriever

    export, spec = indexed
    where = {"flag": True}
    expected = python_ids(export, spec, where)
    assert set(expected) == {"a1", "b1"}
    k = len(DOCS)
    haystack = HaystackRetriever(export_dir=str(export), store=spec, top_k=k, where=where)
    try:
        assert [d.id for d in haystack.run(QUERY)["documents"]] == expected
        # a filter given to run replaces the component's own
        assert {d.id for d in haystack.run(QUERY, where={"group": "b"})["documents"]} == {
            "b1",
            "b2",
        }
        assert haystack.to_dict()["init_parameters"]["where"] == where
    finally:
        haystack.close()
    with Retriever.load(export, spec, create=False) as retriever:
        chain = LangChainRetriever(retriever=retriever, k=k, where=where)
        assert [d.id for d in chain.invoke(QUERY)] == expected
        assert {d.id for d in chain.invoke(QUERY, where={"note": None})} == {"b1"}
        llama = LlamaRetriever(retriever, similarity_top_k=k, where=where)
        assert [n.node.id_ for n in llama.retrieve(QUERY)] == expected
        with pytest.raises(InvalidInput, match="holds a dict"):
            LlamaRetriever(retriever, where={"x": {"y": 1}})


def test_concurrent_searches_with_other_filters_keep_their_own_hits(indexed, client) -> None:
    """Searches arriving together share store calls only with the same k and filter: each
    concurrent request still gets the hits of its own filter, in the Python order."""
    from concurrent.futures import ThreadPoolExecutor

    export, spec = indexed
    wanted = {json.dumps(w): python_ids(export, spec, w) for w, _ in EXPECTED}
    asked = [w for w, _ in EXPECTED] * 4
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda w: (json.dumps(w), http_ids(client, w)), asked))
    for key, ids in got:
        assert ids == wanted[key], key
    text = client.get("/metrics").text
    calls = float(text.split("magretrieve_search_batch_requests_count ")[1].split()[0])
    merged = float(text.split("magretrieve_search_batch_requests_sum ")[1].split()[0])
    assert 1 <= calls <= merged and merged >= len(asked)  # every request answered
