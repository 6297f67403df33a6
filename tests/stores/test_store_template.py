"""The store template: a backend written as its I/O gets the lifecycle, recall tuning, typed
options and generations from the base, checked here on small fakes of a backend."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from magretrieve.core.errors import StoreError
from magretrieve.stores import _ann_recall, open_store, registry
from magretrieve.stores._generation import GenerationFiles
from magretrieve.stores.base import (
    Batch,
    CollectionStore,
    StoreHit,
    StoreRecord,
    VectorStore,
    closed_on_failure,
)
from magretrieve.stores.options import HnswOptions, IndexOptions, IvfOptions, RecallOptions

# ----------------------------------------------------------------------------- a fake database

#: What the fake database holds, by table name: {"dim", "build", "rows"}.
Tables = dict[str, dict[str, Any]]


class TableStore(VectorStore):
    """A store over an in-process 'database' of tables, written as the template asks: the
    lifecycle hooks and the primitives, nothing else."""

    kind = "table"

    def __init__(
        self,
        db: Tables,
        name: str,
        dimension: int | None = None,
        *,
        appears_on_lock: Tables | None = None,
        **knobs: Any,
    ) -> None:
        self.db, self.name = db, name
        self._appears_on_lock = appears_on_lock
        self.opts = IndexOptions.of(None, knobs, self.location)
        self._open_or_create(dimension, f"table {name!r}", self.opts.build())

    # lifecycle
    def _exists(self) -> bool:
        return self.name in self.db

    def _before_create(self) -> bool:
        if self._appears_on_lock is not None:  # another process created it meanwhile
            self.db.update(self._appears_on_lock)
        return True

    def _open_existing(self, dimension: int | None) -> int:
        return int(self.db[self.name]["dim"])

    def _create(self, dimension: int) -> None:
        self.db[self.name] = {"dim": dimension, "build": self.opts.build(), "rows": {}}

    def _recorded_build(self) -> dict[str, Any]:
        return dict(self.db[self.name]["build"])

    # I/O
    @property
    def dimension(self) -> int:
        return self._dim

    @property
    def location(self) -> str:
        return f"table:{self.name}"

    @property
    def rows(self) -> dict[str, Any]:
        return self.db[self.name]["rows"]

    def _upsert(self, batch: Batch) -> None:
        for doc_id, vec, payload, _ in batch.rows():
            self.rows[doc_id] = (vec.copy(), payload)

    def _query(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        ids = list(self.rows)
        mat = np.stack([self.rows[i][0] for i in ids])
        out = []
        for row in q @ mat.T:
            top = np.argsort(-row, kind="stable")[:k]
            out.append([StoreHit(ids[j], float(row[j]), {}) for j in top])
        return out

    def _fetch(self, ids: list[str]) -> list[StoreRecord]:
        return [StoreRecord(i, self.rows[i][0], self.rows[i][1]) for i in ids if i in self.rows]

    def _count(self) -> int:
        return len(self.rows)

    def _scan_ids(self) -> Any:
        return iter(list(self.rows))


def test_a_missing_table_is_created_only_with_a_dimension():
    db: Tables = {}
    with pytest.raises(StoreError, match=r"^table:t: no table 't' here; .*nothing was created"):
        TableStore(db, "t")
    assert db == {}
    store = TableStore(db, "t", 4, hnsw_m=8)
    assert store.created_here and store.dimension == 4
    assert db["t"]["build"]["hnsw_m"] == 8


def test_reopening_checks_the_dimension_and_the_recorded_build_options():
    db: Tables = {}
    TableStore(db, "t", 4, hnsw_m=8)
    again = TableStore(db, "t")  # read-only open of what exists: its own dimension
    assert not again.created_here and again.dimension == 4
    with pytest.raises(StoreError, match=r"has vector size 4, but the model produces dimension 8"):
        TableStore(db, "t", 8)
    with pytest.raises(StoreError, match=r"--hnsw-m 16 differs from the 8 the store was built"):
        TableStore(db, "t", 4, hnsw_m=16)
    assert TableStore(db, "t", 4, hnsw_m=8).dimension == 4  # the same value is fine


def test_a_table_another_process_created_meanwhile_is_opened_not_created_again():
    db: Tables = {}
    theirs: Tables = {"t": {"dim": 4, "build": {}, "rows": {"x": (np.ones(4), {})}}}
    store = TableStore(db, "t", 4, appears_on_lock=theirs)
    assert not store.created_here and store.count() == 1


# ----------------------------------------------------------------------------- the collection constructor


class FakeClient(dict[str, Any]):
    """A database client: tables by name, and whether it was closed."""

    closed = 0

    def close(self) -> None:
        self.closed += 1


class ClientTable(CollectionStore):
    """A store over one table of a client, written as the collection template asks: no
    constructor, only its hooks (the I/O is left out: these tests only open and close)."""

    kind = "table"
    noun, label = "fake table", "table"

    def _index_keywords(self) -> tuple[str, ...]:
        return HnswOptions.keywords()

    def _configure(self, opts: IndexOptions) -> dict[str, Any]:
        if not self.collection.isidentifier():
            raise StoreError(f"{self.location}: not a table name")
        self.steps = [f"configure m={opts.hnsw.m}"]
        self.build = opts.build()
        return self.build

    def _opened(self, opts: IndexOptions) -> None:
        self.steps.append(f"opened created={self.created_here} ef={opts.hnsw.ef_search}")

    def _exists(self) -> bool:
        return self.collection in self.client

    def _open_existing(self, dimension: int | None) -> int:
        return int(self.client[self.collection]["dim"])

    def _create(self, dimension: int) -> None:
        self.client[self.collection] = {"dim": dimension, "build": self.build}

    def _recorded_build(self) -> dict[str, Any]:
        return dict(self.client[self.collection]["build"])


def test_the_collection_template_owns_the_constructor():
    client = FakeClient()
    store = ClientTable(client, "t", 4, hnsw_m=8, ef_search=20, owns_client=True)
    assert (store.client, store.collection, store.dimension) == (client, "t", 4)
    assert store.location == "fake table 't'" and store.created_here
    assert store.steps == ["configure m=8", "opened created=True ef=20"]
    again = ClientTable(client, "t", location="db/t")  # read-only open: its own dimension
    assert again.location == "db/t" and again.dimension == 4 and not again.created_here
    with pytest.raises(StoreError, match=r"^fake table 'u': no table 'u' here; "):
        ClientTable(client, "u")
    with pytest.raises(StoreError, match=r"^fake table 'a-b': not a table name$"):
        ClientTable(client, "a-b", 4)
    with pytest.raises(StoreError, match=r"\['nlist'\] do not apply to this store"):
        ClientTable(client, "t", 4, nlist=8)
    with pytest.raises(StoreError, match=r"--hnsw-m 16 differs from the 8 the store was built"):
        ClientTable(client, "t", 4, options=IndexOptions(hnsw=HnswOptions(m=16)))
    store.close()
    store.close()
    again.close()  # a client it did not open stays open
    assert client.closed == 1


def test_an_opener_closes_the_client_it_made_when_the_store_cannot_be_built():
    def opener(client: FakeClient, name: str, error: BaseException | None = None) -> Any:
        with closed_on_failure(client) as made:
            if error is not None:
                raise error
            return ClientTable(made, name, 4, owns_client=True)

    client = FakeClient()
    store = opener(client, "t")
    assert client.closed == 0  # built: the store owns the client now
    with pytest.raises(StoreError, match="not a table name"):
        opener(client, "a-b")
    assert client.closed == 1
    with pytest.raises(KeyboardInterrupt):  # an interrupt leaves no connection behind either
        opener(client, "t", KeyboardInterrupt())
    assert client.closed == 2
    store.close()
    assert client.closed == 3


# ----------------------------------------------------------------------------- recall, once


class KnobStore(TableStore):
    """An 'approximate' search that misses half of each answer below ef_search 64."""

    ef = 16

    def _recall_knob(self) -> Any:
        def set_ef(value: int) -> None:
            self.ef = value

        return _ann_recall.Knob("ef_search", (16, 32, 64, 128), set_ef, self.ef)

    def _query(self, q: np.ndarray, k: int, with_vectors: bool) -> list[list[StoreHit]]:
        exact = super()._query(q, len(self.rows), with_vectors)
        if self.ef >= 64:
            return [row[:k] for row in exact]
        return [row[: k // 2] + row[-(k - k // 2) :] for row in exact]  # worst ones instead

    def _keep_recall(self, recall: dict[str, Any], knob: Any) -> None:
        self.kept = (recall, knob.current)


def _filled(cls: type[TableStore]) -> TableStore:
    store = cls({}, "t", 8)
    vecs = np.random.default_rng(3).standard_normal((300, 8)).astype(np.float32)
    store.add([f"d{i}" for i in range(300)], vecs)
    return store


def test_measure_recall_tunes_the_backend_knob_to_the_target():
    store = _filled(KnobStore)
    recall = store.measure_recall(target_recall=0.99)
    assert recall is not None and recall["ef_search"] == 64 == store.ef
    assert recall["recall_at_10"] == 1.0 and recall["target_met_on_tuning_queries"]
    assert store.kept == (recall, 64)


def test_measure_recall_without_a_target_measures_the_knob_as_set():
    store = _filled(KnobStore)
    recall = store.measure_recall()
    assert recall is not None and store.ef == 16
    assert recall["recall_at_10"] <= 0.6 and "warning" in recall


def test_a_store_without_a_knob_measures_nothing_and_a_bad_target_is_refused():
    assert _filled(TableStore).measure_recall(target_recall=0.9) is None
    with pytest.raises(StoreError, match=r"--target-recall must be <= 1"):
        _filled(KnobStore).measure_recall(target_recall=1.5)


# ----------------------------------------------------------------------------- typed options


def test_option_classes_declare_each_keyword_once_and_check_it():
    assert HnswOptions.keywords() == ("hnsw_m", "ef_construction", "ef_search")
    assert IvfOptions.keywords() == ("nlist", "nprobe")
    assert IndexOptions.keywords() == (
        "index_type",
        "hnsw_m",
        "ef_construction",
        "ef_search",
        "nlist",
        "nprobe",
        "target_recall",
    )
    given = {"hnsw_m": "24", "nprobe": 4, "other": 1}
    opts = IndexOptions.take(given, "here")
    assert opts == IndexOptions(hnsw=HnswOptions(m=24), ivf=IvfOptions(nprobe=4))
    assert given == {"other": 1}  # what no option class took is left to the caller
    assert opts.build() == {
        "index_type": None,
        "hnsw_m": 24,
        "ef_construction": None,
        "nlist": None,
    }
    with pytest.raises(StoreError, match=r"^here: --ef-search must be >= 1, got 0$"):
        IndexOptions.take({"ef_search": 0}, "here")
    with pytest.raises(StoreError, match=r"--target-recall must be > 0, got 0.0"):
        RecallOptions.take({"target_recall": 0.0}, "")


def test_a_constructor_takes_the_options_object_or_its_keywords():
    opts = IndexOptions(hnsw=HnswOptions(m=8))
    assert IndexOptions.of(opts, {}, "w") is opts
    assert IndexOptions.of(None, {"hnsw_m": 8}, "w") == opts
    with pytest.raises(StoreError, match="not both"):
        IndexOptions.of(opts, {"hnsw_m": 8}, "w")
    with pytest.raises(StoreError, match=r"\['nlist'\] do not apply to this store"):
        IndexOptions.of(None, {"nlist": 8}, "w", accepts=HnswOptions.keywords())
    with pytest.raises(TypeError, match="hnsw_mm"):
        IndexOptions.of(None, {"hnsw_mm": 8}, "w")


def test_the_registry_derives_its_table_and_flags_from_the_option_classes():
    for option in IndexOptions.declared():
        assert registry.OPTIONS[option.name] is option
    flags = {o.flag: o for o in registry.cli_options()}
    assert {"--hnsw-m", "--ef-construction", "--ef-search", "--nlist", "--nprobe"} <= set(flags)
    assert {o.flag for o in registry.cli_options(search_only=True)} >= {"--ef-search", "--nprobe"}
    help_ = flags["--faiss-index"].help
    takes_index_type = [b.prefix for b in registry.backends() if "index_type" in b.option_names]
    assert sorted(takes_index_type) == ["faiss", "lancedb", "milvus", "pgvector"]
    for prefix in takes_index_type:  # each backend's own vocabulary, named by its backend
        assert f"{prefix}: " in help_
    chroma = next(b for b in registry.backends() if b.prefix == "chroma")
    assert set(chroma.option_names) == {*HnswOptions.keywords(), "target_recall"}


def test_open_object_checks_the_options_of_an_adopted_object_in_one_line():
    faiss = pytest.importorskip("faiss")
    index = faiss.IndexFlatIP(4)
    with pytest.raises(StoreError) as bad:
        open_store(index, hnsw_m=0)
    assert str(bad.value) == "IndexFlatIP: --hnsw-m must be >= 2, got 0"
    with pytest.raises(StoreError, match=r"^option\(s\) \['token'\] do not apply to faiss stores$"):
        open_store(index, token="x")
    assert open_store(index).dimension == 4


def test_the_spec_forms_in_the_package_docstring_are_the_registered_ones():
    import magretrieve.stores as stores

    listed = [line.split()[0] for line in stores.__doc__.splitlines() if line.startswith("    ")]
    assert listed == list(registry.spec_forms())


# ----------------------------------------------------------------------------- generations

FILES = GenerationFiles("toy.json", "toy-format", "toy", {"data": "data-{gen}.bin"})


def _state(gen: int) -> Any:
    return lambda files: {"format": "toy-format", "generation": gen if files else 0, **files}


def test_a_generation_is_switched_by_its_state_file_and_older_files_go(tmp_path):
    FILES.commit(tmp_path, 1, {"data": b"one"}, _state(1))
    files = FILES.commit(tmp_path, 2, {"data": b"two"}, _state(2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data-2.bin", "toy.json"]
    state = FILES.read_state(tmp_path)
    assert FILES.disk_generation(tmp_path) == 2 and files["data_file"] == "data-2.bin"
    assert FILES.checked(tmp_path, state, "data").read_bytes() == b"two"
    (tmp_path / "data-2.bin").write_bytes(b"tw0")
    with pytest.raises(StoreError, match="does not match the checksum in toy.json"):
        FILES.checked(tmp_path, state, "data")


def test_files_without_a_state_file_are_an_interrupted_first_save(tmp_path):
    (tmp_path / "data-1.bin").write_bytes(b"x")
    with pytest.raises(StoreError, match="interrupted before its first commit"):
        FILES.check_no_orphans(tmp_path)
    FILES.begin(tmp_path, _state(1)({}))  # the empty generation 0 a first save commits first
    assert json.loads((tmp_path / "toy.json").read_text())["generation"] == 0


def test_open_store_takes_a_typed_options_object(tmp_path):
    pytest.importorskip("faiss")
    typed = IndexOptions(index_type="hnsw", hnsw=HnswOptions(m=8, ef_search=40))
    store = open_store(f"faiss:{tmp_path / 'f'}", dimension=4, options=typed)
    assert store.parameters()["hnsw_m"] == 8 and store.parameters()["ef_search"] == 40
    with pytest.raises(StoreError, match="hnsw_m is given twice"):
        open_store(f"faiss:{tmp_path / 'g'}", dimension=4, options=typed, hnsw_m=8)
    with pytest.raises(StoreError, match=r"options= takes an option class"):
        open_store(f"faiss:{tmp_path / 'g'}", dimension=4, options={"hnsw_m": 8})
    with pytest.raises(StoreError, match=r"\['nlist'\] do not apply to chroma"):
        open_store("chroma:x/y", dimension=4, options=IndexOptions(ivf=IvfOptions(nlist=4)))
