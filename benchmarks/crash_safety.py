"""SIGKILL every multi-step write at random points; check old, new or incomplete-and-resumable.

Indexing (below) and, through :mod:`_crash_ops`, ``export --overwrite``, ``rescale`` into each
store kind, ``fit-prior``, and ``annotate`` / re-annotate of an existing Cosine Qdrant
collection and pgvector table (see that module for what is checked after each kill).

Each *run* indexes a synthetic corpus with the tiny random BERT export (ONNX, one
onnxruntime thread) into a fresh store through :func:`magretrieve.serving.indexing.index_corpus`,
in a child process. The child is killed with SIGKILL at a uniformly random moment of its
indexing (``--kills`` times per run, each resumed run killed again), then a final resume
runs to completion. A run passes when:

- the store opens after every kill (no half-written state is ever left behind),
- the final count equals the corpus size and every corpus id is stored exactly once,
- stored vectors and payloads equal those of an uninterrupted run (max |Δ| ≤ 1e-5: batches
  differ after a resume, so padding widths differ),
- top-10 search results for 20 queries equal the uninterrupted run's (ids; scores ≤ 1e-5).

    python benchmarks/crash_safety.py                      # everything, 20 runs each
    python benchmarks/crash_safety.py --ops index --backends faiss,memory,qdrant-edge
    python benchmarks/crash_safety.py --ops annotate,re-annotate --merge   # add rows to the file

Writes benchmarks/results/crash_safety.md and .json. tests/stores/test_crash_safety.py imports this
module and runs a few kills of the same procedures.
"""

from __future__ import annotations

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
from types import SimpleNamespace
from typing import Any

import _crash_ops as ops
import click
import numpy as np
from _common import (
    cache_dir,
    cpu_lock,
    lock_option,
    machine_summary,
    markdown_table,
    recorded_command,
    tiny_models,
)

RESULTS = Path(__file__).resolve().parent / "results" / "crash_safety.md"
TITLE = "# Crash safety: SIGKILL at random moments of every multi-step write"
#: Operations ``--ops`` selects.
OPS = ("index", "export", "rescale", "fit-prior", "annotate", "re-annotate")
WORDS = (
    "statin statins mortality heart risk cancer cell cells protein gene brain blood drug "
    "trial patients reduce increase effect study wing flow pressure air speed boundary layer "
    "plane engine heat low high dose vitamin aspirin smoking lung liver kidney mouse mice"
).split()

#: The child: open the store, say "ready", index, report. Killed somewhere in between.
CHILD = """
import json, sys, time
from magretrieve.serving.indexing import index_corpus
from magretrieve.serving.retriever import Retriever
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
        "chroma": f"chroma:{folder}/docs",
        "lancedb": f"lancedb:{folder}/docs",
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
    from magretrieve.stores import open_store

    store = open_store(spec, dimension=dimension)
    try:
        ids = list(store.iter_ids())
        records = store.get(ids)
        content = {r.id: (np.asarray(r.vector), dict(r.payload)) for r in records if r}
        return store.count(), content, ids
    finally:
        store.close()


def search_results(export: Path, spec: str, texts: list[str]) -> list[list[tuple[str, float]]]:
    from magretrieve.serving.retriever import Retriever

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
        except Exception as exc:  # any failure to open is the finding
            result.problems.append(f"store does not open after a kill: {exc}")
            return result
    report = run_child(export, spec, corpus, batch, every)
    if report["count"] != len(corpus_ids):
        result.problems.append(f"resume reported count {report['count']}")
    result.problems += compare(export, spec, corpus_ids, ref)
    return result


def tiny_export(cache: Path) -> Path:
    """The tiny random BERT (``tests/support/tiny_models.py``), exported (TorchScript) once into ``cache``."""
    from magretrieve.core.manifest import Manifest
    from magretrieve.export import export_model

    out = cache / "export-qnorm"
    try:
        Manifest.load(out)
        return out
    except Exception:  # absent, or written by an older magretrieve: rebuild
        pass
    model = cache / "tiny-bert"
    if not (model / "model.safetensors").is_file():
        tiny_models().build_tiny_bert(model)
    export_model(model, out, mode="qnorm", exporter="torchscript", overwrite=True)
    return out


def run_index(args: SimpleNamespace, export: Path, work: Path, rng: random.Random) -> tuple:
    corpus = work / "corpus.jsonl"
    corpus_ids = write_corpus(corpus, args.docs)
    results: list[RunResult] = []
    refs: dict[str, Reference] = {}
    backends = args.backends.split(",")
    for backend in backends:
        ref = reference_run(
            export, backend, work / f"ref-{backend}", corpus, args.batch_size,
            args.checkpoint_every,
        )  # fmt: skip
        refs[backend] = ref
        print(f"{backend}: uninterrupted indexing of {args.docs} docs: {ref.seconds:.2f} s")
        n_runs = args.runs if backend == backends[0] else args.other_runs
        for run in range(n_runs):
            folder = work / f"{backend}-{run}"
            res = crash_run(
                export, backend, folder, corpus, corpus_ids, ref, rng, kills=args.kills,
                batch=args.batch_size, every=args.checkpoint_every, run=run,
            )  # fmt: skip
            results.append(res)
            shutil.rmtree(folder, ignore_errors=True)
            print(
                f"index {backend} run {run:2d}: kills at {res.delays} s "
                f"(killed mid-run: {res.killed}), stored after kills {res.count_after_kills}"
                f" -> {'ok' if res.ok else 'FAIL ' + '; '.join(res.problems)}"
            )
    return results, refs


def _say(r: ops.OpRun) -> None:
    verdict = "ok" if r.ok else "FAIL " + "; ".join(r.problems)
    print(
        f"{r.operation} {r.kind} run {r.run:2d}: kill at {r.delay} s (mid-run: {r.killed}) "
        f"-> {r.state or '?'}{' (resumed)' if r.resumed else ''}: {verdict}"
    )


def run_ops(
    args: SimpleNamespace, cache: Path, work: Path, rng: random.Random
) -> tuple[list[ops.OpRun], dict[str, float]]:
    wanted = args.ops.split(",")
    results: list[ops.OpRun] = []
    seconds: dict[str, float] = {}
    export_setup = None
    if "export" in wanted or "fit-prior" in wanted:
        export_setup = ops.setup_export(cache, work)
        seconds["export --overwrite"] = export_setup.seconds
    if "export" in wanted:
        for run in range(args.op_runs):
            results.append(ops.export_run(export_setup, work, rng, run))
            _say(results[-1])
    if "rescale" in wanted:
        kinds = tuple(args.rescale_kinds.split(","))
        setup = ops.setup_rescale(work, kinds, args.rescale_docs)
        for kind in kinds:
            seconds[f"rescale {kind}"] = setup.seconds[kind]
            for run in range(args.op_runs):
                results.append(ops.rescale_run(setup, kind, work, rng, run))
                _say(results[-1])
    if "fit-prior" in wanted:
        assert export_setup is not None
        prior_setup = ops.setup_fit_prior(export_setup.reference, work)
        seconds["fit-prior"] = prior_setup.seconds
        for run in range(args.op_runs):
            results.append(ops.fit_prior_run(prior_setup, work, rng, run))
            _say(results[-1])
    annotating = [op for op in ("annotate", "re-annotate") if op in wanted]
    if annotating:
        backends = tuple(args.annotate_backends.split(","))
        setup = ops.setup_annotate(work, backends, args.annotate_docs)
        try:
            seconds.update(setup.seconds)
            for op in annotating:
                for backend in backends:
                    for run in range(args.op_runs):
                        results.append(ops.annotate_run(setup, op, backend, rng, run))
                        _say(results[-1])
        finally:
            if setup.pg is not None:
                setup.pg.stop()
    return results, seconds


@click.command(help=__doc__.splitlines()[0])
@click.option(
    "--ops",
    default=",".join(OPS),
    show_default=True,
    help=f"which operations to kill (comma list of {', '.join(OPS)})",
)
@click.option(
    "--runs", type=int, default=20, show_default=True, help="index runs on the first backend"
)
@click.option(
    "--other-runs", type=int, default=8, show_default=True, help="index runs on each further"
)
@click.option("--kills", type=int, default=2, show_default=True, help="SIGKILLs per index run")
@click.option("--docs", type=int, default=600, show_default=True)
@click.option("--batch-size", type=int, default=8, show_default=True)
@click.option("--checkpoint-every", type=int, default=16, show_default=True)
@click.option(
    "--backends", default="faiss", show_default=True, help="comma list: faiss,memory,qdrant-edge"
)
@click.option(
    "--op-runs", type=int, default=20, show_default=True, help="kills per operation and store"
)
@click.option("--rescale-kinds", default=",".join(ops.RESCALE_KINDS), show_default=True)
@click.option("--rescale-docs", type=int, default=3000, show_default=True)
@click.option("--annotate-backends", default=",".join(ops.ANNOTATE_BACKENDS), show_default=True)
@click.option("--annotate-docs", type=int, default=1000, show_default=True)
@click.option(
    "--merge",
    is_flag=True,
    help="keep the rows of the results file that this run does not redo (each section "
    "names the command that produced it)",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--cache", type=click.Path(path_type=Path), default=None, help="default: _common.cache_dir()"
)
@click.option("--out", type=click.Path(path_type=Path), default=RESULTS, show_default=True)
@lock_option
def main(**options: Any) -> None:
    args = SimpleNamespace(**options)
    unknown = sorted(set(args.ops.split(",")) - set(OPS))
    if unknown:
        raise click.BadParameter(
            f"unknown operation(s) {unknown}; choose from {', '.join(OPS)}", param_hint="--ops"
        )

    cache = args.cache or cache_dir("crash_safety")
    cache.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="crash-safety-"))
    started = time.perf_counter()
    index_results: list[RunResult] = []
    refs: dict[str, Reference] = {}
    op_results: list[ops.OpRun] = []
    seconds: dict[str, float] = {}
    try:
        with cpu_lock(args.lock):
            if "index" in args.ops.split(","):
                export = tiny_export(cache)
                index_results, refs = run_index(args, export, work, rng)
            op_results, seconds = run_ops(args, cache, work, rng)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    elapsed = time.perf_counter() - started
    write_report(args, index_results, refs, op_results, seconds, elapsed)
    failures = sum(not r.ok for r in index_results) + sum(not r.ok for r in op_results)
    print(f"failures {failures}; wrote {args.out} and {args.out.with_suffix('.json')}")
    click.get_current_context().exit(1 if failures else 0)


def write_report(
    args: SimpleNamespace,
    results: list[RunResult],
    refs: dict,
    op_results: list[ops.OpRun],
    seconds: dict[str, float],
    elapsed: float,
) -> None:
    command = recorded_command()
    stamp = f"{elapsed:.0f} s wall clock, {machine_summary()}"
    earlier = args.out.read_text() if args.merge and args.out.is_file() else ""
    if earlier:  # keep the earlier run's rows; this run's come after, under its own command
        if "# Later run" not in earlier:  # say which rows the first command produced
            head, sep, rest = earlier.partition("\n\n## ")
            earlier = head + " — the rows up to the first “Later run” come from it." + sep + rest
        lines = [earlier.rstrip(), "", f"# Later run: {', '.join(args.ops.split(','))}", ""]
        lines += [f"Command: `{command}` ({stamp}); the rows below come from it.", ""]
    else:
        lines = [TITLE, "", f"Command: `{command}` ({stamp})", ""]
    if refs:
        lines += [
            "## Indexing, then resume",
            "",
            f"- corpus: {args.docs} synthetic documents (distinct texts), tiny random BERT export "
            "(hidden 32, qnorm, ONNX, 1 thread)",
            f"- `index_corpus(batch_size={args.batch_size}, checkpoint_every="
            f"{args.checkpoint_every})` in a child process, SIGKILLed at a uniformly random "
            f"moment of its indexing ({args.kills} kills per run: the resumed run is killed "
            "again), then resumed to the end",
            "- pass = the store opens after every kill; final count = corpus; every id once; "
            "vectors/payloads and top-10 hits of 20 queries equal an uninterrupted run",
            "",
        ]
        rows = []
        for backend, ref in refs.items():
            rs = [r for r in results if r.backend == backend]
            counts = [c for r in rs for c in r.count_after_kills]
            rows.append(
                [
                    backend,
                    len(rs),
                    sum(len(r.killed) for r in rs),
                    sum(sum(r.killed) for r in rs),
                    f"{min(counts, default=0)}–{max(counts, default=0)}",
                    f"{ref.seconds:.2f}",
                    sum(not r.ok for r in rs),
                ]
            )
        lines.append(
            markdown_table(
                [
                    "backend",
                    "runs",
                    "SIGKILLs",
                    "killed mid-indexing",
                    "docs stored at kills (min–max)",
                    "uninterrupted indexing s",
                    "failures",
                ],
                rows,
            )
        )
        lines.append("")
    if op_results:
        done = {r.operation for r in op_results}
        lines += [
            "## " + ", ".join(sorted(done)),
            "",
            "- each run: the `magretrieve` command in a child process, SIGKILLed after a "
            "uniformly random delay in [0, 1.1 × its uninterrupted duration]; then the target is "
            "classified and the same command is run again to completion (export: after an "
            "incomplete state and every fourth kill; otherwise its clean-up step, in-process)",
        ]
        if done - {"annotate", "re-annotate"}:
            lines += [
                "- old = exactly the state before (export: byte-identical files; rescale: no "
                "target or an empty one; prior: the old bytes); new = exactly an uninterrupted "
                "run's result (export: same vectors on fixed texts; rescale: every id with the "
                "reference vector, payload and recipe; prior: the reference bytes); incomplete = "
                "the target says so (rescale: metadata marked `incomplete`, which every Retriever "
                "refuses) and the re-run finished it",
                f"- export: tiny random BERT, qnorm → cosine, TorchScript exporter; rescale: "
                f"{args.rescale_docs} unit vectors (dim 32) from a FAISS store, hub prior β 0.1, "
                "k 5; fit-prior: the cosine export on the tiny BEIR set",
            ]
        if done & {"annotate", "re-annotate"}:
            lines += [
                f"- annotate / re-annotate: {args.annotate_docs} unit vectors (dim 32, stored ×2) "
                "in an existing Cosine Qdrant collection (embedded, `qdrant-local`) and a pgvector "
                "table (HNSW `vector_cosine_ops`, pgserver) as another pipeline writes them; the "
                f"killed command is `annotate --corpus-prior {ops.NEW_BETA} --k 5`, on the plain "
                f"store (annotate) or on one annotated with β {ops.OLD_BETA} (re-annotate)",
                "- old / new = the annotation record and every point's m(d) equal the state "
                "before / an uninterrupted run's; incomplete = marked `incomplete`, the Retriever "
                "refuses it and the store's own search ranks by plain cosine (m = 1, scores = "
                "cosines, checked on 3 queries), and the re-run finished it",
            ]
        lines += [
            "- failure = any other state (serves but is neither old nor new, torn file, does not "
            "open), or a re-run that does not reach the new state",
            "",
        ]
        rows = [
            [
                r["operation"],
                r["target"],
                r["runs"],
                r["killed_mid_operation"],
                r["old"],
                r["new"],
                f"{r['incomplete']} / {r['incomplete_resumed']}",
                r["leftover_temp"],
                f"{seconds.get(r['operation'] + ' ' + r['target'], seconds.get(r['operation'], float('nan'))):.1f}",
                r["failures"],
            ]
            for r in ops.summarize(op_results)
        ]
        lines.append(
            markdown_table(
                [
                    "operation",
                    "target",
                    "runs",
                    "killed mid-run",
                    "old",
                    "new",
                    "incomplete / resumed",
                    "runs leaving temp files",
                    "uninterrupted s",
                    "failures",
                ],
                rows,
            )
        )
        lines.append("")
    bad = [f"- index {r.backend} run {r.run}: {'; '.join(r.problems)}" for r in results if not r.ok]
    bad += [
        f"- {r.operation} {r.kind} run {r.run}: {'; '.join(r.problems)}"
        for r in op_results
        if not r.ok
    ]
    lines += ["Failures: none." if not bad else "Failures:", *bad]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    payload: dict[str, Any] = {
        "command": command,
        "seconds": elapsed,
        "index": [r.__dict__ for r in results],
        "operations": ops.summarize(op_results),
        "runs": [r.__dict__ for r in op_results],
        "uninterrupted_seconds": seconds,
    }
    json_file = args.out.with_suffix(".json")
    if earlier and json_file.is_file():  # the earlier run stays as it was; this one is added
        previous = json.loads(json_file.read_text())
        previous.setdefault("later_runs", []).append(payload)
        payload = previous
    json_file.write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
    main()
