"""SIGKILL an indexing process at random points, resume, and check nothing was lost or doubled.

Each *run* indexes a synthetic corpus with the tiny random BERT export (ONNX, one
onnxruntime thread) into a fresh store through :func:`magretrieve.indexing.index_corpus`,
in a child process. The child is killed with SIGKILL at a uniformly random moment of its
indexing (``--kills`` times per run, each resumed run killed again), then a final resume
runs to completion. A run passes when:

- the store opens after every kill (no half-written state is ever left behind),
- the final count equals the corpus size and every corpus id is stored exactly once,
- stored vectors and payloads equal those of an uninterrupted run (max |Δ| ≤ 1e-5: batches
  differ after a resume, so padding widths differ),
- top-10 search results for 20 queries equal the uninterrupted run's (ids; scores ≤ 1e-5).

    python benchmarks/crash_safety.py                      # 24 runs × 2 kills on FAISS flat
    python benchmarks/crash_safety.py --backends faiss,memory,qdrant-edge   # + 8 runs each

Writes benchmarks/results/crash_safety.md. tests/test_crash_safety.py imports this module
and runs a few kills of the same procedure.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "crash_safety.md"
WORDS = (
    "statin statins mortality heart risk cancer cell cells protein gene brain blood drug "
    "trial patients reduce increase effect study wing flow pressure air speed boundary layer "
    "plane engine heat low high dose vitamin aspirin smoking lung liver kidney mouse mice"
).split()

#: The child: open the store, say "ready", index, report. Killed somewhere in between.
CHILD = """
import json, sys, time
from magretrieve.indexing import index_corpus
from magretrieve.retriever import Retriever
export, spec, corpus, batch, every = sys.argv[1:6]
r = Retriever.load(export, store=spec, threads=1)
print("ready", flush=True)
t = time.perf_counter()
rep = index_corpus(r, corpus, batch_size=int(batch), checkpoint_every=int(every), progress=False)
seconds = time.perf_counter() - t
r.close()
print(json.dumps({"seconds": seconds, "added": rep.added, "count": rep.count}), flush=True)
"""


def spec_for(backend: str, folder: Path) -> str:
    """Store spec of an exact backend in ``folder``."""
    return {
        "faiss": f"faiss:{folder}",
        "memory": f"memory:{folder}",
        "qdrant-edge": f"qdrant-edge:{folder}",
    }[backend]


def write_corpus(path: Path, n: int, seed: int = 0) -> list[str]:
    """``n`` documents with distinct texts (no score ties between different ids)."""
    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    ids = []
    with path.open("w") as fh:
        while len(ids) < n:
            text = " ".join(rng.choice(WORDS, size=int(rng.integers(3, 24))))
            if text in seen:
                continue
            seen.add(text)
            doc_id = f"doc{len(ids)}"
            ids.append(doc_id)
            fh.write(json.dumps({"_id": doc_id, "title": f"T{len(ids)}", "text": text}) + "\n")
    return ids


def queries(n: int = 20, seed: int = 1) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=3)) for _ in range(n)]


def start_child(export: Path, spec: str, corpus: Path, batch: int, every: int) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(export), spec, str(corpus), str(batch), str(every)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _readline(proc: subprocess.Popen, timeout: float) -> str:
    """One stdout line of the child, or '' if it died or took longer than ``timeout``."""
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    return out[0].strip() if out else ""


def run_child(export: Path, spec: str, corpus: Path, batch: int, every: int) -> dict[str, Any]:
    """An uninterrupted indexing run; returns its report (seconds of indexing, counts)."""
    proc = start_child(export, spec, corpus, batch, every)
    stdout, stderr = proc.communicate(timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"indexing child failed ({proc.returncode}): {stderr[-2000:]}")
    return json.loads(stdout.strip().splitlines()[-1])


def kill_child(export: Path, spec: str, corpus: Path, batch: int, every: int, delay: float) -> bool:
    """Start indexing, SIGKILL it ``delay`` s after it is ready; True if it was still running."""
    proc = start_child(export, spec, corpus, batch, every)
    if _readline(proc, 120) != "ready":
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"indexing child did not start: {err[-2000:]}")
    time.sleep(delay)
    killed = proc.poll() is None
    proc.kill()  # SIGKILL on POSIX
    proc.communicate(timeout=60)
    return killed


def store_contents(
    spec: str, dimension: int | None = None
) -> tuple[int, dict[str, tuple[np.ndarray, dict]], list[str]]:
    """(count, {id: (vector, payload)}, every stored id including duplicates) of a store.

    ``dimension`` lets a store that was killed before its first checkpoint open as empty.
    """
    from magretrieve.adapters import open_store

    store = open_store(spec, dimension=dimension)
    try:
        ids = list(store.iter_ids())
        records = store.get(ids)
        content = {r.id: (np.asarray(r.vector), dict(r.payload)) for r in records if r}
        return store.count(), content, ids
    finally:
        store.close()


def search_results(export: Path, spec: str, texts: list[str]) -> list[list[tuple[str, float]]]:
    from magretrieve.retriever import Retriever

    with Retriever.load(export, store=spec, create=False, threads=1) as r:
        return [[(h.id, h.score) for h in hits] for hits in r.search_batch(texts, k=10)]


@dataclass
class Reference:
    """What an uninterrupted run stored, and how long its indexing took."""

    ids: list[str]
    content: dict[str, tuple[np.ndarray, dict]]
    hits: list[list[tuple[str, float]]]
    seconds: float
    dimension: int


def reference_run(
    export: Path, backend: str, folder: Path, corpus: Path, batch: int, every: int
) -> Reference:
    spec = spec_for(backend, folder)
    report = run_child(export, spec, corpus, batch, every)
    count, content, ids = store_contents(spec)
    dim = len(next(iter(content.values()))[0])
    return Reference(ids, content, search_results(export, spec, queries()), report["seconds"], dim)


def compare(export: Path, spec: str, corpus_ids: list[str], ref: Reference) -> list[str]:
    """Everything that differs from the uninterrupted run (empty list: the run passed)."""
    problems = []
    count, content, ids = store_contents(spec)
    if count != len(corpus_ids):
        problems.append(f"count {count} != corpus {len(corpus_ids)}")
    if len(ids) != len(set(ids)):
        problems.append(f"{len(ids) - len(set(ids))} duplicate id(s)")
    if set(ids) != set(corpus_ids):
        missing = sorted(set(corpus_ids) - set(ids))
        problems.append(f"{len(missing)} missing id(s), e.g. {missing[:3]}")
    worst = 0.0
    for doc_id, (vec, payload) in content.items():
        want = ref.content.get(doc_id)
        if want is None:
            continue
        worst = max(worst, float(np.max(np.abs(vec - want[0]))))
        if payload != want[1]:
            problems.append(f"payload of {doc_id!r} differs")
            break
    if worst > 1e-5:
        problems.append(f"stored vectors differ by up to {worst:.2e}")
    got = search_results(export, spec, queries())
    for q, (g, w) in enumerate(zip(got, ref.hits, strict=True)):
        if [i for i, _ in g] != [i for i, _ in w]:
            problems.append(f"query {q}: hits {g[:3]} != {w[:3]}")
            break
        if not np.allclose([s for _, s in g], [s for _, s in w], atol=1e-5):
            problems.append(f"query {q}: scores differ")
            break
    return problems


@dataclass
class RunResult:
    backend: str
    run: int
    delays: list[float]
    killed: list[bool]
    count_after_kills: list[int]
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def crash_run(
    export: Path,
    backend: str,
    folder: Path,
    corpus: Path,
    corpus_ids: list[str],
    ref: Reference,
    rng: random.Random,
    *,
    kills: int = 2,
    batch: int = 8,
    every: int = 16,
    run: int = 0,
) -> RunResult:
    """Kill ``kills`` times at random moments (each resume killed again), resume, compare."""
    spec = spec_for(backend, folder)
    result = RunResult(backend, run, [], [], [])
    stored = 0
    for _ in range(kills):
        # a resumed run has only the rest to do: aim inside its (shorter) indexing time
        remaining = 1.0 - stored / len(corpus_ids)
        delay = rng.uniform(0.0, ref.seconds * 1.05 * max(remaining, 0.05))
        result.delays.append(round(delay, 3))
        result.killed.append(kill_child(export, spec, corpus, batch, every, delay))
        try:  # the store must open after every kill
            stored = store_contents(spec, dimension=ref.dimension)[0]
            result.count_after_kills.append(stored)
        except Exception as exc:  # noqa: BLE001 - any failure to open is the finding
            result.problems.append(f"store does not open after a kill: {exc}")
            return result
    report = run_child(export, spec, corpus, batch, every)
    if report["count"] != len(corpus_ids):
        result.problems.append(f"resume reported count {report['count']}")
    result.problems += compare(export, spec, corpus_ids, ref)
    return result


def tiny_export(cache: Path) -> Path:
    """The tiny random BERT of tests/conftest.py, exported (TorchScript) once into ``cache``."""
    out = cache / "export-qnorm"
    if (out / "magretrieve.json").is_file():
        return out
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import build_tiny_bert

    from magretrieve.export import export_model

    model = build_tiny_bert(cache / "tiny-bert")
    export_model(model, out, mode="qnorm", exporter="torchscript", overwrite=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=24, help="runs on the first backend")
    parser.add_argument("--other-runs", type=int, default=8, help="runs on each further backend")
    parser.add_argument("--kills", type=int, default=2, help="SIGKILLs per run (before resume)")
    parser.add_argument("--docs", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--checkpoint-every", type=int, default=16)
    parser.add_argument("--backends", default="faiss", help="comma list: faiss,memory,qdrant-edge")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", type=Path, default=Path("/work/cache/crash_safety"))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    args.cache.mkdir(parents=True, exist_ok=True)
    export = tiny_export(args.cache)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="crash-safety-"))
    corpus = work / "corpus.jsonl"
    corpus_ids = write_corpus(corpus, args.docs)
    results: list[RunResult] = []
    refs: dict[str, Reference] = {}
    started = time.perf_counter()
    try:
        for backend in args.backends.split(","):
            ref = reference_run(
                export, backend, work / f"ref-{backend}", corpus, args.batch_size,
                args.checkpoint_every,
            )  # fmt: skip
            refs[backend] = ref
            print(f"{backend}: uninterrupted indexing of {args.docs} docs: {ref.seconds:.2f} s")
            n_runs = args.runs if backend == args.backends.split(",")[0] else args.other_runs
            for run in range(n_runs):
                folder = work / f"{backend}-{run}"
                res = crash_run(
                    export, backend, folder, corpus, corpus_ids, ref, rng, kills=args.kills,
                    batch=args.batch_size, every=args.checkpoint_every, run=run,
                )  # fmt: skip
                results.append(res)
                shutil.rmtree(folder, ignore_errors=True)
                print(
                    f"{backend} run {run:2d}: kills at {res.delays} s "
                    f"(killed mid-run: {res.killed}), stored after kills {res.count_after_kills}"
                    f" -> {'ok' if res.ok else 'FAIL ' + '; '.join(res.problems)}"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    elapsed = time.perf_counter() - started
    write_report(args, results, refs, elapsed)
    failures = sum(not r.ok for r in results)
    kills = sum(len(r.killed) for r in results)
    mid = sum(sum(r.killed) for r in results)
    print(f"runs {len(results)}, SIGKILLs {kills} ({mid} mid-indexing), failures {failures}")
    print(f"wrote {args.out}")
    return 1 if failures else 0


def write_report(
    args: argparse.Namespace, results: list[RunResult], refs: dict, elapsed: float
) -> None:
    command = "python benchmarks/crash_safety.py" + (
        "" if sys.argv[1:] == [] else " " + " ".join(sys.argv[1:])
    )
    lines = [
        "# Crash safety: SIGKILL during indexing, then resume",
        "",
        f"Command: `{command}` ({elapsed:.0f} s wall clock)",
        "",
        f"- corpus: {args.docs} synthetic documents (distinct texts), tiny random BERT export "
        "(hidden 32, qnorm, ONNX, 1 thread)",
        f"- `index_corpus(batch_size={args.batch_size}, checkpoint_every={args.checkpoint_every})` "
        "in a child process, SIGKILLed at a uniformly random moment of its indexing "
        f"({args.kills} kills per run: the resumed run is killed again), then resumed to the end",
        "- pass = the store opens after every kill; final count = corpus; every id once; "
        "vectors/payloads and top-10 hits of 20 queries equal an uninterrupted run",
        "",
        "| backend | runs | SIGKILLs | killed mid-indexing | docs stored at kills (min–max) "
        "| uninterrupted indexing s | failures |",
        "|---|---:|---:|---:|---|---:|---:|",
    ]
    for backend, ref in refs.items():
        rs = [r for r in results if r.backend == backend]
        counts = [c for r in rs for c in r.count_after_kills]
        lines.append(
            f"| {backend} | {len(rs)} | {sum(len(r.killed) for r in rs)} | "
            f"{sum(sum(r.killed) for r in rs)} | "
            f"{min(counts, default=0)}–{max(counts, default=0)} | {ref.seconds:.2f} | "
            f"{sum(not r.ok for r in rs)} |"
        )
    bad = [r for r in results if not r.ok]
    lines += ["", "Failures: none." if not bad else "Failures:"]
    lines += [f"- {r.backend} run {r.run}: {'; '.join(r.problems)}" for r in bad]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
