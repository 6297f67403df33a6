"""SIGKILL `export --overwrite`, `rescale` (each store kind), `fit-prior`, `annotate` and
re-annotate (Qdrant, pgvector) at random moments.

Each operation runs as the ``magretrieve`` CLI in a child process (``main([...])`` after the
imports, so the kill lands in the command's own work), is SIGKILLed after a uniformly random
delay in [0, 1.1 × its uninterrupted duration], and then the target is classified:

- ``old``: exactly what was there before (export: byte-identical files; rescale: no target or
  an empty one with no metadata; prior file: the old bytes; annotate: no annotation and no
  point holding m; re-annotate: the old record and every old m);
- ``new``: exactly what an uninterrupted run makes (export: same vectors on fixed texts;
  rescale: every id with the reference vector and recipe; prior file: the reference bytes;
  (re-)annotate: the reference record and every point's reference m);
- ``incomplete``: the target says so itself (rescale, annotate: metadata marked
  ``incomplete``, which every Retriever refuses — and an annotated store's own search then
  ranks by plain cosine, checked; export: the old export set aside by an interrupted swap) —
  and then re-running the same command must finish it and give ``new``.

Anything else (a target that opens and serves but is neither old nor new, a torn file, a
target that does not open) is a failure. After a kill that left a rescale or an export
incomplete (and after every kill of fit-prior and rescale, and every fourth of export) the
same command is run again to completion and must give ``new``, so leftovers (staging folders,
temp files) never block it; after the other export kills the export's first step (clean-up of
dead staging folders) runs in-process and must leave the target as it was.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

#: The child: import the CLI, say "ready", run one command, say "done".
CHILD = """
import sys
from magretrieve.cli import main
print("ready", flush=True)
main(sys.argv[1:], standalone_mode=False)
print("done", flush=True)
"""

RESCALE_KINDS = ("faiss", "memory", "qdrant-local", "qdrant-edge")
TEXTS = ["statins heart", "wing flow pressure", "a", "vitamin dose cancer risk"]


@dataclass
class OpRun:
    """One kill of one operation and what was found afterwards."""

    operation: str
    kind: str
    run: int
    delay: float
    killed: bool
    state: str = ""
    resumed: bool = False
    leftovers: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def _spawn(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return out[0].strip() if out else ""


def run_to_end(args: list[str]) -> float:
    """Run a command uninterrupted; seconds from 'ready' to its end."""
    proc = _spawn(args)
    if _readline(proc, 300) != "ready":
        proc.kill()
        raise RuntimeError(f"child did not start: {proc.communicate()[1][-2000:]}")
    start = time.perf_counter()
    _, err = proc.communicate(timeout=900)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed ({proc.returncode}): {err[-2000:]}")
    return seconds


def kill_after(args: list[str], delay: float) -> bool:
    """Start a command and SIGKILL it ``delay`` s after 'ready'; True if it was still running."""
    proc = _spawn(args)
    if _readline(proc, 300) != "ready":
        proc.kill()
        raise RuntimeError(f"child did not start: {proc.communicate()[1][-2000:]}")
    time.sleep(delay)
    alive = proc.poll() is None
    proc.kill()
    proc.communicate(timeout=60)
    return alive


def _hashes(folder: Path) -> dict[str, str]:
    from magretrieve.core.manifest import hash_folder

    return hash_folder(folder, exclude=())


def _vectors(export: Path) -> np.ndarray:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    enc = OnnxEncoder.load(export, threads=1)
    return np.concatenate([enc.encode_queries(TEXTS), enc.encode_documents(TEXTS)])


# ----------------------------------------------------------------------------- export


@dataclass
class ExportSetup:
    model: Path
    old: Path
    reference: Path
    seconds: float
    old_hashes: dict[str, str]
    new_vectors: np.ndarray


def export_args(model: Path, target: Path) -> list[str]:
    return ["export", str(model), str(target), "--mode", "cosine", "--overwrite"] + [
        "--exporter",
        "torchscript",
    ]


def setup_export(cache: Path, work: Path) -> ExportSetup:
    """The tiny model, its qnorm export (the old state) and a cosine export (the new one)."""
    from _common import tiny_models

    from magretrieve.core.errors import MagRetrieveError
    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model

    model = cache / "tiny-bert"
    if not (model / "model.safetensors").is_file():
        tiny_models().build_tiny_bert(model)
    old = cache / "export-qnorm-old"
    try:
        Manifest.load(old)
    except MagRetrieveError:  # absent, or written by another magretrieve version: rebuild
        export_model(model, old, mode="qnorm", exporter="torchscript", overwrite=True)
    reference = work / "export-new-reference"
    seconds = run_to_end(export_args(model, reference))
    return ExportSetup(model, old, reference, seconds, _hashes(old), _vectors(reference))


def classify_export(target: Path, setup: ExportSetup) -> tuple[str, list[str]]:
    from magretrieve.core.errors import MagRetrieveError
    from magretrieve.core.manifest import Manifest
    from magretrieve.export.publish import interrupted_previous

    if not target.exists():
        if interrupted_previous(target) is not None:
            return "incomplete", []
        return "", [f"{target} is missing and no previous export was set aside"]
    try:
        manifest = Manifest.load(target, verify=True)
    except MagRetrieveError as exc:
        return "", [f"target does not load: {exc}"]
    if _hashes(target) == setup.old_hashes:
        return "old", []
    if manifest.mode == "cosine" and np.allclose(_vectors(target), setup.new_vectors, atol=1e-5):
        return "new", []
    return "", ["target loads but is neither the old export nor the new one"]


def export_run(setup: ExportSetup, work: Path, rng: random.Random, run: int) -> OpRun:
    target = work / f"export-{run}" / "exp"
    target.parent.mkdir(parents=True)
    shutil.copytree(setup.old, target)
    delay = rng.uniform(0.0, setup.seconds * 1.1)
    result = OpRun("export --overwrite", "folder", run, round(delay, 3), False)
    result.killed = kill_after(export_args(setup.model, target), delay)
    result.state, result.problems = classify_export(target, setup)
    result.leftovers = len(list(target.parent.glob(".exp.tmp-*")))
    if result.state == "incomplete" or run % 4 == 0:
        # the same command again must finish from whatever the kill left (and clean it up)
        run_to_end(export_args(setup.model, target))
        state, problems = classify_export(target, setup)
        if state != "new":
            result.problems += [f"re-run did not give the new export: {state} {problems}"]
    else:
        # its first step (run in-process): the leftovers go, the target stays what it was
        from magretrieve.export.publish import recover

        recover(target, lambda msg: None)
        state, problems = classify_export(target, setup)
        if state != result.state:
            result.problems += [f"cleaning up changed the target: {state} {problems}"]
    if list(target.parent.glob(".exp.tmp-*")):
        result.problems.append("staging folders left after the next export's clean-up")
    result.resumed = result.state == "incomplete" and not result.problems
    shutil.rmtree(target.parent, ignore_errors=True)
    return result


# ----------------------------------------------------------------------------- rescale


@dataclass
class RescaleSetup:
    source: str
    n: int
    dimension: int
    seconds: dict[str, float]
    reference: dict[str, tuple[list[str], np.ndarray, list[dict[str, Any]], dict[str, Any]]]


def target_spec(kind: str, folder: Path) -> str:
    return {
        "faiss": f"faiss:{folder}",
        "memory": f"memory:{folder}",
        "qdrant-local": f"qdrant-local:{folder}/rescaled",
        "qdrant-edge": f"qdrant-edge:{folder}",
    }[kind]


def rescale_args(source: str, target: str) -> list[str]:
    return ["rescale", "--source", source, "--target", target, "--corpus-prior", "0.1", "--k", "5"]


def make_source(folder: Path, n: int, dim: int = 32, seed: int = 0) -> str:
    """A FAISS store of ``n`` unit vectors with the metadata a cosine export records."""
    from magretrieve.stores import open_store

    rng = np.random.default_rng(seed)
    vecs = rng.normal(size=(n, dim)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    spec = f"faiss:{folder}"
    store = open_store(spec, dimension=dim)
    ids = [f"doc{i}" for i in range(n)]
    store.add(ids, vecs, [{"title": f"T{i}", "text": f"text {i}"} for i in range(n)])
    store.write_metadata(
        {
            "model_fingerprint": "c" * 64,
            "mode": "cosine",
            "gamma_q": 1.0,
            "gamma_d": 1.0,
            "dimension": dim,
            "metric": "inner_product",
            "document_contract": "unit_norm",
        }
    )
    store.persist()
    store.close()
    return spec


def read_target(spec: str, dimension: int) -> tuple[int, dict[str, Any] | None, Any]:
    """(count, metadata, store) of a rescale target; the store is left open."""
    from magretrieve.stores import open_store

    store = open_store(spec, dimension=dimension)
    return store.count(), store.read_metadata(), store


def snapshot_target(spec: str, dimension: int) -> tuple[Any, ...]:
    from magretrieve.priors.rescale import read_all

    count, meta, store = read_target(spec, dimension)
    try:
        ids, vecs, pays = read_all(store)
    finally:
        store.close()
    return ids, vecs, pays, meta


def setup_rescale(work: Path, kinds: tuple[str, ...], n: int) -> RescaleSetup:
    source = make_source(work / "rescale-source", n)
    seconds, reference = {}, {}
    for kind in kinds:
        folder = work / f"rescale-ref-{kind}"
        spec = target_spec(kind, folder)
        seconds[kind] = run_to_end(rescale_args(source, spec))
        reference[kind] = snapshot_target(spec, 32)
    return RescaleSetup(source, n, 32, seconds, reference)


def classify_rescale(spec: str, kind: str, setup: RescaleSetup) -> tuple[str, list[str]]:
    from magretrieve.core.errors import StoreError
    from magretrieve.priors.rescale import INCOMPLETE_KEY, read_all
    from magretrieve.serving.retriever import check_compatible

    try:
        count, meta, store = read_target(spec, setup.dimension)
    except Exception as exc:  # a target that does not open is the finding
        return "", [f"target does not open: {type(exc).__name__}: {exc}"]
    try:
        if not meta:
            return ("old", []) if count == 0 else ("", [f"{count} points without metadata"])
        if meta.get(INCOMPLETE_KEY):
            model = SimpleNamespace(
                dimension=setup.dimension,
                index_metric="inner_product",
                document_contract="magnitude_keeping",
                mode="cosine",
                gamma_q=1.0,
                gamma_d=1.0,
                model_fingerprint="c" * 64,
                folder="",
            )
            try:
                check_compatible(model, store)
            except StoreError as exc:
                if "incomplete" in str(exc):
                    return "incomplete", []
            return "", ["marked incomplete, but a Retriever would serve it"]
        ids, vecs, pays = read_all(store)[:3]
        ref_ids, ref_vecs, ref_pays, ref_meta = setup.reference[kind]
        if ids != ref_ids or pays != ref_pays:
            return "", [f"marked complete with {len(ids)} of {len(ref_ids)} points"]
        if not np.allclose(vecs, ref_vecs, atol=1e-6) or meta != ref_meta:
            return "", ["marked complete but vectors or metadata differ from the reference"]
        return "new", []
    finally:
        store.close()


def rescale_run(setup: RescaleSetup, kind: str, work: Path, rng: random.Random, run: int) -> OpRun:
    folder = work / f"rescale-{kind}-{run}"
    spec = target_spec(kind, folder)
    delay = rng.uniform(0.0, setup.seconds[kind] * 1.1)
    result = OpRun("rescale", kind, run, round(delay, 3), False)
    result.killed = kill_after(rescale_args(setup.source, spec), delay)
    result.state, result.problems = classify_rescale(spec, kind, setup)
    state, problems = result.state, list(result.problems)
    if state in ("old", "incomplete"):  # the same command again must finish the job
        run_to_end(rescale_args(setup.source, spec))
        state, problems = classify_rescale(spec, kind, setup)
    if state != "new" and result.ok:
        result.problems.append(f"after re-running: {state or 'broken'} {problems}")
    result.resumed = result.state == "incomplete" and state == "new"
    shutil.rmtree(folder, ignore_errors=True)
    return result


# ----------------------------------------------------------------------------- fit-prior


@dataclass
class PriorSetup:
    args: Callable[[Path], list[str]]
    seconds: float
    new_bytes: bytes


OLD_PRIOR = b'{"kind": "document_prior", "method": "none", "note": "the old file"}\n'


def setup_fit_prior(export: Path, work: Path) -> PriorSetup:
    from _common import tiny_models

    beir = tiny_models().write_tiny_beir(work / "tiny-beir")

    def args(out: Path) -> list[str]:
        return ["fit-prior", "--model", str(export), "--data", f"{beir}:train", "--out", str(out)]

    ref = work / "prior-reference.json"
    seconds = run_to_end(args(ref))
    return PriorSetup(args, seconds, ref.read_bytes())


def fit_prior_run(setup: PriorSetup, work: Path, rng: random.Random, run: int) -> OpRun:
    folder = work / f"prior-{run}"
    folder.mkdir()
    out = folder / "prior.json"
    out.write_bytes(OLD_PRIOR)
    delay = rng.uniform(0.0, setup.seconds * 1.1)
    result = OpRun("fit-prior", "file", run, round(delay, 3), False)
    result.killed = kill_after(setup.args(out), delay)
    data = out.read_bytes() if out.is_file() else None
    if data == OLD_PRIOR:
        result.state = "old"
    elif data == setup.new_bytes:
        result.state = "new"
    else:
        result.problems.append(f"prior file is neither old nor new: {data[:80]!r}")
    result.leftovers = len([p for p in folder.iterdir() if p.name != "prior.json"])
    run_to_end(setup.args(out))
    if out.read_bytes() != setup.new_bytes:
        result.problems.append("re-run did not write the reference prior")
    shutil.rmtree(folder, ignore_errors=True)
    return result


# ----------------------------------------------------------------------------- annotate

ANNOTATE_BACKENDS = ("qdrant-local", "pgvector")
#: β of the first annotation (the old state of a re-annotate) and of the killed command.
OLD_BETA, NEW_BETA = 0.5, 1.0
FIELD = "magretrieve_m"


def annotate_args(spec: str, beta: float = NEW_BETA) -> list[str]:
    return ["annotate", "--store", spec, "--corpus-prior", str(beta), "--k", "5"]


@dataclass
class AnnotateSetup:
    """Templates of a Cosine store (unannotated and annotated with OLD_BETA), references."""

    n: int
    dimension: int
    units: np.ndarray
    make: Callable[[str, str], str]  # (template, run name) -> spec of a fresh copy
    seconds: dict[str, float]
    #: (operation, backend) -> (m by point id, annotation metadata) of an uninterrupted run
    new: dict[tuple[str, str], tuple[dict[str, float], dict[str, Any]]]
    #: backend -> the annotated template's state (the old state of a re-annotate)
    old: dict[str, tuple[dict[str, float], dict[str, Any]]]
    #: the PostgreSQL server of the pgvector runs (None without them); stop it when done
    pg: PgServer | None = None


class PgServer:
    """A throw-away PostgreSQL + pgvector (pgserver) for the pgvector runs; stop() deletes it."""

    def __init__(self, folder: Path) -> None:
        import pgserver

        self.server = pgserver.get_server(folder, cleanup_mode="delete")
        self.server.psql("CREATE EXTENSION IF NOT EXISTS vector;")
        self.uri = self.server.get_uri()

    def execute(self, statement: str, params: Any = None) -> list[Any]:
        import psycopg
        from pgvector.psycopg import register_vector

        with psycopg.connect(self.uri, autocommit=True) as conn:
            register_vector(conn)
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    def stop(self) -> None:
        self.server.cleanup()


def _cosine_units(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(8, dim))
    docs = centers[rng.integers(0, 8, n)] + 0.7 * rng.normal(size=(n, dim))
    return (docs / np.linalg.norm(docs, axis=1, keepdims=True)).astype(np.float32)


def make_qdrant_template(folder: Path, units: np.ndarray) -> None:
    """A Cosine collection as another pipeline writes it: integer ids, a title, scaled vectors."""
    from qdrant_client import QdrantClient, models

    client = QdrantClient(path=str(folder))
    client.create_collection(
        "docs",
        vectors_config=models.VectorParams(size=units.shape[1], distance=models.Distance.COSINE),
    )
    for s in range(0, len(units), 1024):
        client.upsert(
            "docs",
            points=[
                models.PointStruct(
                    id=i, vector=(units[i] * 2.0).tolist(), payload={"title": f"t{i}"}
                )
                for i in range(s, min(s + 1024, len(units)))
            ],
        )
    client.close()


def make_pg_template(pg: PgServer, table: str, units: np.ndarray) -> None:
    """A table as a typical pgvector pipeline makes it: bigint id, content, HNSW cosine index."""
    pg.execute(
        f"CREATE TABLE {table} (id bigint PRIMARY KEY, content text, "
        f"embedding vector({units.shape[1]}))"
    )
    import psycopg
    from pgvector.psycopg import register_vector

    with psycopg.connect(pg.uri, autocommit=True) as conn:
        register_vector(conn)
        with conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {table} VALUES (%s, %s, %s)",
                [(i, f"t{i}", units[i] * 2.0) for i in range(len(units))],
            )
    pg.execute(f"CREATE INDEX ON {table} USING hnsw (embedding vector_cosine_ops)")


def raw_annotation(spec: str) -> tuple[dict[str, float], dict[str, Any]]:
    """(m by point id, metadata) read around the store classes: what is really stored."""
    from magretrieve.priors.annotate import open_for_annotation

    store = open_for_annotation(spec)
    try:
        meta = dict(store.read_metadata() or {})
        m: dict[str, float] = {}
        if store.kind == "qdrant-cosine":
            for page in store.iter_points(1024):
                for p in page:
                    value = (p.payload or {}).get(FIELD)
                    if value is not None:
                        m[str(p.id)] = float(value)
        elif FIELD in store._cols_now:
            stmt = f'SELECT id::text, "{FIELD}" FROM {".".join(store._name)}'
            for doc_id, value in store.conn.execute(stmt).fetchall():
                if value is not None:
                    m[str(doc_id)] = float(value)
        return m, meta
    finally:
        store.close()


def setup_annotate(work: Path, backends: tuple[str, ...], n: int, dim: int = 32) -> AnnotateSetup:
    """Templates per backend, an annotated copy (the re-annotate's old state), references."""
    import uuid

    units = _cosine_units(n, dim)
    pg = PgServer(work / "pg") if "pgvector" in backends else None
    templates: dict[str, str] = {}

    def make(template: str, name: str) -> str:
        backend, source = templates[template].split("|", 1)
        if backend == "qdrant-local":
            folder = work / f"annotate-{name}"
            shutil.copytree(source, folder)
            return f"qdrant-local:{folder}/docs"
        assert pg is not None
        table = f"t_{uuid.uuid4().hex[:12]}"
        # INCLUDING ALL copies the HNSW index and the column COMMENTs (the annotation record)
        pg.execute(f"CREATE TABLE {table} (LIKE {source} INCLUDING ALL)")
        pg.execute(f"INSERT INTO {table} SELECT * FROM {source}")
        return f"pgvector:{pg.uri}#{table}"

    try:
        return _fill_annotate_setup(work, backends, units, pg, templates, make)
    except BaseException:
        if pg is not None:
            pg.stop()
        raise


def _fill_annotate_setup(
    work: Path,
    backends: tuple[str, ...],
    units: np.ndarray,
    pg: PgServer | None,
    templates: dict[str, str],
    make: Callable[[str, str], str],
) -> AnnotateSetup:
    from magretrieve.priors import HubPrior
    from magretrieve.priors.annotate import annotate_store

    n, dim = units.shape
    seconds: dict[str, float] = {}
    new: dict[tuple[str, str], tuple[dict[str, float], dict[str, Any]]] = {}
    old: dict[str, tuple[dict[str, float], dict[str, Any]]] = {}
    for backend in backends:
        if backend == "qdrant-local":
            folder = work / "annotate-template-qdrant"
            make_qdrant_template(folder, units)
            templates[f"{backend}:plain"] = f"{backend}|{folder}"
        else:
            assert pg is not None
            make_pg_template(pg, "template_plain", units)
            templates[f"{backend}:plain"] = f"{backend}|template_plain"
        annotated = make(f"{backend}:plain", f"{backend}-annotated-template")
        annotate_store(annotated, prior=HubPrior(OLD_BETA, 5), progress=False)
        source = (
            annotated.split(":", 1)[1].rsplit("/", 1)[0]
            if backend != "pgvector"
            else (annotated.rsplit("#", 1)[1])
        )
        templates[f"{backend}:annotated"] = f"{backend}|{source}"
        old[backend] = raw_annotation(annotated)
        for op, template in (("annotate", "plain"), ("re-annotate", "annotated")):
            spec = make(f"{backend}:{template}", f"{backend}-{op}-reference")
            seconds[f"{op} {backend}"] = run_to_end(annotate_args(spec))
            new[(op, backend)] = raw_annotation(spec)
    return AnnotateSetup(n, dim, units, make, seconds, new, old, pg)


def _serves_plain_cosine_or_refuses(spec: str, setup: AnnotateSetup) -> list[str]:
    """An incomplete store: a Retriever refuses it, and a store search ranks by plain cosine."""
    from magretrieve.core.errors import StoreError
    from magretrieve.serving.retriever import check_compatible
    from magretrieve.stores import open_store

    problems = []
    model = SimpleNamespace(
        dimension=setup.dimension,
        index_metric="inner_product",
        document_contract="magnitude_keeping",
        mode="cosine",
        gamma_q=1.0,
        gamma_d=1.0,
        model_fingerprint="c" * 64,
        folder="",
    )
    store = open_store(spec, prefetch=setup.n)
    try:
        try:
            check_compatible(model, store)
            problems.append("marked incomplete, but a Retriever would serve it")
        except StoreError as exc:
            if "incomplete" not in str(exc):
                problems.append(f"refused for another reason: {exc}")
        q = setup.units[:3]
        for row, hits in enumerate(store.search(q, 10, with_vectors=False)):
            scores = [h.score for h in hits]
            cosines = [float(setup.units[int(h.id)] @ q[row]) for h in hits]
            if any(h.doc_norm != 1.0 for h in hits) or not np.allclose(scores, cosines, atol=1e-5):
                problems.append("marked incomplete, but search used stored magnitudes")
                break
            if scores != sorted(scores, reverse=True) or len(hits) != 10:
                problems.append("marked incomplete, but search is not a cosine ranking")
                break
    finally:
        store.close()
    return problems


def classify_annotate(
    spec: str, op: str, backend: str, setup: AnnotateSetup
) -> tuple[str, list[str]]:
    from magretrieve.stores.qdrant_cosine_store import ANNOTATION_KEY, INCOMPLETE_KEY

    try:
        m, meta = raw_annotation(spec)
    except Exception as exc:  # a store that does not open is the finding
        return "", [f"store does not open: {type(exc).__name__}: {exc}"]
    if meta.get(INCOMPLETE_KEY):
        return "incomplete", _serves_plain_cosine_or_refuses(spec, setup)
    new_m, new_meta = setup.new[(op, backend)]
    same = lambda a, b: set(a) == set(b) and all(abs(a[i] - b[i]) <= 1e-6 for i in a)  # noqa: E731
    if op == "annotate" and not meta.get(ANNOTATION_KEY):
        return ("old", []) if not m else ("", [f"unannotated, but {len(m)} points hold m"])
    if op == "re-annotate" and meta == setup.old[backend][1]:
        if same(m, setup.old[backend][0]):
            return "old", []
        return "", ["old annotation record, but the stored m differ from the old ones"]
    if meta == new_meta:
        if same(m, new_m):
            return "new", []
        return "", [f"new annotation record, but {len(m)} stored m differ from the reference"]
    return "", ["annotation record is neither the old nor the new one"]


def annotate_run(
    setup: AnnotateSetup, op: str, backend: str, rng: random.Random, run: int
) -> OpRun:
    template = "plain" if op == "annotate" else "annotated"
    spec = setup.make(f"{backend}:{template}", f"{backend}-{op}-{run}")
    delay = rng.uniform(0.0, setup.seconds[f"{op} {backend}"] * 1.1)
    result = OpRun(op, backend, run, round(delay, 3), False)
    result.killed = kill_after(annotate_args(spec), delay)
    result.state, result.problems = classify_annotate(spec, op, backend, setup)
    state, problems = result.state, list(result.problems)
    if state in ("old", "incomplete"):  # the same command again must finish the job
        run_to_end(annotate_args(spec))
        state, problems = classify_annotate(spec, op, backend, setup)
    if state != "new" and result.ok:
        result.problems.append(f"after re-running: {state or 'broken'} {problems}")
    result.resumed = result.state == "incomplete" and state == "new"
    if backend == "qdrant-local":
        shutil.rmtree(spec.split(":", 1)[1].rsplit("/", 1)[0], ignore_errors=True)
    else:
        assert setup.pg is not None
        setup.pg.execute(f"DROP TABLE {spec.rsplit('#', 1)[1]}")
    return result


def summarize(results: list[OpRun]) -> list[dict[str, Any]]:
    """One row per (operation, kind): runs, kills mid-operation, outcomes, failures."""
    rows = []
    keys = sorted({(r.operation, r.kind) for r in results}, key=lambda k: (k[0], k[1]))
    for op, kind in keys:
        rs = [r for r in results if (r.operation, r.kind) == (op, kind)]
        rows.append(
            {
                "operation": op,
                "target": kind,
                "runs": len(rs),
                "killed_mid_operation": sum(r.killed for r in rs),
                "old": sum(r.state == "old" for r in rs),
                "new": sum(r.state == "new" for r in rs),
                "incomplete": sum(r.state == "incomplete" for r in rs),
                "incomplete_resumed": sum(r.resumed for r in rs),
                "leftover_temp": sum(r.leftovers > 0 for r in rs),
                "failures": sum(not r.ok for r in rs),
            }
        )
    return rows


def dumps(results: list[OpRun]) -> str:
    return json.dumps([r.__dict__ for r in results], indent=1)
