"""The corpus prior's large-corpus paths: hub scores computed once per choice, ranking in
query blocks, stored vectors in row blocks, in-process stores written in large batches."""

from __future__ import annotations

import numpy as np

from magretrieve.priors import HubPrior, InvertedSoftmaxPrior, base, hub, select
from magretrieve.priors.base import PriorTerms, stored_vectors, unit
from magretrieve.priors.rescale import read_all, rescale_store
from magretrieve.priors.select import choose_prior, ndcg_at_10, served_scores, training_score
from magretrieve.stores import open_store


def corpus(n: int = 60, dim: int = 8, seed: int = 0) -> np.ndarray:
    return unit(np.random.default_rng(seed).normal(size=(n, dim)))


def test_choosing_beta_computes_the_hub_score_once(monkeypatch) -> None:
    docs = corpus()
    q = unit(docs[:12] + 0.3 * corpus(12, seed=1))
    qids = [f"q{i}" for i in range(12)]
    doc_ids = [f"d{i}" for i in range(len(docs))]
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(12)}
    calls: list[int] = []
    real = hub.hub_scores

    def counting(units, k=10, chunk=1024, method="auto"):  # type: ignore[no-untyped-def]
        calls.append(k)
        return real(units, k, chunk, method)

    monkeypatch.setattr(hub, "hub_scores", counting)
    grid = [HubPrior(b, 5) for b in (0.1, 0.2, 0.3)] + [HubPrior(0.2, 3)]
    sel = choose_prior(q, docs, qids, doc_ids, qrels, method="hub", grids={"hub": grid})
    assert sorted(calls) == [3, 5]  # once per k, not once per candidate
    # the same choice as scoring each candidate on its own (no reuse)
    for p in grid:
        alone = ndcg_at_10(served_scores(p, q, unit(docs)), qids, doc_ids, qrels)
        assert sel.grid[p.label()] == alone
    calls.clear()
    HubPrior(0.1, 5).fit_corpus(docs)  # outside a choice: computed every time
    HubPrior(0.1, 5).fit_corpus(docs)
    assert calls == [5, 5]


def test_blocked_ranking_equals_the_whole_matrix(monkeypatch) -> None:
    docs = corpus(40)
    q = corpus(9, seed=3)
    qids = [f"q{i}" for i in range(9)]
    doc_ids = [f"d{i}" for i in range(40)]
    qrels = {f"q{i}": {f"d{(i * 7) % 40}": 1, f"d{i}": 2} for i in range(9)}
    whole = ndcg_at_10(served_scores(HubPrior(0.3, 4), q, docs), qids, doc_ids, qrels)
    bank = InvertedSoftmaxPrior(50.0, 1.0)  # cross-fitted: 3 folds of 3 queries
    crossed = training_score(bank, q, docs, qids, doc_ids, qrels, folds=3)
    monkeypatch.setattr(select, "QUERY_BLOCK", 2)  # blocks that do not divide 9 queries
    assert ndcg_at_10(served_scores(HubPrior(0.3, 4), q, docs), qids, doc_ids, qrels) == whole
    assert training_score(HubPrior(0.3, 4), q, docs, qids, doc_ids, qrels) == whole
    assert training_score(bank, q, docs, qids, doc_ids, qrels, folds=3) == crossed


def test_stored_vectors_in_row_blocks(monkeypatch) -> None:
    d = corpus(7, 3)
    m = np.linspace(0.5, 2.0, 7)
    b = np.arange(7.0)
    monkeypatch.setattr(base, "STORED_BLOCK", 3)
    got = stored_vectors(PriorTerms(d, m, b), True)
    np.testing.assert_array_equal(
        got[:, :3], (d.astype(np.float64) * m[:, None]).astype(np.float32)
    )
    np.testing.assert_array_equal(got[:, 3], b.astype(np.float32))
    assert got.dtype == np.float32 and got.shape == (7, 4)


def test_rescale_into_a_memory_store_in_large_batches(tmp_path, monkeypatch) -> None:
    docs = corpus(50)
    src = open_store(f"memory:{tmp_path / 'src'}", dimension=8)
    src.write_metadata({"mode": "cosine", "gamma_d": 1.0, "document_contract": "unit_norm"})
    src.add([f"d{i:02d}" for i in range(50)], docs, [{"n": i} for i in range(50)])
    src.persist()
    src.close()
    sizes: list[int] = []
    from magretrieve.stores.memory_store import MemoryStore

    real_add = MemoryStore.add

    def add(self, ids, vectors, payloads=None):  # type: ignore[no-untyped-def]
        sizes.append(len(ids))
        return real_add(self, ids, vectors, payloads)

    monkeypatch.setattr(MemoryStore, "add", add)
    rep = rescale_store(
        f"memory:{tmp_path / 'src'}", f"memory:{tmp_path / 'dst'}", prior=HubPrior(0.2, 4),
        progress=False,
    )  # fmt: skip
    assert rep.count == 50
    assert sizes == [50]  # by default, one batch for an in-process store
    sizes.clear()  # a batch size the caller gives is kept
    rescale_store(
        f"memory:{tmp_path / 'src'}", f"memory:{tmp_path / 'dst8'}", prior=HubPrior(0.2, 4),
        batch_size=8, progress=False,
    )  # fmt: skip
    assert sizes == [8] * 6 + [2]
    ids, stored, payloads = read_all(open_store(f"memory:{tmp_path / 'dst'}"), batch=7)
    assert ids == [f"d{i:02d}" for i in range(50)] and payloads[3] == {"n": 3}
    h = hub.hub_scores(docs, 4)
    expected = docs * np.exp(-0.2 * (h - h.mean()) / h.std())[:, None]
    np.testing.assert_allclose(stored, expected, rtol=1e-5)
