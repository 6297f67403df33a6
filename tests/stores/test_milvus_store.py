"""Milvus Lite (embedded, ``milvus:PATH.db/COLLECTION``): the rules only this backend has.

Metric IP and scores equal to inner products, COSINE/L2 collections refused, the JSON payload
and ``doc_norm`` fields, metadata in the collection properties, the id length limit, and the
two spec forms. The shared add/search/delete/reload sequence runs in
``tests/stores/test_stores.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from pymilvus import DataType, MilvusClient

from magretrieve.core.errors import StoreError
from magretrieve.stores import open_store
from magretrieve.stores.milvus_store import parse_milvus

pytestmark = pytest.mark.integration

DIM = 16


def data(n: int = 200, nq: int = 15, seed: int = 0):
    rng = np.random.default_rng(seed)
    docs = rng.normal(size=(n, DIM)).astype(np.float32)
    docs *= rng.uniform(0.2, 5.0, size=(n, 1)).astype(np.float32)
    queries = rng.normal(size=(nq, DIM)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return [f"doc-{i}" for i in range(n)], docs, queries


def test_scores_are_inner_products_with_payload_and_norm(tmp_path):
    ids, docs, queries = data()
    with open_store(f"milvus:{tmp_path / 'm.db'}/docs", dimension=DIM) as store:
        store.add(ids, docs, [{"n": i} for i in range(len(ids))])
        hits = store.search(queries, 5)
        for q, row in zip(queries, hits, strict=True):
            rows = [int(h.id.split("-")[1]) for h in row]
            assert rows == list(np.argsort(-(docs @ q), kind="stable")[:5])
            np.testing.assert_allclose([h.score for h in row], docs[rows] @ q, atol=1e-4)
            assert row[0].payload == {"n": rows[0]}
        norms = store.client.get("docs", ids=["doc-3"], output_fields=["doc_norm"])
        assert norms[0]["doc_norm"] == pytest.approx(float(np.linalg.norm(docs[3])), rel=1e-6)
        assert store.parameters()["metric"] == "IP"


@pytest.mark.parametrize("metric", ["COSINE", "L2"])
def test_collection_with_another_metric_is_refused(tmp_path, metric):
    client = MilvusClient(str(tmp_path / "m.db"))
    schema = client.create_schema(auto_id=False)
    schema.add_field("doc_id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("payload", DataType.JSON)
    schema.add_field("doc_norm", DataType.FLOAT)
    index = client.prepare_index_params()
    index.add_index("vector", index_type="FLAT", metric_type=metric)
    client.create_collection("theirs", schema=schema, index_params=index)
    client.close()
    with pytest.raises(StoreError, match=f"metric {metric}.*needs IP"):
        open_store(f"milvus:{tmp_path / 'm.db'}/theirs", dimension=DIM)


def test_a_collection_without_recorded_build_options_keeps_only_its_index_type(tmp_path):
    """A collection whose build options were never recorded (another program built it, or an
    older magretrieve): its index type, which Milvus reports, is still checked; its
    parameters are unknown and any are accepted."""
    client = MilvusClient(str(tmp_path / "m.db"))
    schema = client.create_schema(auto_id=False)
    schema.add_field("doc_id", DataType.VARCHAR, is_primary=True, max_length=64)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=DIM)
    schema.add_field("payload", DataType.JSON)
    schema.add_field("doc_norm", DataType.FLOAT)
    index = client.prepare_index_params()
    index.add_index("vector", index_type="HNSW", metric_type="IP", params={"M": 8})
    client.create_collection("older", schema=schema, index_params=index)
    client.close()
    spec = f"milvus:{tmp_path / 'm.db'}/older"
    with pytest.raises(StoreError, match=r"IVF_FLAT differs from the HNSW .*cannot change"):
        open_store(spec, dimension=DIM, index_type="IVF_FLAT")
    with open_store(spec, dimension=DIM, index_type="HNSW", hnsw_m=24) as store:
        assert store.parameters()["index_type"] == "HNSW"


def test_metadata_and_points_survive_a_new_process(tmp_path):
    ids, docs, _ = data(n=30)
    spec = f"milvus:{tmp_path / 'm.db'}/docs"
    with open_store(spec, dimension=DIM) as store:
        store.add(ids, docs)
        store.write_metadata({"model_fingerprint": "abc", "mode": "qnorm"})
        store.persist()
    code = (
        "import sys, json\n"
        "from magretrieve.stores import open_store\n"
        "s = open_store(sys.argv[1])\n"
        "print(json.dumps([s.count(), s.read_metadata(), s.dimension]))\n"
        "s.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code, spec], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert json.loads(last) == [30, {"model_fingerprint": "abc", "mode": "qnorm"}, 16]


def test_long_id_and_dimension_mismatch_refused(tmp_path):
    spec = f"milvus:{tmp_path / 'm.db'}/docs"
    with open_store(spec, dimension=DIM) as store:
        with pytest.raises(StoreError, match="longer than 1024 bytes; nothing was written"):
            store.add(["ok", "x" * 2000], np.ones((2, DIM), dtype=np.float32))
        assert store.count() == 0
    with pytest.raises(StoreError, match="vector size 16.*dimension 8"):
        open_store(spec, dimension=8)


def test_spec_forms():
    assert parse_milvus("data/m.db/scifact") == {"path": "data/m.db", "collection": "scifact"}
    assert parse_milvus("http://localhost:19530/scifact") == {
        "url": "http://localhost:19530",
        "collection": "scifact",
    }
    for bad in ("http://localhost:19530", "data/m.db", "folder/scifact"):  # Lite needs PATH.db
        with pytest.raises(StoreError, match="milvus:PATH.db/COLLECTION"):
            parse_milvus(bad)
    with pytest.raises(StoreError, match="milvus:PATH.db/COLLECTION"):
        open_store("milvus:nowhere", dimension=4)


def test_a_file_where_the_lite_folder_goes_is_one_store_error(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(StoreError, match=r"milvus:.*afile/x.db/col: cannot make the folder"):
        open_store(f"milvus:{tmp_path / 'afile' / 'x.db'}/col", dimension=DIM)
    assert (tmp_path / "afile").read_text() == "x"
