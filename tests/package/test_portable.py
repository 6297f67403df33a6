"""What is committed works on any machine: no machine's absolute paths, printed commands that parse.

Every command printed in README.md, docs/ and benchmarks/results must run as printed from the
repository root of a fresh clone with ``../shared`` beside it. Two checks hold that up:
no tracked file names a path of a particular machine, and every printed ``magretrieve`` or
``python benchmarks/...`` command names a command and options that exist (checked with ``--help``).
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
#: Absolute paths that belong to one machine (home folders, this workplace's folders, venvs).
#: Written as alternations so that this file holds none of the paths it looks for.
MACHINE_PATH = re.compile(
    r"(?<![\w.])(/(?:work|root)/|/(?:home|Users|opt|mnt|srv)/\w|/(?:var/folders|private/var)/"
    r"|[A-Z]:\\\\Users\\\\|/tmp/(?:magretrieve)|site-(?:packages)/)"
)


def _cli_commands() -> frozenset[str]:
    from magretrieve.cli import main

    return frozenset(main.commands)


#: ``magretrieve WORD`` in prose ("magretrieve model metadata") is not a command.
CLI_COMMANDS = _cli_commands()


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, check=True
        ).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: tracked files cannot be listed")
    return [REPO / name for name in out if name]


def test_no_tracked_file_holds_a_machine_path() -> None:
    offenders = []
    for file in tracked_files():
        if not file.is_file() or file.suffix in {".png", ".onnx", ".npz", ".npy"}:
            continue
        try:
            text = file.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if MACHINE_PATH.search(line):
                offenders.append(f"{file.relative_to(REPO)}:{number}: {line.strip()[:120]}")
    assert not offenders, "\n".join(offenders)


def quickstart_hint_commands() -> list[str]:
    """The ``magretrieve`` commands examples/quickstart.py prints at its end (how to serve the
    best store), for each kind of ending: a prior's store best, plain cosine best (then the
    prior's store is offered too), a magnitude mode's store alone."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "quickstart_example", REPO / "examples" / "quickstart.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = example  # dataclasses look their module up there
    spec.loader.exec_module(example)
    store = example.StoreResult
    endings = [
        [store("cosine", "faiss:out/index", 0.1, None), store("prior", "faiss:out/p", 0.2, "m(d)")],
        [
            store("cosine", "qdrant-edge:out/index", 0.2, None),
            store("p", "qdrant-edge:out/p", 0.1, "m(d)"),
        ],
        [store("qnorm", "qdrant-local:out/index/scifact", 0.2, "‖d‖")],
    ]
    lines = [line for stores in endings for line in example.serve_hint("out/exported", stores)]
    return [line.strip() for line in lines if line.strip().startswith("magretrieve ")]


def printed_commands() -> list[tuple[str, str]]:
    """(where, command) for every magretrieve / benchmark command in the docs people read,
    and in the quickstart's closing hint."""
    sources = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    sources += sorted((REPO / "benchmarks" / "results").glob("*.md"))
    found = []
    for source in sources:
        text = source.read_text()
        blocks = re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, re.S)
        blocks += re.findall(r"`((?:python benchmarks/|magretrieve )[^`]+)`", text)
        for block in blocks:
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = line.split(" #")[0].strip()
                line = re.sub(r"^(flock \S+ )?(nice -n \d+ )?", "", line)
                if "…" in line or "..." in line:  # an elided command, not one to run
                    continue
                words = line.split()
                if (len(words) > 1 and words[0] == "magretrieve" and words[1] in CLI_COMMANDS) or (
                    re.match(r"python benchmarks/\w+\.py( |$)", line)
                ):
                    found.append((source.relative_to(REPO).as_posix(), line))
    found += [("examples/quickstart.py", line) for line in quickstart_hint_commands()]
    return found


@functools.cache
def help_text(program: tuple[str, ...]) -> str:
    # run from outside the checkout: the installed package is what answers
    proc = subprocess.run([*program, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(program)} --help failed: {proc.stderr[-500:]}"
    return proc.stdout


COMMANDS = printed_commands()


def test_the_docs_print_commands() -> None:
    assert len(COMMANDS) >= 15
    assert any(c.startswith("python benchmarks/") for _, c in COMMANDS)


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[f"{w}:{c[:50]}" for w, c in COMMANDS])
def test_printed_command_names_options_that_exist(where: str, command: str) -> None:
    words = shlex.split(command.replace("[", "").replace("]", ""))
    rest = 2  # the words after the program and its command
    if words[0] == "magretrieve":
        sub = words[1]
        program = (sys.executable, "-c", "from magretrieve.cli import main; main()", sub)
    else:
        script = REPO / words[1]
        assert script.is_file(), f"{where}: {words[1]} does not exist"
        program = (sys.executable, str(script))
        if script.name == "study.py" and len(words) > 2 and not words[2].startswith("-"):
            # `python benchmarks/study.py NAME ...`: the options of that study
            program, rest = (*program, words[2]), 3
    text = help_text(program)
    for word in words[rest:]:
        if word.startswith("--"):
            flag = word.split("=")[0]
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text), (
                f"{where}: `{command}` uses {flag}, which {' '.join(words[:2])} does not accept"
            )
