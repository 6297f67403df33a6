"""LanceDB (``lancedb:PATH/TABLE``): the rules only this backend has.

Distance ``dot`` and scores equal to inner products (LanceDB reports ``1 − q·d``; the
quantized kinds re-rank by the full vectors), the exact scan by default, a batch of queries
answered as each query alone, IVF_HNSW_SQ behind the measured-recall check (tuned to a
target: ``refine_factor``, then ``nprobe``, then ``ef_search``), IVF_PQ refused with its
measured recall unless forced or re-ranked to a target, a cosine-indexed table refused, ids
that are not SQL-safe, and the metadata surviving a new process. The shared
add/search/delete sequence runs in ``tests/stores/test_stores.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import lancedb
import numpy as np
import pytest
from lancedb.index import IvfFlat

from magretrieve.core.errors import StoreError
from magretrieve.stores import _ann_recall, lancedb_store, open_store
from tests.support.ann_data import search_indexes_at_every_size

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def indexed(monkeypatch):
    """These tests are about the index itself: it answers at their sizes (a few thousand rows,
    below the store's exact_below)."""
    search_indexes_at_every_size(monkeypatch)


DIM = 16


def data(n: int = 200, nq: int = 15, dim: int = DIM, seed: int = 0):
    rng = np.random.default_rng(seed)
    docs = rng.normal(size=(n, dim)).astype(np.float32)
    docs *= rng.uniform(0.2, 5.0, size=(n, 1)).astype(np.float32)
    queries = rng.normal(size=(nq, dim)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return [f"doc-{i}" for i in range(n)], docs, queries


def recall(store, queries, docs, ids) -> float:
    exact = [[ids[j] for j in np.argsort(-(docs @ q), kind="stable")[:10]] for q in queries]
    found = [[h.id for h in row] for row in store.search(queries, 10, with_vectors=False)]
    return float(np.mean([len(set(f) & set(e)) / 10 for f, e in zip(found, exact, strict=True)]))


def test_exact_scan_by_default_scores_are_inner_products(tmp_path):
    ids, docs, queries = data()
    with open_store(f"lancedb:{tmp_path / 'l'}/docs", dimension=DIM) as store:
        store.add(ids, docs, [{"n": i} for i in range(len(ids))])
        store.optimize()  # no index asked for: stays an exact scan
        assert store.parameters()["index"] == "exact scan"
        for q, row in zip(queries, store.search(queries, 5), strict=True):
            rows = [int(h.id.split("-")[1]) for h in row]
            assert rows == list(np.argsort(-(docs @ q), kind="stable")[:5])
            np.testing.assert_allclose([h.score for h in row], docs[rows] @ q, atol=1e-4)
            assert row[0].payload == {"n": rows[0]}
        # what LanceDB itself reports is the distance 1 − q·d
        raw = store.tbl.search(queries[0]).distance_type("dot").limit(1).to_arrow()
        top = float(np.max(docs @ queries[0]))
        assert raw["_distance"][0].as_py() == pytest.approx(1.0 - top, abs=1e-4)


def test_ids_are_sql_literals_not_expressions(tmp_path):
    ids = ["a' OR '1'='1", "b", "c"]
    vecs = np.eye(3, DIM, dtype=np.float32) * np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
    with open_store(f"lancedb:{tmp_path / 'l'}/docs", dimension=DIM) as store:
        store.add(ids, vecs)
        assert store.existing(["a' OR '1'='1"]) == {"a' OR '1'='1"}
        assert store.existing(["x' OR '1'='1"]) == set()
        assert store.delete(["x' OR '1'='1"]) == 0 and store.count() == 3
        assert store.delete(["a' OR '1'='1"]) == 1 and sorted(store.iter_ids()) == ["b", "c"]


def test_ivf_hnsw_sq_is_measured_and_tuned_to_a_target(tmp_path):
    ids, docs, queries = data(n=3000, nq=60, dim=32, seed=1)
    spec = f"lancedb:{tmp_path / 'l'}/ann"
    store = open_store(
        spec, dimension=32, index_type="IVF_HNSW_SQ", nlist=4, hnsw_m=16, ef_construction=64,
        target_recall=0.95,
    )  # fmt: skip
    store.add(ids, docs)
    store.optimize()
    p = store.parameters()
    assert p["index"] == "IVF_HNSW_SQ" and p["hnsw_m"] == 16
    rec = p["recall"]
    assert rec["target"] == 0.95 and rec["ef_search"] == store.ef_search
    assert rec["recall_at_10"] >= 0.95, rec
    assert recall(store, queries, docs, ids) >= 0.93  # held-out queries agree
    store.close()
    again = open_store(spec)
    assert again.ef_search == rec["ef_search"]  # the tuned value is the table's own
    assert again.parameters()["recall"] == rec


def test_ivf_pq_is_refused_with_its_measured_recall_unless_forced(tmp_path):
    ids, docs, queries = data(n=3000, nq=60, dim=32, seed=2)
    spec = f"lancedb:{tmp_path / 'l'}/pq"
    store = open_store(spec, dimension=32, index_type="IVF_PQ", nlist=4)
    store.add(ids, docs)
    with pytest.raises(StoreError, match=r"IVF_PQ measured recall@10 0\.\d+ .*--force") as err:
        store.optimize()
    assert "\n" not in str(err.value)
    measured = float(str(err.value).split("recall@10 ")[1].split()[0])
    assert measured < 0.95
    assert "--target-recall 0.99 (tunes refine_factor, nprobe" in str(err.value)
    # the index is gone and nothing was lost: the table is searched exactly
    assert store.parameters()["index"] == "exact scan" and store.count() == 3000
    assert recall(store, queries, docs, ids) == 1.0
    store.close()
    forced = open_store(spec, index_type="IVF_PQ", nlist=4, force=True)
    forced.optimize()
    p = forced.parameters()
    assert p["index"] == "IVF_PQ" and p["recall"]["recall_at_10"] < 0.95
    assert "warning" in p["recall"]


def test_ivf_pq_asked_for_a_target_reaches_it_by_re_ranking(tmp_path):
    """Probing every partition is not enough for PQ codes (the refused index above probes all
    4); re-ranking more candidates by the full vectors is, and the factor is the table's own."""
    ids, docs, queries = data(n=3000, nq=60, dim=32, seed=2)
    spec = f"lancedb:{tmp_path / 'l'}/pq"
    store = open_store(spec, dimension=32, index_type="IVF_PQ", nlist=4, target_recall=0.95)
    store.add(ids, docs)
    store.optimize()
    p = store.parameters()
    rec = p["recall"]
    assert p["index"] == "IVF_PQ" and rec["target_met_on_tuning_queries"] is True
    assert rec["recall_at_10"] >= 0.95 and "warning" not in rec
    assert rec["refine_factor"] > 1 and p["refine_factor"] == rec["refine_factor"]
    assert recall(store, queries, docs, ids) >= 0.93  # held-out queries agree
    store.close()
    again = open_store(spec)
    assert again.refine_factor == rec["refine_factor"]
    assert again.parameters()["recall"] == rec


def test_quantized_index_scores_are_inner_products_and_batches_match_single_queries(
    tmp_path, monkeypatch
):
    """SQ codes give approximate distances; a quantized index re-ranks its answers by the full
    vectors (refine_factor 1 untuned), so scores are exact. A batch is split into LanceDB
    queries of QUERIES_PER_CALL rows and answered as each query alone."""
    ids, docs, queries = data(n=3000, nq=11, dim=32, seed=3)
    monkeypatch.setattr(lancedb_store, "QUERIES_PER_CALL", 4)
    store = open_store(
        f"lancedb:{tmp_path / 'l'}/sq", dimension=32, index_type="IVF_HNSW_SQ", nlist=4,
        hnsw_m=16, ef_construction=64, force=True,
    )  # fmt: skip
    store.add(ids, docs, [{"n": i} for i in range(len(ids))])
    exact = store.search(queries, 7)  # no index yet: the exact scan, in 3 LanceDB queries
    for q, row in zip(queries, exact, strict=True):
        rows = [int(h.id.split("-")[1]) for h in row]
        assert rows == list(np.argsort(-(docs @ q), kind="stable")[:7])
    store.optimize()
    assert store.parameters()["refine_factor"] == 1
    batch = store.search(queries, 7)
    assert len(batch) == len(queries)
    for q, row in zip(queries, batch, strict=True):
        rows = [int(h.id.split("-")[1]) for h in row]
        np.testing.assert_allclose([h.score for h in row], docs[rows] @ q, atol=1e-4)
        assert [h.payload["n"] for h in row] == rows
        np.testing.assert_allclose(np.stack([h.vector for h in row]), docs[rows])
        alone = store.search(q[None, :], 7)[0]
        assert [h.id for h in alone] == [h.id for h in row]
    # LanceDB's own score for the same search, without re-ranking, is the quantized one
    raw = store.tbl.search(queries[0]).distance_type("dot").limit(7).to_arrow()
    top = [int(i.split("-")[1]) for i in raw["doc_id"].to_pylist()]
    coded = 1.0 - np.asarray(raw["_distance"].to_pylist())
    assert np.abs(coded - docs[top] @ queries[0]).max() > 1e-3
    store.close()


def test_tuning_raises_refine_then_nprobe_then_ef_search(tmp_path):
    """The order of the passes and the settings each runs at, on a recorded ``run``: when
    re-ranking alone cannot reach the target at the default nprobe, it is tuned again after
    nprobe; ef_search is generous while the others are tuned, then back to the caller's; the
    earlier passes aim at the stricter 0.995 (their losses add up in the last pass)."""
    store = open_store(
        f"lancedb:{tmp_path / 'l'}/t", dimension=DIM, index_type="IVF_HNSW_SQ", nlist=8,
        ef_search=40,
    )  # fmt: skip
    calls = []
    met = {"refine_factor": [False, True], "nprobe": [True], "ef_search": [True]}
    chosen = {"refine_factor": [32, 4], "nprobe": [6], "ef_search": [64]}

    def run(knob, target, warn=True):
        calls.append((knob.name, target, store.ef_search, store.refine_factor, store.nprobe, warn))
        knob.set(chosen[knob.name].pop(0))
        return {
            "k": 10,
            "recall_at_10": 0.99,
            "target_met_on_tuning_queries": met[knob.name].pop(0),
        }

    ef = _ann_recall.Knob(
        "ef_search", _ann_recall.HNSW_EF, lambda v: setattr(store, "ef_search", v), 40
    )
    recall = store._tune(run, ef, 0.99)
    probe = lancedb_store.PROBE_EF
    assert calls == [
        ("refine_factor", 0.995, probe, None, None, False),
        ("nprobe", 0.995, probe, 32, None, False),
        ("refine_factor", 0.995, probe, 32, 6, False),
        ("ef_search", 0.99, 40, 4, 6, True),
    ]
    assert (store.ef_search, store.nprobe, store.refine_factor) == (64, 6, 4)
    assert recall["refine_factor"] == 4 and recall["nprobe"] == 6
    # without a target nothing is tuned: one pass at the settings given
    calls.clear()
    store._tune(lambda knob, target, warn=True: calls.append(knob) or {"k": 10}, ef, None)
    assert calls == [None]
    store.close()


def test_table_indexed_by_cosine_is_refused(tmp_path):
    ids, docs, _ = data(n=600, dim=DIM)
    spec = f"lancedb:{tmp_path / 'l'}/theirs"
    with open_store(spec, dimension=DIM) as store:
        store.add(ids, docs)
    table = lancedb.connect(str(tmp_path / "l")).open_table("theirs")
    table.create_index("vector", config=IvfFlat(distance_type="cosine", num_partitions=2))
    with pytest.raises(StoreError, match="metric COSINE; magretrieve needs dot"):
        open_store(spec, dimension=DIM)


def test_metadata_and_rows_survive_a_new_process(tmp_path):
    ids, docs, _ = data(n=30)
    spec = f"lancedb:{tmp_path / 'l'}/docs"
    with open_store(spec, dimension=DIM) as store:
        store.add(ids, docs)
        store.write_metadata({"model_fingerprint": "abc", "mode": "qnorm"})
    code = (
        "import sys, json\n"
        "from magretrieve.stores import open_store\n"
        "s = open_store(sys.argv[1])\n"
        "print(json.dumps([s.count(), s.read_metadata(), s.dimension]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, spec], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [
        30,
        {"model_fingerprint": "abc", "mode": "qnorm"},
        DIM,
    ]
    with pytest.raises(StoreError, match="vector size 16, but the model produces dimension 8"):
        open_store(spec, dimension=8)
    with pytest.raises(StoreError, match="index_type 'hnsw' is not one of"):
        open_store(spec, index_type="hnsw")


def test_retriever_force_reaches_the_store_that_takes_it(
    tmp_path_factory, tiny_model_dir, tmp_path
):
    """``magretrieve index --force`` (Retriever.load(force=True)) is what keeps a poor index."""
    from magretrieve.serving.retriever import Retriever
    from tests.support.exports import tiny_export_dir

    export = tiny_export_dir(tmp_path_factory, tiny_model_dir)
    spec = f"lancedb:{tmp_path / 'l'}/docs"
    with Retriever.load(export, store=spec, index_type="IVF_PQ", nlist=2, force=True) as r:
        assert r.store.force is True
    with Retriever.load(export, store=spec) as r:
        assert r.store.force is False
    # a store without the option is opened as before under force
    with Retriever.load(export, store=f"faiss:{tmp_path / 'f'}", force=True) as r:
        assert r.store.kind == "faiss"
