"""What every benchmark shares: where data and caches live, the CPU lock, tables, the command.

Benchmarks are scripts run from the repository root (``python benchmarks/NAME.py ...``); the
script's folder is on ``sys.path`` by Python's own rule, so ``from _common import ...`` needs no
path edits. Nothing here holds a path of a particular machine:

- data: ``$MAGRETRIEVE_DATA`` or ``../shared/data`` beside the repository;
- caches: ``$MAGRETRIEVE_CACHE`` or ``.cache/`` inside the repository (git-ignored);
- the CPU lock: ``$MAGRETRIEVE_CPU_LOCK`` or ``.cache/cpu.lock`` (heavy jobs on a 2-core machine
  run one at a time: two torch jobs side by side each run ~10x slower).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shlex
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def tiny_models() -> ModuleType:
    """The test suite's tiny random BERT and BEIR builders (``tests/support/tiny_models.py``),
    loaded from their file: the smoke runs and crash runs use the very model the tests use, and
    neither the wheel nor the import path carries test code."""
    spec = importlib.util.spec_from_file_location(
        "_tiny_models", REPO / "tests" / "support" / "tiny_models.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def data_dir() -> Path:
    """The BEIR data sets: ``$MAGRETRIEVE_DATA`` or ``../shared/data`` beside the repository."""
    env = os.environ.get("MAGRETRIEVE_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def cache_dir(name: str = "") -> Path:
    """A cache folder for one benchmark (created): ``$MAGRETRIEVE_CACHE/name`` or ``.cache/name``."""
    env = os.environ.get("MAGRETRIEVE_CACHE")
    root = Path(env) if env else REPO / ".cache"
    folder = root / name if name else root
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def default_lock() -> Path:
    """The CPU lock file shared by every heavy job of this checkout (or ``$MAGRETRIEVE_CPU_LOCK``)."""
    env = os.environ.get("MAGRETRIEVE_CPU_LOCK")
    return Path(env) if env else cache_dir() / "cpu.lock"


@contextlib.contextmanager
def cpu_lock(path: str | os.PathLike[str] | None = "default") -> Iterator[None]:
    """Hold an exclusive flock so heavy jobs serialize; ``None``/``""`` disables it."""
    if not path:
        yield
        return
    lock = default_lock() if path == "default" else Path(path)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def portable_path(value: str | os.PathLike[str]) -> str:
    """A path as a fresh clone can use it: relative to the repository where it lies inside it or
    beside it (``../shared/...``); anything else is returned unchanged (a relative path stays)."""
    text = os.fspath(value)
    if not os.path.isabs(text):
        return text
    path = Path(text).resolve()
    for base, prefix in ((REPO, ""), (REPO.parent, "..")):
        try:
            rel = path.relative_to(base)
        except ValueError:
            continue
        return str(Path(prefix) / rel) if prefix else (str(rel) or ".")
    return text


def _portable_arg(arg: str) -> str:
    if "=" in arg and arg.startswith("--"):
        key, _, value = arg.partition("=")
        return f"{key}={portable_path(value)}"
    return portable_path(arg)


def recorded_command(argv: Sequence[str] | None = None, prefix: str = "python") -> str:
    """The command that reproduces this run from the repository root of a fresh clone.

    The script becomes ``benchmarks/NAME.py`` and every absolute path argument inside or beside
    the repository becomes relative; the result is shell-quoted so it runs as printed.
    """
    argv = list(sys.argv if argv is None else argv)
    if not argv:
        return prefix
    script, args = argv[0], argv[1:]
    script = portable_path(os.path.abspath(script)) if script.endswith(".py") else script
    return shlex.join([*prefix.split(), script, *(_portable_arg(a) for a in args)])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table (cells converted with ``str``)."""
    lines = ["| " + " | ".join(map(str, headers)) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def machine_summary() -> str:
    """One line naming the machine a timing was taken on (cores, CPU model), no hostnames."""
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{os.cpu_count()} cores{', ' + model if model else ''}"


def rotated(keys: list[str], round_no: int) -> list[str]:
    """``keys`` started at position ``round_no``: the column order of a round, so that columns
    interleave in time across rounds and noise from the machine hits all of them alike."""
    k = round_no % len(keys)
    return keys[k:] + keys[:k]


def encoder_benchmark_options(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The click options every encoder benchmark shares (a decorator for its ``main``).

    ``--data``, ``--out`` and ``--lock`` are what :func:`run_and_write` reads; ``--model``,
    ``--split``, ``--mode`` and ``--threads`` are what every encoder run needs. Each benchmark
    adds its own (rounds, documents, ...).
    """
    import click

    options = [
        click.option("--model", default="all-MiniLM-L6-v2", help="ST folder or alias"),
        click.option("--data", default=None, help="BEIR folder (default: data_dir()/scifact)"),
        click.option("--split", default="test"),
        click.option("--mode", default="qnorm"),
        click.option("--threads", type=int, default=2, help="threads of every column"),
        click.option("--out", default=None, help=f"results stem (default results/{name})"),
        click.option("--lock", default="default", help="CPU lock file ('' for none)"),
    ]

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):  # --help lists them in the order above
            func = option(func)
        return func

    return decorate


def spread_sample(corpus: dict[str, Any], n: int) -> list[str]:
    """The full text of ``n`` documents spread evenly over ``corpus`` in its order (all of
    them if it holds fewer): a sample that sees the corpus's range, not its first part."""
    ids = list(corpus)
    picks = np.unique(np.linspace(0, len(ids) - 1, min(n, len(ids))).astype(int))
    return [corpus[ids[i]].full_text for i in picks]


def encoder_run_header(args: Any, data: Path) -> dict[str, Any]:
    """The keys every encoder benchmark's result starts with: how to re-run it, where it ran,
    and the options that shape every column (``args`` holds the options of
    :func:`encoder_benchmark_options`, plus ``rounds``)."""
    return {
        "command": recorded_command(),
        "machine": machine_summary(),
        "threads": args.threads,
        "rounds": args.rounds,
        "model": args.model,
        "mode": args.mode,
        "data": f"{data.name}:{args.split}",
    }


def encoder_versions() -> dict[str, str]:
    """Versions of the libraries the encoder benchmarks time against each other."""
    import onnxruntime
    import openvino
    import sentence_transformers
    import torch

    return {
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "openvino": openvino.__version__,
        "sentence-transformers": sentence_transformers.__version__,
    }


def run_and_write(
    args: Any,
    name: str,
    run: Callable[[Any, Path], dict[str, Any]],
    write_results: Callable[[dict[str, Any], Path], None],
) -> dict[str, Any]:
    """The tail of an encoder benchmark's ``main``: resolve ``--data`` (default
    ``data_dir()/scifact``) and ``--out`` (default ``results/NAME``), run under the CPU lock
    (``--lock``), write the results and return them."""
    data = Path(args.data) if args.data else data_dir() / "scifact"
    out = Path(args.out) if args.out else REPO / "benchmarks" / "results" / name
    with cpu_lock(args.lock or None):
        result = run(args, data)
    write_results(result, out)
    return result


def lock_option(func: Any) -> Any:
    """The ``--lock`` option every heavy benchmark takes (click), defaulting to :func:`cpu_lock`'s."""
    import click

    return click.option(
        "--lock",
        default="default",
        show_default=True,
        help="flock this file around each heavy run ('default': $MAGRETRIEVE_CPU_LOCK or "
        ".cache/cpu.lock; '' for none).",
    )(func)
