"""The bad-input catalogue: every user mistake we know of, refused loudly and harmlessly.

One table (:data:`CASES`), one test. Each case builds a broken input in a fresh temp folder,
runs it the way a user would (the ``magretrieve`` CLI, or the Python API where there is no
CLI path) and asserts:

- the error type (Python API) or exit code ≠ 0 (CLI; 1 for our errors, 2 for click usage
  errors),
- that the message names the file / line / id / collection at fault,
- that no raw traceback reaches a CLI user (the error is one ``Error: ...`` line and click
  saw no unhandled exception),
- for cases that touch a store: nothing already stored is lost (count, metadata and a fixed
  search result are equal before and after; for stores refused at open, their files are
  byte-identical).

Everything runs on a tiny random BERT exported with the TorchScript exporter (≈2 s, once
per session) and a FAISS store holding the 12-document tiny BEIR corpus.
The behaviours that are not refusals (empty BEIR documents kept with a warning, long texts
truncated and counted) have their own tests at the end. See docs/errors.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from magretrieve.cli import main
from magretrieve.core.errors import ConfigError, DataError, MagRetrieveError, StoreError
from magretrieve.stores import VectorStore, open_store
from tests.support.exports import tiny_export_dir
from tests.support.manifests import set_manifest_field
from tests.support.tiny_models import build_tiny_bert

# ----------------------------------------------------------------------------- shared exports


@pytest.fixture(scope="module")
def export_a(tmp_path_factory, tiny_model_dir) -> Path:
    return tiny_export_dir(tmp_path_factory, tiny_model_dir)


@pytest.fixture(scope="module")
def export_b(tmp_path_factory) -> Path:
    """Another model (different random weights), same dimension and mode."""
    folder = tmp_path_factory.getbasetemp() / "reliability-models" / "seed1"
    if not (folder / "model.safetensors").is_file():
        build_tiny_bert(folder, seed=1)
    return tiny_export_dir(tmp_path_factory, folder, name="qnorm-seed1")


@pytest.fixture(scope="module")
def store_template(tmp_path_factory, export_a, tiny_beir_dir) -> Path:
    """A FAISS store of the tiny BEIR corpus built by export A (copied per case)."""
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    folder = tmp_path_factory.mktemp("store-template") / "ix"
    with Retriever.load(export_a, store=f"faiss:{folder}") as r:
        index_corpus(r, tiny_beir_dir / "corpus.jsonl", progress=False)
    return folder


@dataclass
class Env:
    """Fresh inputs for one case: copies, so a case can break them freely."""

    tmp: Path
    export: Path
    other_export: Path
    model: Path
    beir: Path
    store: Path
    #: A cosine export and a FAISS store it built (a rescale source).
    cosine_export: Path | None = None
    cosine_store: Path | None = None

    @property
    def spec(self) -> str:
        return f"faiss:{self.store}"

    def bad_export(self, edit: Callable[[Path, dict], None], reseal: bool = True) -> Path:
        """A copy of export A whose manifest (and files) ``edit`` may change.

        ``reseal`` recomputes ``model_fingerprint`` and ``manifest_sha256`` after the edit, as
        a deliberate editor would: the field checks behind the checksum are what is tested.
        """
        from magretrieve.core.manifest import seal

        folder = self.tmp / "bad_export"
        shutil.copytree(self.export, folder)
        manifest = json.loads((folder / "magretrieve.json").read_text())
        edit(folder, manifest)
        if reseal:
            seal(manifest)
        (folder / "magretrieve.json").write_text(json.dumps(manifest, indent=2))
        return folder

    def corpus(self, *lines: str, good: int = 3, name: str = "new.jsonl") -> Path:
        """A corpus file: ``good`` valid new documents, then ``lines`` verbatim."""
        path = self.tmp / name
        docs = [
            json.dumps({"_id": f"n{i}", "title": "new", "text": f"statins heart {i}"})
            for i in range(good)
        ]
        path.write_text("".join(x + "\n" for x in (*docs, *lines)))
        return path

    def index_args(self, corpus: Path, spec: str | None = None) -> list[str]:
        return [
            "index",
            str(self.export),
            str(corpus),
            "--store",
            spec or self.spec,
            "--no-progress",
        ]

    def eval_args(self) -> list[str]:
        return ["eval", "--model", str(self.export), "--data", f"{self.beir}:test", "--json"]

    def search_args(self, export: Path | None = None, spec: str | None = None) -> list[str]:
        return ["search", str(export or self.export), "statins heart", "--store", spec or self.spec]

    def train_args(self, train: str) -> list[str]:
        out = str(self.tmp / "run")
        return [
            "train",
            "--model",
            str(self.model),
            "--train",
            train,
            "--out",
            out,
            "--max-steps",
            "1",
        ]


@pytest.fixture(scope="module")
def cosine_template(tmp_path_factory, tiny_model_dir, tiny_beir_dir) -> tuple[Path, Path]:
    """A cosine export of the tiny model and a FAISS store it built (a rescale source)."""
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    export = tiny_export_dir(tmp_path_factory, tiny_model_dir, mode="cosine")
    folder = tmp_path_factory.mktemp("cosine-template") / "cos"
    with Retriever.load(export, store=f"faiss:{folder}") as r:
        index_corpus(r, tiny_beir_dir / "corpus.jsonl", progress=False)
    return export, folder


@pytest.fixture
def env(
    tmp_path, export_a, export_b, tiny_model_dir, tiny_beir_dir, store_template, cosine_template
) -> Env:
    shutil.copytree(tiny_beir_dir, tmp_path / "beir")
    shutil.copytree(store_template, tmp_path / "ix")
    shutil.copytree(cosine_template[1], tmp_path / "cos")
    return Env(
        tmp_path,
        export_a,
        export_b,
        tiny_model_dir,
        tmp_path / "beir",
        tmp_path / "ix",
        cosine_template[0],
        tmp_path / "cos",
    )


# ----------------------------------------------------------------------------- snapshots


def folder_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def store_state(store: VectorStore) -> tuple[Any, ...]:
    """Count, recorded metadata and a fixed search result: what 'nothing lost' compares."""
    q = np.linspace(-1.0, 1.0, store.dimension, dtype=np.float32)[None]
    hits = store.search(q, 5, with_vectors=False)[0]
    return store.count(), store.read_metadata(), [(h.id, round(h.score, 5)) for h in hits]


def snapshot(target: Any) -> Any:
    """State of a store given as a spec, a live store object, or ``files:DIR`` /
    ``qdrant-raw:DIR/c`` / ``chroma-raw:DIR/c``."""
    if isinstance(target, VectorStore):
        return store_state(target)
    if target.startswith("files:"):
        return folder_hashes(Path(target[6:]))
    if target.startswith("qdrant-raw:"):
        from qdrant_client import QdrantClient

        path, _, collection = target[11:].rpartition("/")
        client = QdrantClient(path=path)
        try:
            points, _ = client.scroll(collection, limit=100, with_vectors=True)
            info = client.get_collection(collection).config.params.vectors
            return sorted((str(p.id), list(p.vector)) for p in points), str(info.distance)
        finally:
            client.close()
    if target.startswith("chroma-raw:"):  # Chroma's sqlite changes on every open: compare data
        import chromadb

        path, _, collection = target[11:].rpartition("/")
        client = chromadb.PersistentClient(
            path=path, settings=chromadb.Settings(anonymized_telemetry=False)
        )
        try:
            col = client.get_collection(collection)
            got = col.get(include=["embeddings", "metadatas"])
            rows = zip(got["ids"], got["embeddings"], got["metadatas"], strict=True)
            space = col.configuration["hnsw"]["space"]
            return sorted((i, list(map(float, e)), m) for i, e, m in rows), space
        finally:
            client.close()
    store = open_store(target)
    try:
        return store_state(store)
    finally:
        store.close()


# ----------------------------------------------------------------------------- the table


@dataclass
class Built:
    """What a case builder returns."""

    #: CLI arguments, or a zero-argument callable for a Python API case.
    run: list[str] | Callable[[], Any]
    #: Substrings the error message must contain (file/line/id/collection at fault).
    needles: list[str]
    #: A store to compare before/after (spec, live object, files:DIR or qdrant-raw:DIR/c).
    store: Any = None
    #: An extra check after the refusal (e.g. that a pickle was not executed).
    after: Callable[[], None] | None = None
    #: (object, attribute, replacement) set with monkeypatch for the run: how a case makes
    #: the operating system say no (disk full, read-only folder, unreadable file) as any user.
    patches: list[tuple[Any, str, Any]] = field(default_factory=list)


@dataclass
class Case:
    id: str
    build: Callable[[Env], Built]
    #: Python API: the MagRetrieveError subclass expected.
    error: type[Exception] = MagRetrieveError
    #: CLI: the exit code expected (1: our one-line error; 2: click usage error).
    exit_code: int = 1
    tags: tuple[str, ...] = field(default_factory=tuple)


def _append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


def _qrels(env: Env, body: str, split: str = "test") -> Path:
    """Write a qrels file; lone surrogates (``\\udcff``) become raw non-UTF-8 bytes."""
    path = env.beir / "qrels" / f"{split}.tsv"
    path.write_bytes(body.encode("utf-8", "surrogateescape"))
    return path


# -- data files through `magretrieve eval` (BEIR folder) -----------------------------------


def corpus_line(line: str, *needles: str) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        _append(env.beir / "corpus.jsonl", line + "\n")
        return Built(env.eval_args(), [f"{env.beir / 'corpus.jsonl'}:13", *needles])

    return build


def qrels_case(body: str, *needles: str, line: int | None = None) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        path = _qrels(env, body)
        where = f"{path}:{line}" if line else str(path)
        return Built(env.eval_args(), [where, *needles])

    return build


def queries_whitespace(env: Env) -> Built:
    _append(env.beir / "queries.jsonl", json.dumps({"_id": "q9", "text": " \t "}) + "\n")
    return Built(env.eval_args(), [f"{env.beir / 'queries.jsonl'}:13", "'text' is empty"])


def corpus_non_utf8_eval(env: Env) -> Built:
    _append(env.beir / "corpus.jsonl", "")
    with (env.beir / "corpus.jsonl").open("ab") as fh:
        fh.write(b'{"_id": "x", "text": "caf\xe9"}\n')
    return Built(env.eval_args(), [f"{env.beir / 'corpus.jsonl'}:13", "not valid UTF-8"])


# -- corpora through `magretrieve index` into an existing store ------------------------------


def index_lines(*lines: str, needles: tuple[str, ...], line: int = 4) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        corpus = env.corpus(*lines)
        return Built(env.index_args(corpus), [f"{corpus}:{line}", *needles], store=env.spec)

    return build


def index_non_utf8(env: Env) -> Built:
    corpus = env.corpus()
    with corpus.open("ab") as fh:
        fh.write(b'{"_id": "n9", "text": "\xff\xfe statins"}\n')
    return Built(env.index_args(corpus), [f"{corpus}:4", "not valid UTF-8"], store=env.spec)


def index_dimension_mismatch(env: Env) -> Built:
    spec = f"faiss:{env.tmp / 'dim16'}"
    store = open_store(spec, dimension=16)
    store.add(["a", "b"], np.random.default_rng(0).normal(size=(2, 16)).astype(np.float32))
    store.persist()
    store.close()
    return Built(
        env.index_args(env.corpus(), spec),
        [str(env.tmp / "dim16"), "dimension 16", "dimension 32"],
        store=spec,
    )


def index_other_model(env: Env) -> Built:
    args = env.index_args(env.corpus())
    args[1] = str(env.other_export)
    return Built(
        args, [env.spec, "built by another model", "model_fingerprint", "--force"], env.spec
    )


def search_other_model(env: Env) -> Built:
    return Built(
        env.search_args(export=env.other_export), [env.spec, "built by another model"], env.spec
    )


def qdrant_distance(distance: str) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        from qdrant_client import QdrantClient, models

        path = env.tmp / "qd"
        client = QdrantClient(path=str(path))
        client.create_collection(
            "scifact",
            vectors_config=models.VectorParams(
                size=32, distance=getattr(models.Distance, distance)
            ),
        )
        client.upsert(
            "scifact",
            [models.PointStruct(id=i, vector=[float(i + 1)] * 32, payload={}) for i in range(3)],
        )
        client.close()
        return Built(
            env.index_args(env.corpus(), f"qdrant-local:{path}/scifact"),
            ["'scifact'", f"distance {distance.capitalize()}", "needs Dot"],
            store=f"qdrant-raw:{path}/scifact",
        )

    return build


def qdrant_edge_cosine(env: Env) -> Built:
    import qdrant_edge as qe

    shard = env.tmp / "edge" / "shard"
    qe.EdgeShard.create(
        str(shard), qe.EdgeConfig(vectors=qe.EdgeVectorParams(size=32, distance=qe.Distance.Cosine))
    ).close()
    return Built(
        env.index_args(env.corpus(), f"qdrant-edge:{env.tmp / 'edge'}"),
        [str(shard), "uses distance Cosine"],
        store=f"files:{env.tmp / 'edge'}",
    )


def chroma_cosine(env: Env) -> Built:
    """An existing Chroma collection in space cosine (would rank by angle alone)."""
    import chromadb

    path = env.tmp / "chroma"
    client = chromadb.PersistentClient(
        path=str(path), settings=chromadb.Settings(anonymized_telemetry=False)
    )
    col = client.create_collection(
        "scifact", configuration={"hnsw": {"space": "cosine"}}, embedding_function=None
    )
    col.add(ids=["theirs"], embeddings=np.ones((1, 32), dtype=np.float32))
    client.close()
    return Built(
        env.index_args(env.corpus(), f"chroma:{path}/scifact"),
        [f"chroma:{path}/scifact", "space 'cosine'", "needs 'ip'"],
        store=f"chroma-raw:{path}/scifact",
    )


def lancedb_cosine_index(env: Env) -> Built:
    """A LanceDB table whose vector index uses metric cosine."""
    import lancedb
    from lancedb.index import IvfFlat

    path = env.tmp / "lance"
    store = open_store(f"lancedb:{path}/scifact", dimension=32)
    rng = np.random.default_rng(0)
    store.add([f"d{i}" for i in range(300)], rng.normal(size=(300, 32)).astype(np.float32))
    store.close()
    table = lancedb.connect(str(path)).open_table("scifact")
    table.create_index("vector", config=IvfFlat(distance_type="cosine", num_partitions=2))
    return Built(
        env.index_args(env.corpus(), f"lancedb:{path}/scifact"),
        [f"lancedb:{path}/scifact", "metric COSINE", "needs dot"],
        store=f"files:{path}",
    )


def _state(folder: Path) -> dict:
    return json.loads((folder / "faiss_store.json").read_text())


def faiss_l2_on_disk(env: Env) -> Built:
    """A store folder whose index file is an L2 index (checksums made consistent)."""
    import faiss

    from magretrieve.core.files import sha256_file

    state = _state(env.store)
    index_file = env.store / state["index_file"]
    l2 = faiss.IndexIDMap2(faiss.IndexFlatL2(32))
    l2.add_with_ids(np.ones((12, 32), dtype=np.float32), np.arange(12, dtype=np.int64))
    faiss.write_index(l2, str(index_file))
    state["index_sha256"] = sha256_file(index_file)
    (env.store / "faiss_store.json").write_text(json.dumps(state))
    return Built(
        env.search_args(), [str(index_file), "metric L2 is not inner product"], f"files:{env.store}"
    )


def faiss_half_written(env: Env) -> Built:
    index_file = env.store / _state(env.store)["index_file"]
    data = index_file.read_bytes()
    index_file.write_bytes(data[: len(data) // 2])
    return Built(env.search_args(), [str(index_file), "half-written"], f"files:{env.store}")


def faiss_files_without_state(env: Env) -> Built:
    (env.store / "faiss_store.json").unlink()
    return Built(
        env.index_args(env.corpus()),
        [str(env.store), "without faiss_store.json"],
        f"files:{env.store}",
    )


# -- training data through `magretrieve train` (refused before the model is loaded) ------------


def pairs_file(text: str, *needles: str) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        path = env.tmp / "pairs.jsonl"
        path.write_text(text)
        return Built(env.train_args(str(path)), [str(path), *needles])

    return build


def beir_without_positives(env: Env) -> Built:
    _qrels(
        env,
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}0\t0\n" for i in range(6)),
        "train",
    )
    return Built(
        env.train_args(f"{env.beir}:train"),
        [str(env.beir / "qrels" / "train.tsv"), "beir:train", "no positive judgements"],
    )


# -- export folders (manifest) through `magretrieve search` ---------------------------------


def manifest_case(edit: Callable[[Path, dict], None], *needles: str) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        folder = env.bad_export(edit)
        where = [n.replace("{export}", str(folder)) for n in needles]
        return Built(env.search_args(export=folder), where, store=env.spec)

    return build


def _tamper(folder: Path, m: dict) -> None:
    with (folder / "query.onnx").open("ab") as fh:
        fh.write(b"\0")


def _remove_tokenizer(folder: Path, m: dict) -> None:
    (folder / "tokenizer.json").unlink()


def _set(**values: Any) -> Callable[[Path, dict], None]:
    def edit(folder: Path, m: dict) -> None:
        for key, value in values.items():
            set_manifest_field(m, key, value)

    return edit


def _dotdot(folder: Path, m: dict) -> None:
    outside = folder.parent / "outside.onnx"
    shutil.copy(folder / "query.onnx", outside)
    m["graphs"]["query"]["file"] = "../outside.onnx"
    m["files"]["../outside.onnx"] = m["files"]["query.onnx"]


def _absolute(folder: Path, m: dict) -> None:
    m["files"]["/etc/hostname"] = "0" * 64


def _symlink_out(folder: Path, m: dict) -> None:
    outside = folder.parent / "outside_tokenizer.json"
    shutil.move(folder / "tokenizer.json", outside)
    os.symlink(outside, folder / "tokenizer.json")


def _gamma(folder: Path, m: dict) -> None:
    set_manifest_field(m, "mode", "learnable")
    set_manifest_field(m, "gamma_d", 1.5)


def manifest_not_json(env: Env) -> Built:
    folder = env.bad_export(lambda f, m: None)
    (folder / "magretrieve.json").write_text('{"format": "magretrieve-export", ')
    return Built(
        env.search_args(export=folder), [str(folder / "magretrieve.json"), "not valid JSON"]
    )


def no_manifest(env: Env) -> Built:
    return Built(env.search_args(export=env.model), [str(env.model), "no manifest"])


# -- export / model folders through `magretrieve export` -------------------------------------


def pytorch_bin_only(env: Env) -> Built:
    """Weights only as pytorch_model.bin — a pickle that would run code if unpickled."""
    folder = env.tmp / "pickled"
    folder.mkdir()
    for f in env.model.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    canary = env.tmp / "pickle-ran"

    class Payload:
        def __reduce__(self):  # executed by pickle.load: would create the canary folder
            return (os.mkdir, (str(canary),))

    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))

    def check() -> None:
        assert not canary.exists(), "the pickle was executed"

    return Built(
        ["export", str(folder), str(env.tmp / "out"), "--exporter", "torchscript"],
        [str(folder), "safetensors", "pytorch_model.bin"],
        after=check,
    )


def export_target_exists(env: Env) -> Built:
    target = env.tmp / "existing"
    shutil.copytree(env.export, target)
    return Built(
        ["export", str(env.model), str(target), "--exporter", "torchscript"],
        [str(target), "already exists", "--overwrite"],
        store=f"files:{target}",
    )


def export_target_not_an_export(env: Env) -> Built:
    target = env.tmp / "mydata"
    target.mkdir()
    (target / "thesis.tex").write_text("do not delete")
    return Built(
        ["export", str(env.model), str(target), "--overwrite", "--exporter", "torchscript"],
        [str(target), "not an export folder", "refusing"],
        store=f"files:{target}",
    )


def export_gamma(env: Env) -> Built:
    out = str(env.tmp / "out")
    return Built(
        ["export", str(env.model), out, "--mode", "learnable", "--gamma-q", "1.5"],
        ["gamma_q", "[0, 1]", "1.5"],
    )


def cli_unknown_mode(env: Env) -> Built:
    return Built(
        ["export", str(env.model), str(env.tmp / "out"), "--mode", "cosh"], ["'--mode'", "cosh"]
    )


def search_long_k(spelling: str) -> Callable[[Env], Built]:
    """``--top-k 5`` (or ``--topk``, ``--k``) for ``-k 5``: the error points to ``-k``."""

    def build(env: Env) -> Built:
        return Built(
            [*env.search_args(), spelling, "5"],
            [f"No such option '{spelling}'", "Did you mean '-k'?"],
            env.spec,
        )

    return build


# -- store specs and search arguments -----------------------------------------------------------


def spec_case(spec: str, *needles: str) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        return Built(env.search_args(spec=spec), [spec, *needles])

    return build


def search_empty_query(env: Env) -> Built:
    args = env.search_args()
    args[2] = "   "
    return Built(args, ["query #0 is empty"], store=env.spec)


def search_k_zero(env: Env) -> Built:
    return Built([*env.search_args(), "-k", "0"], ["k must be a positive integer", "0"], env.spec)


# -- Python API (no CLI path) ----------------------------------------------------------------------


class PoisonEncoder:
    """The real ONNX encoder, except texts containing 'poison' come out as NaN/inf."""

    def __init__(self, export: Path, bad: float = np.nan) -> None:
        from magretrieve.serving.onnx_encoder import OnnxEncoder

        self.inner = OnnxEncoder.load(export)
        self.manifest = self.inner.manifest
        self.bad = bad

    def encode_queries(self, texts, batch_size: int = 32):
        return self.inner.encode_queries(texts, batch_size)

    def encode_documents(self, texts, batch_size: int = 32):
        vecs = self.inner.encode_documents(texts, batch_size)
        for i, t in enumerate(texts):
            if "poison" in t:
                vecs[i, 3] = self.bad
        return vecs


def nan_embedding(bad: float) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        from magretrieve.serving.retriever import Retriever

        r = Retriever(PoisonEncoder(env.export, bad), open_store(env.spec))
        docs = [
            {"_id": "fine", "text": "statins heart"},
            {"_id": "bad-one", "text": "poison statins"},
        ]
        return Built(
            lambda: r.add_documents(docs),
            ["'bad-one'", "NaN or inf", "nothing was written"],
            r.store,
        )

    return build


def inf_vector_into_store(env: Env) -> Built:
    store = open_store(env.spec)
    vecs = np.ones((2, 32), dtype=np.float32)
    vecs[1, 0] = np.inf
    return Built(
        lambda: store.add(["ok", "inf-doc"], vecs), [env.spec, "'inf-doc'", "NaN or inf"], store
    )


def nan_query_vector(env: Env) -> Built:
    from magretrieve.serving.retriever import Retriever

    r = Retriever.load(env.export, store=env.spec, create=False)
    q = np.full((1, 32), np.nan, dtype=np.float32)
    return Built(
        lambda: r.search_vectors(q), ["search: query vector 0 contains NaN or inf"], r.store
    )


def unknown_mode_api(env: Env) -> Built:
    from magretrieve.train.encoder import Encoder

    return Built(lambda: Encoder.load(env.model, "cosh"), ["unknown mode 'cosh'", "cosine"])


CASES: list[Case] = [
    # --- JSONL / TSV data (magretrieve eval) ------------------------------------------------
    Case("corpus-truncated-line", corpus_line('{"_id": "d99", "text": "statins', "malformed JSON")),
    Case(
        "corpus-line-not-an-object",
        corpus_line('["d99", "statins"]', "expected a JSON object, got list"),
    ),
    Case(
        "corpus-text-wrong-type",
        corpus_line('{"_id": "d99", "text": 5}', "field 'text' must be a string"),
    ),
    Case("corpus-missing-id", corpus_line('{"text": "statins"}', "missing field '_id'")),
    Case("corpus-missing-text", corpus_line('{"_id": "d99"}', "missing field 'text'")),
    Case(
        "corpus-duplicate-id",
        corpus_line(
            '{"_id": "d00", "text": "again"}', "duplicate document id 'd00'", "first on line 1"
        ),
    ),
    Case("corpus-non-utf8", corpus_non_utf8_eval),
    Case("queries-whitespace-only-text", queries_whitespace),
    Case(
        "qrels-unknown-query-id",
        qrels_case("query-id\tcorpus-id\tscore\nq404\td00\t1\n", "query id 'q404'"),
    ),
    Case(
        "qrels-unknown-doc-id",
        qrels_case("query-id\tcorpus-id\tscore\nt0\td404\t1\n", "document id 'd404'", "query 't0'"),
    ),
    Case(
        "qrels-non-numeric-score",
        qrels_case("query-id\tcorpus-id\tscore\nt0\td01\thigh\n", "'high' is not a number", line=2),
    ),
    Case(
        "qrels-non-finite-score",
        qrels_case("query-id\tcorpus-id\tscore\nt0\td01\tnan\n", "not a finite number", line=2),
    ),
    Case("qrels-header-missing", qrels_case("t0\td01\t1\n", "missing header", line=1)),
    Case(
        "qrels-two-columns",
        qrels_case(
            "query-id\tcorpus-id\tscore\nt0\td01\n", "expected 3 tab-separated columns", line=2
        ),
    ),
    Case(
        "qrels-non-utf8",
        qrels_case("query-id\tcorpus-id\tscore\nt0\td01\t1\n\udcff", "not valid UTF-8"),
    ),
    # --- corpora into an existing store (magretrieve index) ---------------------------------
    Case(
        "index-duplicate-id",
        index_lines(
            json.dumps({"_id": "n1", "text": "again"}),
            needles=("duplicate document id 'n1'", "first on line 2"),
        ),
    ),
    Case(
        "index-empty-text",
        index_lines(
            json.dumps({"_id": "e1", "text": ""}),
            needles=("'e1'", "empty title and text", "--skip-empty"),
        ),
    ),
    Case(
        "index-whitespace-only-text",
        index_lines(
            json.dumps({"_id": "w1", "title": " ", "text": "\n\t "}),
            needles=("'w1'", "empty title and text"),
        ),
    ),
    Case("index-truncated-line", index_lines('{"_id": "n9", "te', needles=("malformed JSON",))),
    Case("index-non-utf8", index_non_utf8),
    Case("index-dimension-mismatch", index_dimension_mismatch),
    Case("index-store-of-another-model", index_other_model),
    Case("search-store-of-another-model", search_other_model),
    Case("qdrant-collection-cosine", qdrant_distance("COSINE")),
    Case("qdrant-collection-euclid", qdrant_distance("EUCLID")),
    Case("qdrant-edge-shard-cosine", qdrant_edge_cosine),
    Case("chroma-collection-cosine", chroma_cosine),
    Case("lancedb-index-cosine", lancedb_cosine_index),
    Case("faiss-index-l2-on-disk", faiss_l2_on_disk),
    Case("faiss-index-half-written", faiss_half_written),
    Case("faiss-files-without-state", faiss_files_without_state),
    # --- training data (magretrieve train; refused before the model loads) -----------------------
    Case("train-pairs-no-positives", pairs_file("\n\n", "no training pairs (no positives)")),
    Case(
        "train-pair-empty-positive",
        pairs_file(
            json.dumps({"query": "statins", "positive": " "}) + "\n", ":1", "'positive' is empty"
        ),
    ),
    Case("train-beir-no-positive-judgements", beir_without_positives),
    # --- export folders (manifest) -----------------------------------------------------------------
    Case(
        "manifest-wrong-hash",
        manifest_case(_tamper, "{export}/query.onnx", "sha256 does not match"),
    ),
    Case(
        "manifest-missing-file",
        manifest_case(_remove_tokenizer, "{export}/tokenizer.json", "missing"),
    ),
    Case(
        "manifest-unknown-version",
        manifest_case(
            _set(format_version=99), "{export}/magretrieve.json", "unknown format_version 99"
        ),
    ),
    Case(
        "manifest-unknown-mode",
        manifest_case(_set(mode="cosh"), "{export}/magretrieve.json", "unknown mode 'cosh'"),
    ),
    Case(
        "manifest-gamma-outside-0-1",
        manifest_case(_gamma, "{export}/magretrieve.json", "gamma_d must lie in [0, 1], got 1.5"),
    ),
    Case(
        "manifest-path-escapes-folder",
        manifest_case(
            _dotdot, "{export}/magretrieve.json", "'../outside.onnx'", "not a plain file name"
        ),
    ),
    Case(
        "manifest-absolute-path",
        manifest_case(_absolute, "{export}/magretrieve.json", "'/etc/hostname'"),
    ),
    Case(
        "export-symlink-outside-folder",
        manifest_case(_symlink_out, "{export}/tokenizer.json", "outside the export folder"),
    ),
    Case("manifest-not-json", manifest_not_json),
    Case("export-folder-without-manifest", no_manifest),
    # --- model folders and export targets (magretrieve export) ---------------------------------------
    Case("model-pytorch-bin-only", pytorch_bin_only),
    Case("export-target-exists", export_target_exists),
    Case("export-target-not-an-export", export_target_not_an_export),
    Case("export-gamma-outside-0-1", export_gamma),
    Case("cli-unknown-mode", cli_unknown_mode, exit_code=2),
    Case("search-top-k-for-k", search_long_k("--top-k"), exit_code=2),
    Case("search-topk-for-k", search_long_k("--topk"), exit_code=2),
    # --- store specs and search arguments ----------------------------------------------------------------
    Case(
        "spec-unknown-scheme", spec_case("redis:localhost/scifact", "not understood", "faiss:DIR")
    ),
    Case(
        "spec-qdrant-missing-collection",
        spec_case("qdrant:http://localhost:6333", "missing collection name"),
    ),
    Case(
        "spec-qdrant-local-missing-collection",
        spec_case("qdrant-local:indexes", "missing collection name"),
    ),
    Case("search-empty-query", search_empty_query),
    Case("search-k-zero", search_k_zero),
    # --- Python API ------------------------------------------------------------------------------------
    Case("embedding-nan-refused-before-store", nan_embedding(np.nan), error=StoreError),
    Case("embedding-inf-refused-before-store", nan_embedding(np.inf), error=StoreError),
    Case("store-add-inf-vector", inf_vector_into_store, error=StoreError),
    Case("search-nan-query-vector", nan_query_vector, error=StoreError),
    Case("api-unknown-mode", unknown_mode_api, error=ConfigError),
]


# ============================================================================= seven classes of hostile input
# Each class has its own block: crash windows, the export folder trusted too
# much, figures that are silently wrong, text that is not text, the operating system saying
# no, empty documents in a real corpus, malformed side files.


def _gone(path: Path) -> Callable[[], None]:
    """An ``after`` check: a refused command created nothing at ``path``."""

    def check() -> None:
        assert not path.exists(), f"{path} was created by a refused command"

    return check


def _os_error(code: int, message: str, path: Path | None = None) -> OSError:
    return OSError(code, message, str(path)) if path is not None else OSError(code, message)


def _failing(error: OSError) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise error

    return fail


def _deny_open(path: Path) -> tuple[Any, str, Any]:
    """Path.open raising EACCES for ``path`` (root reads any file, so chmod cannot test this)."""
    real = Path.open

    def fake(self: Path, *args: Any, **kwargs: Any) -> Any:
        if Path(self).resolve() == path.resolve():
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    return (Path, "open", fake)


# -- class 1: crash windows (interrupted rescale targets are reported, never served) ----------


def _incomplete_target(env: Env, marker: dict[str, Any] | None = None) -> str:
    """A FAISS store holding part of a rescale of the cosine store, marked incomplete."""
    from magretrieve.priors.rescale import INCOMPLETE_KEY

    spec = f"faiss:{env.tmp / 'half'}"
    src = open_store(f"faiss:{env.cosine_store}")
    ids = sorted(src.iter_ids())[:5]
    vecs = src.get_vectors(ids) * 2.0
    meta = dict(src.read_metadata() or {})
    src.close()
    dst = open_store(spec, dimension=32)
    dst.add(ids, vecs)
    meta[INCOMPLETE_KEY] = marker or {
        "operation": "rescale",
        "source": f"faiss:{env.cosine_store}",
        "recipe_sha256": "0" * 64,
    }
    dst.write_metadata(meta)
    dst.persist()
    dst.close()
    return spec


def search_incomplete_rescale(env: Env) -> Built:
    spec = _incomplete_target(env)
    return Built(
        ["search", str(env.cosine_export), "statins", "--store", spec],
        [spec, "incomplete", "interrupted", "run the same command again"],
        store=f"files:{env.tmp / 'half'}",
    )


def index_into_incomplete_rescale(env: Env) -> Built:
    spec = _incomplete_target(env)
    args = env.index_args(env.corpus(), spec)
    args[1] = str(env.cosine_export)
    return Built(args, [spec, "incomplete"], store=f"files:{env.tmp / 'half'}")


def rescale_resume_other_recipe(env: Env) -> Built:
    spec = _incomplete_target(env)
    return Built(
        ["rescale", "--source", f"faiss:{env.cosine_store}", "--target", spec]
        + ["--corpus-prior", "0.1", "--k", "3"],
        [spec, "interrupted rescale", "another source or recipe"],
        store=f"files:{env.tmp / 'half'}",
    )


def rescale_target_not_empty(env: Env) -> Built:
    spec = f"faiss:{env.tmp / 'full'}"
    shutil.copytree(env.cosine_store, env.tmp / "full")
    return Built(
        ["rescale", "--source", f"faiss:{env.cosine_store}", "--target", spec]
        + ["--corpus-prior", "0.1", "--k", "3"],
        [spec, "not empty"],
        store=f"files:{env.tmp / 'full'}",
    )


def rescale_target_is_source(env: Env) -> Built:
    spec = f"faiss:{env.cosine_store}"
    return Built(
        ["rescale", "--source", spec, "--target", spec, "--corpus-prior", "0.1"],
        [spec, "is the source"],
        store=f"files:{env.cosine_store}",
    )


def export_target_is_a_file(env: Env) -> Built:
    target = env.tmp / "a-file"
    target.write_text("keep me")
    return Built(
        ["export", str(env.model), str(target), "--overwrite", "--exporter", "torchscript"],
        [str(target), "is a file"],
        store=f"files:{env.tmp}",
    )


# -- class 2: the export folder is trusted no further than it proves --------------------------


def _edited(**values: Any) -> Callable[[Path, dict], None]:
    def edit(folder: Path, m: dict) -> None:
        for key, value in values.items():
            node = m
            *parents, last = key.split(".")
            for p in parents:
                node = node[p]
            set_manifest_field(node, last, value)

    return edit


def manifest_sealed_case(
    edit: Callable[[Path, dict], None], *needles: str, reseal: bool = True, index: bool = False
) -> Callable[[Env], Built]:
    """A manifest edit (checksums updated unless ``reseal`` is False), used to search the
    store or (``index``) to index into a new store, which must then not exist."""

    def build(env: Env) -> Built:
        folder = env.bad_export(edit, reseal=reseal)
        where = [n.replace("{export}", str(folder)) for n in needles]
        if index:
            new = env.tmp / "new-store"
            args = env.index_args(env.corpus(), f"faiss:{new}")
            args[1] = str(folder)
            return Built(args, where, after=_gone(new))
        return Built(env.search_args(export=folder), where, store=f"files:{env.store}")

    return build


def _rehash(folder: Path, m: dict, name: str) -> None:
    from magretrieve.core.manifest import sha256_file

    m["files"][name] = sha256_file(folder / name)


def _swap_tokenizer(folder: Path, m: dict) -> None:
    """A tokenizer that no longer lowercases, its sha256 updated: another model's vectors."""
    tok = json.loads((folder / "tokenizer.json").read_text())
    tok["normalizer"]["lowercase"] = False
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    _rehash(folder, m, "tokenizer.json")


def _truncate_graph(folder: Path, m: dict) -> None:
    data = (folder / "document.onnx").read_bytes()
    (folder / "document.onnx").write_bytes(data[: len(data) // 3])
    _rehash(folder, m, "document.onnx")


def _tokenizer_garbage(folder: Path, m: dict) -> None:
    (folder / "tokenizer.json").write_text('{"not": "a tokenizer"}')
    _rehash(folder, m, "tokenizer.json")


def _unseal(folder: Path, m: dict) -> None:
    m.pop("manifest_sha256", None)


def _fingerprint_only(folder: Path, m: dict) -> None:
    from magretrieve.core.manifest import content_checksum

    m["model_fingerprint"] = "0" * 64
    m["manifest_sha256"] = content_checksum(m)


def store_of_changed_export(
    edit: Callable[[Path, dict], None], cmd: str = "search"
) -> Callable[[Env], Built]:
    """The export changed in a way that changes vectors (hashes updated): a store built by the
    original refuses it, because model_fingerprint covers every such file and setting."""

    def build(env: Env) -> Built:
        folder = env.bad_export(edit)
        if cmd == "index":
            args = env.index_args(env.corpus())
            args[1] = str(folder)
        else:
            args = env.search_args(export=folder)
        return Built(
            args, [env.spec, "built by another model", "model_fingerprint"], f"files:{env.store}"
        )

    return build


def nan_weights_export(value: float) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        from safetensors.numpy import load_file, save_file

        folder = env.tmp / "poisoned"
        shutil.copytree(env.model, folder)
        weights = load_file(str(folder / "model.safetensors"))
        key = next(k for k in weights if "attention.self.query.weight" in k)
        weights[key][0, 0] = value
        save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
        target = env.tmp / "out"
        return Built(
            ["export", str(folder), str(target), "--exporter", "torchscript"],
            ["NaN or inf", "nothing was exported"],
            after=_gone(target),
        )

    return build


def export_overwrite_nan_keeps_old(env: Env) -> Built:
    """--overwrite with a NaN model: refused, the old export byte-identical."""
    built = nan_weights_export(float("nan"))(env)
    target = env.tmp / "out"
    shutil.copytree(env.export, target)
    built.run = [*built.run, "--overwrite"]
    built.after = None
    built.store = f"files:{target}"
    return built


# -- class 3: figures that would be silently wrong, empty work ---------------------------------


def corpus_line_index(line: str, *needles: str) -> Callable[[Env], Built]:
    """A bad line in a corpus given to `magretrieve index`: the store's files unchanged."""

    def build(env: Env) -> Built:
        corpus = env.corpus(line)
        return Built(env.index_args(corpus), [f"{corpus}:4", *needles], f"files:{env.store}")

    return build


def queries_line(line: str, *needles: str) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        _append(env.beir / "queries.jsonl", line + "\n")
        return Built(env.eval_args(), [f"{env.beir / 'queries.jsonl'}:13", *needles])

    return build


def index_file_case(content: bytes, *needles: str, skip_empty: bool = False):
    """A whole corpus file that holds nothing to index: refused before any store exists."""

    def build(env: Env) -> Built:
        corpus = env.tmp / "c.jsonl"
        corpus.write_bytes(content)
        new = env.tmp / "new-store"
        args = env.index_args(corpus, f"faiss:{new}") + (["--skip-empty"] if skip_empty else [])
        return Built(args, [str(corpus), *needles], after=_gone(new))

    return build


def index_missing_corpus(env: Env) -> Built:
    new = env.tmp / "new-store"
    corpus = env.tmp / "nope.jsonl"
    return Built(
        env.index_args(corpus, f"faiss:{new}"), [str(corpus), "not found"], after=_gone(new)
    )


def eval_empty_corpus(env: Env) -> Built:
    (env.beir / "corpus.jsonl").write_text("\n\n")
    return Built(env.eval_args(), [str(env.beir / "corpus.jsonl"), "corpus is empty"])


# -- class 4: text that is not text (lone surrogates) -------------------------------------------

SURROGATE = "\\udc80"  # as it appears in a JSON file: a valid escape, not a character


def search_surrogate_arg(env: Env) -> Built:
    args = env.search_args()
    args[2] = "statins \udcff heart"  # what Python makes of a mis-encoded shell argument
    return Built(args, ["query text #0", "lone surrogate", "position 8"], f"files:{env.store}")


def api_add_surrogate(env: Env) -> Built:
    from magretrieve.serving.retriever import Retriever

    r = Retriever.load(env.export, store=env.spec, create=False)
    docs = [{"_id": "fine", "text": "statins"}, {"_id": "bad", "text": "x \ud800 y"}]
    return Built(lambda: r.add_documents(docs), ["'bad'", "lone surrogate"], r.store)


def api_store_surrogate_id(env: Env) -> Built:
    store = open_store("qdrant-memory:sur", dimension=32)
    store.add(["a"], np.ones((1, 32), dtype=np.float32))
    return Built(
        lambda: store.add(["b\udc80"], np.ones((1, 32), dtype=np.float32)),
        ["lone surrogate", "qdrant-memory:sur"],
        store,
    )


def pairs_surrogate(env: Env) -> Built:
    path = env.tmp / "pairs.jsonl"
    path.write_text('{"query": "statins", "positive": "heart ' + SURROGATE + '"}\n')
    return Built(env.train_args(str(path)), [f"{path}:1", "'positive'", "lone surrogate"])


def sts_surrogate(env: Env) -> Built:
    path = env.tmp / "sts.jsonl"
    path.write_text(
        '{"sentence1": "a ' + SURROGATE + '", "sentence2": "b", "score": 1.0}\n'
        '{"sentence1": "c", "sentence2": "d", "score": 2.0}\n'
    )
    return Built(
        ["eval", "--model", str(env.export), "--data", str(path)],
        [f"{path}:1", "'sentence1'", "lone surrogate"],
    )


# -- class 5: the operating system says no -------------------------------------------------------


def index_disk_full(env: Env) -> Built:
    """ENOSPC from the first write of the checkpoint: the store's files unchanged."""
    import magretrieve.stores.base as base

    return Built(
        env.index_args(env.corpus()),
        [str(env.store), "No space left on device"],
        store=f"files:{env.store}",
        patches=[(base.os, "fsync", _failing(_os_error(28, "No space left on device")))],
    )


def index_read_only_store(env: Env) -> Built:
    """The store folder is on a read-only file system: refused naming it, files unchanged."""
    import magretrieve.stores.base as base

    return Built(
        env.index_args(env.corpus()),
        [str(env.store), "Read-only file system"],
        store=f"files:{env.store}",
        patches=[
            (base.tempfile, "mkstemp", _failing(_os_error(30, "Read-only file system", env.store)))
        ],
    )


def export_disk_full(env: Env) -> Built:
    """ENOSPC while an --overwrite export is being made durable: the old export unchanged."""
    import magretrieve.export.build as build_mod

    target = env.tmp / "existing"
    shutil.copytree(env.export, target)
    return Built(
        ["export", str(env.model), str(target), "--overwrite", "--exporter", "torchscript"],
        ["No space left on device", f"{target} was not changed"],
        store=f"files:{env.tmp}",
        patches=[(build_mod, "_fsync_file", _failing(_os_error(28, "No space left on device")))],
    )


def export_read_only_parent(env: Env) -> Built:
    import magretrieve.export.publish as publish

    parent = env.tmp / "ro"
    parent.mkdir()
    target = parent / "out"
    return Built(
        ["export", str(env.model), str(target), "--exporter", "torchscript"],
        [str(target), "Read-only file system"],
        store=f"files:{parent}",
        patches=[
            (publish.tempfile, "mkdtemp", _failing(_os_error(30, "Read-only file system", parent)))
        ],
    )


def unreadable_export_file(name: str) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        import magretrieve.core.files as files_mod

        real = open
        path = env.export / name

        def fake_open(file: Any, *args: Any, **kwargs: Any) -> Any:
            if Path(file) == path:
                raise PermissionError(13, "Permission denied", str(file))
            return real(file, *args, **kwargs)

        return Built(
            env.search_args(),
            [str(path), "cannot read", "Permission denied"],
            store=f"files:{env.store}",
            patches=[(files_mod, "open", fake_open)],
        )

    return build


def unreadable_corpus(env: Env) -> Built:
    corpus = env.corpus()
    new = env.tmp / "new-store"
    return Built(
        env.index_args(corpus, f"faiss:{new}"),
        [str(corpus), "cannot read", "Permission denied"],
        after=_gone(new),
        patches=[_deny_open(corpus)],
    )


def unreadable_qrels(env: Env) -> Built:
    path = env.beir / "qrels" / "test.tsv"
    return Built(env.eval_args(), [str(path), "cannot read"], patches=[_deny_open(path)])


def unreadable_store_records(env: Env) -> Built:
    records = env.store / _state(env.store)["records_file"]
    return Built(
        env.search_args(),
        [str(records), "Permission denied"],
        store=f"files:{env.store}",
        patches=[_deny_open(records)],
    )


def _model_copy(env: Env, name: str) -> Path:
    folder = env.tmp / name
    shutil.copytree(env.model, folder)
    return folder


def model_case(edit: Callable[[Path], None], *needles: str) -> Callable[[Env], Built]:
    """A broken model folder given to `magretrieve export`: refused, no export created."""

    def build(env: Env) -> Built:
        folder = _model_copy(env, "broken-model")
        edit(folder)
        target = env.tmp / "out"
        return Built(
            ["export", str(folder), str(target), "--exporter", "torchscript"],
            [n.replace("{model}", str(folder)) for n in needles],
            after=_gone(target),
        )

    return build


def _truncate(name: str, keep: float = 0.5) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: int(len(data) * keep)])

    return edit


def _remove(name: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / name).unlink()

    return edit


def _write_file(name: str, text: str) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        (folder / name).write_text(text)

    return edit


def fit_prior_out_is_folder(env: Env) -> Built:
    out = env.tmp / "priors"
    out.mkdir()
    (out / "keep.txt").write_text("keep")
    return Built(
        ["fit-prior", "--model", str(env.cosine_export), "--data", f"{env.beir}:train"]
        + ["--out", str(out), "--method", "hub"],
        [str(out), "is a directory"],
        store=f"files:{out}",
    )


def fit_prior_no_relevant_judgement(env: Env) -> Built:
    path = _qrels(env, "query-id\tcorpus-id\tscore\nq0\td00\t0\nq1\td10\t0\n", split="train")
    out = env.tmp / "prior.json"
    return Built(
        ["fit-prior", "--model", str(env.cosine_export), "--data", f"{env.beir}:train"]
        + ["--out", str(out), "--method", "hub"],
        [str(path), ":train has no relevant judgement"],
        after=lambda: None if not out.exists() else pytest.fail(f"{out} was written"),
    )


def fit_prior_disk_full(env: Env) -> Built:
    import magretrieve.stores.base as base

    out = env.tmp / "prior.json"
    out.write_text('{"kind": "old"}\n')
    return Built(
        ["fit-prior", "--model", str(env.cosine_export), "--data", f"{env.beir}:train"]
        + ["--out", str(out), "--method", "hub", "--json"],
        [str(out), "No space left on device"],
        store=f"files:{env.tmp}",
        patches=[(base.os, "fsync", _failing(_os_error(28, "No space left on device")))],
    )


# -- class 7: malformed side files --------------------------------------------------------------


def prior_file_case(text: str, *needles: str) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        path = env.tmp / "prior.json"
        path.write_text(text)
        target = env.tmp / "rescaled"
        return Built(
            ["rescale", "--source", f"faiss:{env.cosine_store}", "--target", f"faiss:{target}"]
            + ["--prior-file", str(path)],
            [str(path), *needles],
            store=f"files:{env.cosine_store}",
            after=_gone(target),
        )

    return build


def prior_file_bytes(env: Env) -> Built:
    built = prior_file_case("{}", "not valid JSON")(env)
    (env.tmp / "prior.json").write_bytes(b'{"kind": "caf\xe9"}')
    return built


def faiss_state_edit(
    edit: Callable[[Path, dict, dict], None], *needles: str
) -> Callable[[Env], Built]:
    """Edit the FAISS state and record files consistently (checksums updated)."""

    def build(env: Env) -> Built:
        from magretrieve.core.files import sha256_file

        state = _state(env.store)
        rec_file = env.store / state["records_file"]
        records = json.loads(rec_file.read_text())
        edit(env.store, state, records)
        rec_file.write_text(json.dumps(records))
        state["records_sha256"] = sha256_file(rec_file)
        state["index_sha256"] = sha256_file(env.store / state["index_file"])
        (env.store / "faiss_store.json").write_text(json.dumps(state))
        where = [
            n.replace("{records}", str(rec_file)).replace("{records_name}", rec_file.name)
            for n in needles
        ]
        return Built(env.search_args(), where, store=f"files:{env.store}")

    return build


def _drop_record(folder: Path, state: dict, records: dict) -> None:
    records["records"].pop()


def _extra_record(folder: Path, state: dict, records: dict) -> None:
    records["records"].append(["ghost", {}])


def _state_dimension(folder: Path, state: dict, records: dict) -> None:
    state["dimension"] = 16


def _record_not_pair(folder: Path, state: dict, records: dict) -> None:
    records["records"][0] = "d00"


def _tombstone_out_of_range(folder: Path, state: dict, records: dict) -> None:
    records["tombstones"] = [999]


def _duplicate_record(folder: Path, state: dict, records: dict) -> None:
    records["records"][1] = list(records["records"][0])


def _other_index(folder: Path, state: dict, records: dict) -> None:
    """The index file of a 16-dimensional store, checksum updated."""
    import faiss

    index = faiss.IndexIDMap2(faiss.IndexFlatIP(16))
    index.add_with_ids(np.ones((12, 16), dtype=np.float32), np.arange(12, dtype=np.int64))
    faiss.write_index(index, str(folder / state["index_file"]))


def memory_store_disagree(env: Env) -> Built:
    from magretrieve.core.files import sha256_file

    folder = env.tmp / "mem"
    store = open_store(f"memory:{folder}", dimension=32)
    store.add(["a", "b", "c"], np.ones((3, 32), dtype=np.float32))
    store.persist()
    store.close()
    state = json.loads((folder / "memory_store.json").read_text())
    vec_file = folder / state["vectors"]
    np.save(vec_file, np.ones((2, 32), dtype=np.float32), allow_pickle=False)
    state["vectors_sha256"] = sha256_file(vec_file)
    (folder / "memory_store.json").write_text(json.dumps(state))
    return Built(
        env.search_args(spec=f"memory:{folder}"),
        [str(vec_file), "expected float32 (3, 32)"],
        store=f"files:{folder}",
    )


HOSTILE_CASES: list[Case] = [
    # --- 1. crash windows --------------------------------------------------------------------
    Case("search-incomplete-rescale-target", search_incomplete_rescale),
    Case("index-into-incomplete-rescale-target", index_into_incomplete_rescale),
    Case("rescale-resume-with-another-recipe", rescale_resume_other_recipe),
    Case("rescale-target-not-empty", rescale_target_not_empty),
    Case("rescale-target-is-the-source", rescale_target_is_source),
    Case("export-target-is-a-file", export_target_is_a_file, exit_code=2),
    # --- 2. the export folder ----------------------------------------------------------------
    Case(
        "manifest-edited-without-checksum",
        manifest_sealed_case(
            _edited(dimension=16), "{export}/magretrieve.json", "manifest_sha256", reseal=False
        ),
    ),
    Case(
        "manifest-without-checksum",
        manifest_sealed_case(
            _unseal, "{export}/magretrieve.json", "no manifest_sha256", reseal=False
        ),
    ),
    Case(
        "manifest-fingerprint-not-its-content",
        manifest_sealed_case(_fingerprint_only, "model_fingerprint does not match", reseal=False),
    ),
    Case(
        "manifest-dimension-edited",
        manifest_sealed_case(_edited(dimension=16), "{export}/query.onnx", "dimension 16"),
    ),
    Case(
        "manifest-dimension-edited-index-creates-no-store",
        manifest_sealed_case(
            _edited(dimension=16), "{export}/query.onnx", "dimension 16", index=True
        ),
    ),
    Case(
        "manifest-max-length-edited",
        manifest_sealed_case(
            _edited(max_document_length=100000),
            "{export}/document.onnx",
            "does not run",
            "max_document_length=100000",
            index=True,
        ),
    ),
    Case(
        "manifest-max-query-length-edited",
        manifest_sealed_case(
            _edited(max_query_length=5000), "{export}/query.onnx", "max_query_length=5000"
        ),
    ),
    Case(
        "manifest-pad-token-edited",
        manifest_sealed_case(
            _edited(pad_token_id=99999), "{export}/query.onnx", "pad_token_id=99999"
        ),
    ),
    Case(
        "manifest-output-name-edited",
        manifest_sealed_case(
            _edited(**{"graphs.document.output": "pooled"}),
            "{export}/document.onnx",
            "no output 'pooled'",
            index=True,
        ),
    ),
    Case(
        "manifest-inputs-edited",
        manifest_sealed_case(
            _edited(**{"graphs.query.inputs": ["input_ids"]}), "{export}/query.onnx", "inputs"
        ),
    ),
    Case(
        "manifest-unknown-input",
        manifest_sealed_case(
            _edited(**{"graphs.query.inputs": ["input_ids", "pixels"]}),
            "{export}/magretrieve.json",
            "known inputs",
        ),
    ),
    Case(
        "manifest-dimension-zero",
        manifest_sealed_case(_edited(dimension=0), "dimension must be a positive integer"),
    ),
    Case(
        "manifest-dimension-text",
        manifest_sealed_case(_edited(dimension="32"), "dimension must be a positive integer"),
    ),
    Case(
        "manifest-max-length-negative",
        manifest_sealed_case(
            _edited(max_query_length=-1), "max_query_length must be a positive integer"
        ),
    ),
    Case(
        "manifest-pad-token-negative",
        manifest_sealed_case(_edited(pad_token_id=-3), "pad_token_id must be an integer"),
    ),
    Case(
        "export-graph-truncated-hash-updated",
        manifest_sealed_case(
            _truncate_graph, "{export}/document.onnx", "onnxruntime cannot load", index=True
        ),
    ),
    Case(
        "export-tokenizer-garbage-hash-updated",
        manifest_sealed_case(_tokenizer_garbage, "{export}/tokenizer.json", "cannot read"),
    ),
    Case("search-store-after-tokenizer-swap", store_of_changed_export(_swap_tokenizer)),
    Case("index-store-after-tokenizer-swap", store_of_changed_export(_swap_tokenizer, "index")),
    Case(
        "search-store-after-prompt-change",
        store_of_changed_export(_edited(query_prefix="search_query: ")),
    ),
    Case(
        "index-store-after-document-prompt-change",
        store_of_changed_export(_edited(document_prefix="passage: "), "index"),
    ),
    Case(
        "index-store-after-max-length-change",
        store_of_changed_export(_edited(max_document_length=64), "index"),
    ),
    Case("export-nan-weights", nan_weights_export(float("nan"))),
    Case("export-inf-weights", nan_weights_export(float("inf"))),
    Case("export-overwrite-nan-weights-keeps-old", export_overwrite_nan_keeps_old),
    # --- 3. figures that would be silently wrong, empty work ----------------------------------
    Case(
        "qrels-fractional-grade",
        qrels_case(
            "query-id\tcorpus-id\tscore\nt0\td01\t0.5\n", "'0.5' is not an integer grade", line=2
        ),
    ),
    Case(
        "qrels-huge-grade",
        qrels_case("query-id\tcorpus-id\tscore\nt0\td01\t1e12\n", "outside [-1000, 1000]", line=2),
    ),
    Case(
        "qrels-huge-negative-grade",
        qrels_case("query-id\tcorpus-id\tscore\nt0\td01\t-5000\n", "outside [-1000, 1000]", line=2),
    ),
    Case(
        "qrels-overflowing-grade",
        qrels_case("query-id\tcorpus-id\tscore\nt0\td01\t1e400\n", "not a finite number", line=2),
    ),
    Case(
        "qrels-empty-query-id",
        qrels_case("query-id\tcorpus-id\tscore\n\td01\t1\n", "empty query or document id", line=2),
    ),
    Case("corpus-id-nan", corpus_line('{"_id": NaN, "text": "x"}', "'_id'", "got nan")),
    Case("corpus-id-infinity", corpus_line('{"_id": Infinity, "text": "x"}', "got inf")),
    Case("corpus-id-fraction", corpus_line('{"_id": 1.5, "text": "x"}', "got 1.5")),
    Case("corpus-id-bool", corpus_line('{"_id": true, "text": "x"}', "got bool")),
    Case("queries-id-nan", queries_line('{"_id": NaN, "text": "x"}', "'_id'", "got nan")),
    Case("index-id-nan", corpus_line_index('{"_id": NaN, "text": "x"}', "'_id'", "got nan")),
    Case(
        "index-id-negative-infinity", corpus_line_index('{"_id": -Infinity, "text": "x"}', "-inf")
    ),
    Case("index-empty-corpus-file", index_file_case(b"", "empty file", "no store was created")),
    Case("index-blank-lines-only", index_file_case(b"\n \n\t\n", "no document to index")),
    Case(
        "index-every-document-empty-with-skip-empty",
        index_file_case(
            b'{"_id": "a", "text": ""}\n{"_id": "b", "text": " ", "title": ""}\n',
            "every document is empty",
            skip_empty=True,
        ),
    ),
    Case(
        "index-empty-document-names-the-flag",
        index_file_case(
            b'{"_id": "a", "text": "ok"}\n{"_id": "b", "text": ""}\n', ":2", "--skip-empty"
        ),
    ),
    Case(
        "index-duplicate-after-empty-with-skip-empty",
        index_file_case(
            b'{"_id": "a", "text": "x"}\n{"_id": "e", "text": ""}\n{"_id": "a", "text": "y"}\n',
            ":3",
            "duplicate document id 'a'",
            skip_empty=True,
        ),
    ),
    Case("index-missing-corpus-file", index_missing_corpus),
    Case("eval-empty-corpus", eval_empty_corpus),
    # --- 4. text that is not text ------------------------------------------------------------
    Case(
        "corpus-text-lone-surrogate",
        corpus_line('{"_id": "s", "text": "a ' + SURROGATE + '"}', "'text'", "lone surrogate"),
    ),
    Case(
        "corpus-title-lone-surrogate",
        corpus_line(
            '{"_id": "s", "title": "' + SURROGATE + '", "text": "a"}', "'title'", "lone surrogate"
        ),
    ),
    Case(
        "corpus-id-lone-surrogate",
        corpus_line('{"_id": "' + SURROGATE + '", "text": "a"}', "'_id'", "lone surrogate"),
    ),
    Case(
        "corpus-high-surrogate",
        corpus_line('{"_id": "s", "text": "\\ud83d"}', "lone surrogate", "position 0"),
    ),
    Case(
        "corpus-payload-lone-surrogate",
        corpus_line(
            '{"_id": "s", "text": "a", "meta": {"tags": ["' + SURROGATE + '"]}}',
            "'meta'",
            "lone surrogate",
        ),
    ),
    Case(
        "corpus-field-name-lone-surrogate",
        corpus_line('{"_id": "s", "text": "a", "' + SURROGATE + '": 1}', "field name"),
    ),
    Case(
        "index-id-lone-surrogate",
        corpus_line_index('{"_id": "x' + SURROGATE + '", "text": "a"}', "lone surrogate"),
    ),
    Case(
        "queries-lone-surrogate",
        queries_line('{"_id": "q9", "text": "' + SURROGATE + '"}', "lone surrogate"),
    ),
    Case("search-query-arg-lone-surrogate", search_surrogate_arg),
    Case("train-pair-lone-surrogate", pairs_surrogate),
    Case("sts-pair-lone-surrogate", sts_surrogate),
    Case("api-add-documents-lone-surrogate", api_add_surrogate, error=DataError),
    Case("api-qdrant-id-lone-surrogate", api_store_surrogate_id, error=StoreError),
    # --- 5. the operating system says no ---------------------------------------------------------
    Case("index-disk-full", index_disk_full),
    Case("index-read-only-store-folder", index_read_only_store),
    Case("export-overwrite-disk-full-keeps-old", export_disk_full),
    Case("export-read-only-parent", export_read_only_parent),
    Case("export-unreadable-tokenizer", unreadable_export_file("tokenizer.json")),
    Case("export-unreadable-graph", unreadable_export_file("query.onnx")),
    Case("index-unreadable-corpus", unreadable_corpus),
    Case("eval-unreadable-qrels", unreadable_qrels),
    Case("search-unreadable-store-records", unreadable_store_records),
    Case(
        "model-truncated-safetensors",
        model_case(_truncate("model.safetensors"), "{model}/model.safetensors", "truncated"),
    ),
    Case(
        "model-safetensors-header-only",
        model_case(_truncate("model.safetensors", 0.001), "{model}/model.safetensors"),
    ),
    Case(
        "model-without-config",
        model_case(_remove("config.json"), "{model}/config.json", "missing"),
    ),
    Case(
        "model-config-not-json",
        model_case(
            _write_file("config.json", "{broken"), "{model}/config.json", "not a valid JSON"
        ),
    ),
    Case("fit-prior-out-is-a-folder", fit_prior_out_is_folder, exit_code=2),
    Case("fit-prior-disk-full-keeps-old", fit_prior_disk_full),
    Case("fit-prior-no-relevant-judgement", fit_prior_no_relevant_judgement),
    # --- 7. malformed side files ---------------------------------------------------------------------
    Case("prior-file-json-array", prior_file_case("[0.1, 10]", "JSON object", "list")),
    Case("prior-file-json-string", prior_file_case('"hub"', "JSON object", "str")),
    Case("prior-file-not-json", prior_file_case("{beta: 0.1", "not valid JSON")),
    Case("prior-file-not-utf8", prior_file_bytes),
    Case("prior-file-unknown-kind", prior_file_case('{"kind": "magic"}', "kind 'magic'")),
    Case(
        "faiss-records-shorter-than-index",
        faiss_state_edit(_drop_record, "{records_name}", "12 vectors", "describes 11"),
    ),
    Case(
        "faiss-records-longer-than-index",
        faiss_state_edit(_extra_record, "{records_name}", "describes 13", "disagree"),
    ),
    Case(
        "faiss-state-dimension-disagrees",
        faiss_state_edit(_state_dimension, "index has dimension 32", "says 16"),
    ),
    Case(
        "faiss-index-of-another-dimension",
        faiss_state_edit(_other_index, "index has dimension 16"),
    ),
    Case(
        "faiss-record-not-a-pair", faiss_state_edit(_record_not_pair, "{records}", "lists or null")
    ),
    Case(
        "faiss-tombstone-out-of-range",
        faiss_state_edit(_tombstone_out_of_range, "{records}", "tombstones"),
    ),
    Case(
        "faiss-duplicate-record", faiss_state_edit(_duplicate_record, "{records}", "appears twice")
    ),
    Case("memory-store-vectors-and-records-disagree", memory_store_disagree),
]
CASES += HOSTILE_CASES


# ============================================================================= plug-in surfaces
# The remaining plug-in surfaces: a Ray cluster nobody answers at, FAISS factory strings a
# store cannot serve, model folders whose config.json does not describe their weights.


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ray_dead_address(*extra: str) -> Callable[[Env], Built]:
    """``--engine ray --address`` at a port nobody listens on: one line, in bounded time."""

    def build(env: Env) -> Built:
        import time

        address = f"127.0.0.1:{_free_port()}"
        new = env.tmp / "ray-new"
        args = [*env.index_args(env.corpus(), f"faiss:{new}"), "--engine", "ray"]
        started = time.monotonic()

        def after() -> None:
            assert time.monotonic() - started < 60, "a dead Ray address was not given up on"
            _gone(new)()

        return Built(
            [*args, "--address", address, *extra],
            [f"Ray at {address}", "did not answer", "is the cluster running"],
            after=after,
        )

    return build


def faiss_factory(factory: str, *needles: str, patches: bool = False) -> Callable[[Env], Built]:
    """A new FAISS store with ``--faiss-index factory``: refused, no folder left behind."""

    def build(env: Env) -> Built:
        import magretrieve.stores.base as base

        new = env.tmp / "fx" / "new"
        args = [*env.index_args(env.corpus(), f"faiss:{new}"), "--faiss-index", factory]
        fail = [(base.os, "fsync", _failing(_os_error(28, "No space left on device")))]
        return Built(
            args,
            [str(new), *needles],
            after=_gone(env.tmp / "fx"),
            patches=fail if patches else [],
        )

    return build


def _config(**values: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config.update(values)
        (folder / "config.json").write_text(json.dumps(config))

    return edit


def model_config_case(command: str, edit: Callable[[Path], None], *needles: str):
    """A model folder whose config.json disagrees with its weights, via train/export/eval."""

    def build(env: Env) -> Built:
        folder = _model_copy(env, "edited-model")
        edit(folder)
        out = env.tmp / "out"
        if command == "export":
            args = ["export", str(folder), str(out), "--exporter", "torchscript"]
        elif command == "train":
            args = env.train_args(f"{env.beir}:test")
            args[args.index("--model") + 1] = str(folder)
            out = env.tmp / "run"
        else:
            args = ["eval", "--model", str(folder), "--data", f"{env.beir}:test", "--json"]
        return Built(
            args,
            [str(folder), "config.json disagrees with the weights", *needles],
            after=_gone(out),
        )

    return build


# -- query texts with nothing to encode: the rule `search` applies, for every query source ---

#: Lines a tokenizer reads as nothing (zero-width space, word joiner, a BOM on its own line),
#: which ``str.strip`` keeps: each is refused as ``search`` refuses the same text.
INVISIBLE_QUERIES = "\u200b\n\u2060\n\ufeff\n"


def _query_file(env: Env, body: str) -> Path:
    path = env.tmp / "queries.txt"
    path.write_text(body, encoding="utf-8")
    return path


def recall_query_file(body: str, line: int) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        path = _query_file(env, body)
        args = ["recall", str(env.export), "--store", env.spec, "--queries", str(path)]
        return Built(args, [f"{path}:{line}", "nothing to encode"], store=env.spec)

    return build


def tuning_query_file(body: str, line: int) -> Callable[[Env], Built]:
    def build(env: Env) -> Built:
        path = _query_file(env, body)
        args = [*env.index_args(env.corpus()), "--tuning-queries", str(path)]
        return Built(args, [f"{path}:{line}", "nothing to encode"], store=env.spec)

    return build


def tuning_query_list_api(env: Env) -> Built:
    from magretrieve.serving.retriever import Retriever

    r = Retriever.load(env.export, store=env.spec, create=False)
    return Built(
        lambda: r.use_tuning_queries(["statins heart", "\u2060\u200b"]),
        ["tuning_queries[1]", "nothing to encode"],
        r.store,
    )


def search_invisible_text(env: Env) -> Built:
    """The reference: what ``search`` already says about the same text."""
    args = ["search", str(env.export), "\u200b\u2060\ufeff", "--store", env.spec]
    return Built(args, ["only whitespace and invisible characters"], store=env.spec)


BLANK_TEXT_CASES: list[Case] = [
    Case("recall-queries-only-invisible-characters", recall_query_file(INVISIBLE_QUERIES, 1)),
    Case("recall-queries-zero-width-space-line", recall_query_file("statins heart\n\u200b\n", 2)),
    Case("recall-queries-word-joiner-line", recall_query_file("heart\n\n \u2060\t\n", 3)),
    Case("recall-queries-bom-line", recall_query_file("statins heart\n\ufeff\nheart\n", 2)),
    Case("index-tuning-queries-only-invisible", tuning_query_file(INVISIBLE_QUERIES, 1)),
    Case("index-tuning-queries-bom-line", tuning_query_file("heart\n\ufeff\n", 2)),
    Case("tuning-queries-invisible-text-api", tuning_query_list_api, error=DataError),
    Case("search-invisible-text", search_invisible_text),
]
CASES += BLANK_TEXT_CASES


PLUGIN_CASES: list[Case] = [
    Case("index-ray-dead-address", ray_dead_address("--connect-timeout", "2")),
    Case("index-ray-dead-address-default-timeout", ray_dead_address()),
    Case(
        "faiss-factory-pca-without-refine",
        faiss_factory("PCA8,Flat", "PCAMatrix", "changes inner products", "'PCA8,Flat,RFlat'"),
    ),
    Case(
        "faiss-factory-opq-projection-without-refine",
        faiss_factory("OPQ4_16,IVF4,PQ4", "OPQMatrix", "changes inner products", ",RFlat"),
    ),
    Case("faiss-factory-nsg", faiss_factory("NSG32,Flat", "NSG", "cannot add vectors later")),
    Case(
        "faiss-new-store-disk-full-leaves-no-folder",
        faiss_factory("HNSW16,Flat", "No space left on device", patches=True),
    ),
    Case(
        "model-config-hidden-size-export",
        model_config_case(
            "export", _config(hidden_size=48), "embeddings.word_embeddings.weight", ", 32]"
        ),
    ),
    Case(
        "model-config-hidden-size-train",
        model_config_case("train", _config(hidden_size=48), ", 48] by config.json"),
    ),
    Case(
        "model-config-hidden-size-eval",
        model_config_case("eval", _config(hidden_size=48), ", 48] by config.json"),
    ),
    Case(
        "model-config-more-layers-than-weights",
        model_config_case("export", _config(num_hidden_layers=3), "encoder.layer.2."),
    ),
    Case(
        "model-config-fewer-layers-than-weights",
        model_config_case("export", _config(num_hidden_layers=1), "encoder.layer.1."),
    ),
]
CASES += PLUGIN_CASES


def test_catalogue_is_large_and_ids_are_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 120


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_clearly_and_loses_nothing(
    case: Case, env: Env, monkeypatch: pytest.MonkeyPatch
) -> None:
    built = case.build(env)
    before = snapshot(built.store) if built.store is not None else None
    for obj, name, value in built.patches:
        monkeypatch.setattr(obj, name, value, raising=False)
    if callable(built.run):
        with pytest.raises(case.error) as info:
            built.run()
        assert isinstance(info.value, MagRetrieveError)
        message = str(info.value)
    else:
        result = CliRunner().invoke(main, built.run, catch_exceptions=True)
        assert result.exit_code == case.exit_code, result.output
        # click saw no unhandled exception: a user sees a message, never a traceback
        assert isinstance(result.exception, SystemExit), result.exception
        assert "Traceback" not in result.output
        errors = [ln for ln in result.output.splitlines() if ln.startswith("Error:")]
        assert len(errors) == 1, result.output
        message = errors[0]
    for needle in built.needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    monkeypatch.undo()
    if built.store is not None:
        assert snapshot(built.store) == before, "something already stored changed"
    if built.after is not None:
        built.after()


# ----------------------------------------------------------------------------- non-refusals


def test_empty_documents_refused_for_indexing_but_kept_for_beir_evaluation(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    """cranfield has two empty documents: evaluation keeps them (warning), indexing refuses."""
    from magretrieve.data.readers import load_beir, load_corpus

    _append(
        env.beir / "corpus.jsonl", json.dumps({"_id": "empty", "title": "", "text": " "}) + "\n"
    )
    with pytest.raises(DataError, match=r"corpus.jsonl:13: document 'empty' has empty"):
        load_corpus(env.beir / "corpus.jsonl")
    caplog.set_level("WARNING", logger="magretrieve.data.readers")
    data = load_beir(f"{env.beir}:test")
    assert "empty" in data.corpus and len(data.corpus) == 13
    assert any("'empty' has empty title and text (kept)" in r.getMessage() for r in caplog.records)
    result = CliRunner().invoke(main, env.eval_args(), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output[result.output.index("{") :])["n_queries"] == 6


LONG = " ".join(["statins"] * 400)  # 400 word tokens: far beyond max_document_length 128


def test_long_texts_are_truncated_counted_and_reported(env: Env) -> None:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    enc = OnnxEncoder.load(env.export)
    limit = enc.manifest.max_document_length
    prefix = " ".join(["statins"] * (limit - 2))  # + [CLS] and [SEP] = exactly the limit
    vecs = enc.encode_documents([LONG, prefix, "statins heart"])
    assert enc.last_truncated == 1 and enc.truncated_counts == {"query": 0, "document": 1}
    np.testing.assert_allclose(vecs[0], vecs[1], atol=1e-6)  # only the first tokens count
    enc.encode_queries([LONG])
    assert enc.truncated_counts == {"query": 1, "document": 1}

    corpus = env.tmp / "long.jsonl"
    docs = [{"_id": f"l{i}", "text": LONG + f" {i}"} for i in range(3)]
    docs += [{"_id": "short", "text": "statins heart"}]
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    result = CliRunner().invoke(main, env.index_args(corpus), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "4 added" in result.output
    assert f"3 document(s) longer than max_document_length={limit} tokens were truncated" in (
        result.output
    )


def test_torch_encoder_counts_truncated_texts(tiny_model_dir: Path) -> None:
    from magretrieve.train.encoder import Encoder

    enc = Encoder.load(tiny_model_dir, "qnorm", max_query_length=8, device="cpu")
    enc.encode_queries(["statins heart", "the a of and to in is for on with"])
    assert enc.last_truncated == 1
    # exactly at the limit is not truncated: 6 words + [CLS] + [SEP] = 8
    enc.encode_queries(["the a of and to in"])
    assert enc.last_truncated == 0


def test_a_real_cli_process_prints_one_line_and_no_traceback(env: Env) -> None:
    """The console script itself (not CliRunner): stderr is one line, exit code 1."""
    corpus = env.corpus(json.dumps({"_id": "n0", "text": "dup"}))
    exe = Path(sys.executable).parent / "magretrieve"
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "magretrieve"]
    proc = subprocess.run(
        [*cmd, *env.index_args(corpus)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"Error: {corpus}:4: duplicate document id 'n0' (first on line 1)"
    ]
    assert snapshot(env.spec)[0] == 12


def test_client_library_warnings_stay_out_of_the_terminal(env: Env) -> None:
    """qdrant_client warns about an API key over http: stderr keeps only our one line.

    With ``-v`` the library's remark is in the log, on one line.
    """
    exe = Path(sys.executable).parent / "magretrieve"
    cmd = [str(exe)] if exe.is_file() else [sys.executable, "-m", "magretrieve"]
    spec = f"qdrant:http://127.0.0.1:{_free_port()}/c"
    run_env = {**os.environ, "QDRANT_API_KEY": "not-a-real-key"}
    args = ["search", str(env.export), "statins", "--store", spec]
    quiet = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, env=run_env)
    assert quiet.returncode == 1, quiet.stderr
    assert len(quiet.stderr.strip().splitlines()) == 1, quiet.stderr
    assert quiet.stderr.startswith(f"Error: {spec}: ")
    assert "Warning" not in quiet.stderr and "not-a-real-key" not in quiet.stderr
    verbose = subprocess.run(
        [*cmd, "-v", *args], capture_output=True, text=True, timeout=120, env=run_env
    )
    assert verbose.returncode == 1
    assert (
        "DEBUG magretrieve.cli: UserWarning: Api key is used with an insecure connection. "
        "(from qdrant_client." in verbose.stderr
    )


def test_warning_routing_logs_libraries_and_shows_our_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Library warnings: one redacted DEBUG line; magretrieve's own: shown as Python does."""
    import warnings

    from magretrieve.cli._warnings import route_library_warnings

    caplog.set_level("DEBUG", logger="magretrieve.cli")
    sources = (("somelib.client", "postgresql://u:hunter2@h/db\nfailed"), ("magretrieve.x", "ours"))
    with pytest.warns(UserWarning) as shown:
        warnings.simplefilter("always")
        route_library_warnings()
        route_library_warnings()  # idempotent: still one handler
        for module, text in sources:
            code = compile(f"import warnings\nwarnings.warn({text!r})", "m.py", "exec")
            exec(code, {"__name__": module})
    assert [str(w.message) for w in shown] == ["ours"]
    logged = [r.getMessage() for r in caplog.records if r.name == "magretrieve.cli"]
    assert logged == ["UserWarning: postgresql://u:***@h/db failed (from somelib.client)"]


# ----------------------------------------------------------------------------- accepted on purpose, with a report


@pytest.mark.slow
def test_cranfield_indexes_with_skip_empty_and_is_refused_without(env: Env, shared_data: Path):
    """cranfield holds two empty documents (471, 995): refused as a whole (naming the line and
    the flag, no store created), indexed with --skip-empty (1,398 stored, the two reported)."""
    corpus = shared_data / "cranfield" / "corpus.jsonl"
    target = env.tmp / "cranfield-ix"
    refused = CliRunner().invoke(main, env.index_args(corpus, f"faiss:{target}"))
    assert refused.exit_code == 1
    assert f"{corpus}:471: document '471' has empty title and text" in refused.output
    assert "--skip-empty" in refused.output and not target.exists()
    done = CliRunner().invoke(main, [*env.index_args(corpus, f"faiss:{target}"), "--skip-empty"])
    assert done.exit_code == 0, done.output
    assert "1398 added" in done.output and "1398 in store" in done.output
    assert "2 document(s) with empty title and text were skipped" in done.output
    assert "'471', '995'" in done.output
    store = open_store(f"faiss:{target}")
    assert store.count() == 1398 and not store.existing(["471", "995"])
    store.close()


def test_skip_empty_counts_like_truncation_and_indexes_the_rest(env: Env) -> None:
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    corpus = env.corpus(
        json.dumps({"_id": "e1", "text": " "}),
        json.dumps({"_id": "e2", "title": "", "text": ""}),
        # zero-width space, BOM and a lone combining mark: nothing a tokenizer reads
        json.dumps({"_id": "e3", "title": "\u200b", "text": "\ufeff\u0301"}),
    )
    with Retriever.load(env.export, store=f"faiss:{env.tmp / 'new'}") as r:
        report = index_corpus(r, corpus, skip_empty=True, progress=False)
    assert (report.added, report.empty_skipped, report.empty_ids) == (3, 3, ["e1", "e2", "e3"])
    assert report.count == 3


def test_integer_ids_and_integral_grades_are_still_accepted(env: Env) -> None:
    """Refusing NaN ids and fractional grades must not refuse what BEIR files really hold."""
    from magretrieve.data.readers import load_beir

    lines = (env.beir / "corpus.jsonl").read_text().replace('"_id": "d00"', '"_id": 7')
    (env.beir / "corpus.jsonl").write_text(lines)
    _qrels(env, "query-id\tcorpus-id\tscore\nt0\t7\t2.0\nt1\td11\t-1\nt2\td21\t1000\n")
    data = load_beir(f"{env.beir}:test")
    assert "7" in data.corpus
    assert data.qrels == {"t0": {"7": 2}, "t1": {"d11": -1}, "t2": {"d21": 1000}}


def test_an_export_with_a_swapped_tokenizer_gets_another_fingerprint(env: Env) -> None:
    """A resealed attack: tokenizer swapped, its sha updated, manifest resealed. The export
    loads (it is consistent) but it is another model to every store built by the original."""
    from magretrieve.core.manifest import Manifest

    folder = env.bad_export(_swap_tokenizer)
    original, swapped = Manifest.load(env.export), Manifest.load(folder)
    assert swapped.model_fingerprint != original.model_fingerprint
    assert swapped.files["document.onnx"] == original.files["document.onnx"]  # graphs unchanged
