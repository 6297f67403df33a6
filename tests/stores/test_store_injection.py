"""No id reaches a query language unescaped: add / existing / get / delete / search touch
exactly the ids named, on every registered store, whatever the ids hold.

A hypothesis property over arbitrary Unicode ids (quotes, backslashes, brackets, NUL, U+2028,
separators, expression keywords) runs against one store per backend (the first exact example
of ``tests/support/store_examples.py``) and a model of what must be stored. Ids no store can hold
(NUL, empty) are asked for too: they are refused on add and simply not found on lookups.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from magretrieve.core.errors import StoreError
from magretrieve.stores import open_store, registry
from magretrieve.stores.base import id_problem
from tests.support import store_examples

DIM = 8
#: Characters that end or extend a literal or an expression in SQL, Milvus or JSON filters.
NASTY = "'\"\\[](){}%_*?,;:=<>!|&#\x00\n\r\t\u2028\u2029\u0085\x1f\x7f\u200b\ufeffé漢😀 "
FRAGMENTS = [
    "nope'] or doc_id not in ['",
    '" or 1=1 --',
    "') OR ('1'='1",
    "doc_id != ''",
    "\\'",
    "\\\\",
    "$$",
    "%s",
    "{ids}",
    "null",
    "true",
]
ids_text = st.one_of(
    st.text(alphabet=st.sampled_from(NASTY + "abc"), min_size=1, max_size=8),
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), min_size=1, max_size=10),
    st.sampled_from(FRAGMENTS),
)


def storable(doc_id: str) -> bool:
    return id_problem(doc_id) is None


def vector(doc_id: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(doc_id.encode("utf-8")).digest()[:8], "little")
    return np.random.default_rng(seed).normal(size=DIM).astype(np.float32)


def runnable() -> list[str]:
    return [b.prefix for b in registry.backends() if b.prefix not in store_examples.NEEDS_SERVICE]


@pytest.fixture(scope="module", params=runnable())
def live_store(request, tmp_path_factory):
    ex = store_examples.exact_example(request.param, tmp_path_factory.mktemp(request.param))
    assert ex is not None, f"{request.param}: no runnable example (extra or pgserver missing?)"
    store = open_store(ex.spec, dimension=DIM, **ex.options)
    bystanders = ["keep-1", "keep 2", "keep'3"]
    store.add(bystanders, np.stack([vector(i) for i in bystanders]))
    model = set(bystanders)
    yield store, model
    store.close()


def check_exact(store, model: set[str]) -> None:
    assert store.count() == len(model)
    assert set(store.iter_ids()) == model


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    add=st.lists(ids_text, min_size=1, max_size=5, unique=True),
    probe=st.lists(ids_text, min_size=1, max_size=5),
)
def test_operations_touch_exactly_the_ids_named(live_store, add, probe):
    store, model = live_store
    good = [i for i in add if storable(i)]
    bad = [i for i in add if not storable(i)]
    before = store.count()
    if bad:  # refused, with nothing of the batch written
        with pytest.raises(StoreError):
            store.add(add, np.stack([vector(i) for i in add]))
        assert store.count() == before
    if good:
        assert store.add(good, np.stack([vector(i) for i in good])) == len(good)
        model |= set(good)
    asked = probe + add
    assert store.existing(asked) == {i for i in asked if i in model}
    records = store.get(asked)
    for doc_id, rec in zip(asked, records, strict=True):
        if doc_id in model:
            assert rec is not None and rec.id == doc_id
            np.testing.assert_allclose(rec.vector, vector(doc_id), rtol=1e-5)
        else:
            assert rec is None
    if good:  # searching with an added vector finds that very id, spelled as added
        hits = store.search(vector(good[0]), min(len(model), 50), with_vectors=False)[0]
        assert {h.id for h in hits} <= model
        assert good[0] in {h.id for h in hits}
    # delete only the probes: exactly those stored among them go, nothing else
    gone = {i for i in probe if i in model}
    assert store.delete(probe) == len(gone)
    model -= gone
    check_exact(store, model)


@pytest.mark.parametrize("prefix", runnable())
def test_the_reported_milvus_exploit_deletes_nothing_anywhere(prefix, tmp_path):
    ex = store_examples.exact_example(prefix, tmp_path)
    with open_store(ex.spec, dimension=DIM, **ex.options) as store:
        ids = [f"doc-{i}" for i in range(20)]
        store.add(ids, np.stack([vector(i) for i in ids]))
        crafted = ["nope'] or doc_id not in ['", 'nope"] or doc_id not in ["']
        assert store.existing(crafted) == set()
        assert store.get(crafted) == [None, None]
        assert store.delete(crafted) == 0
        assert store.count() == 20
        with pytest.raises(StoreError, match="a list of document ids"):
            store.delete("doc-1")  # one string is not a list of ids
        assert store.count() == 20
