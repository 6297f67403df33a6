"""SIGKILL `export --overwrite`, `rescale` (each store kind) and `fit-prior` at random moments.

Each operation runs as the ``magretrieve`` CLI in a child process (``main([...])`` after the
imports, so the kill lands in the command's own work), is SIGKILLed after a uniformly random
delay in [0, 1.1 × its uninterrupted duration], and then the target is classified:

- ``old``: exactly what was there before (export: byte-identical files; rescale: no target or
  an empty one with no metadata; prior file: the old bytes);
- ``new``: exactly what an uninterrupted run makes (export: same vectors on fixed texts;
  rescale: every id with the reference vector and recipe; prior file: the reference bytes);
- ``incomplete``: the target says so itself (rescale: metadata marked ``incomplete``, which
  every Retriever refuses; export: the old export set aside by an interrupted swap) — and
  then re-running the same command must finish it and give ``new``.

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
    from magretrieve.serving.runtime import OnnxEncoder

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
    from magretrieve.core.errors import MagRetrieveError
    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model
    from magretrieve.train.testing import build_tiny_bert

    model = cache / "tiny-bert"
    if not (model / "model.safetensors").is_file():
        build_tiny_bert(model)
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
    except Exception as exc:  # noqa: BLE001 - a target that does not open is the finding
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
    from magretrieve.train.testing import write_tiny_beir

    beir = write_tiny_beir(work / "tiny-beir")

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
