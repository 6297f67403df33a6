"""The checks of ``.pre-commit-config.yaml``'s file hooks, for CI, which runs no pre-commit.

Every tracked text file has no trailing whitespace and ends in exactly one newline
(pre-commit-hooks' ``trailing-whitespace`` and ``end-of-file-fixer``), and no tracked file is
larger than the ``check-added-large-files`` limit. Binary files (a NUL byte) are left out of
the text checks, as the hooks leave them out.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The --maxkb of check-added-large-files in .pre-commit-config.yaml.
MAX_KB = 500
#: The config's top-level ``exclude``: Swagger UI's files, vendored unmodified (/docs offline).
VENDORED = "magretrieve/server/static/swagger/"


def tracked_files() -> list[Path]:
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout
    names = [name for name in out.decode().split("\0") if name]
    return [ROOT / name for name in names if not name.startswith(VENDORED)]


def text_problems(data: bytes) -> list[str]:
    """What the two text hooks would change in ``data`` (empty when nothing)."""
    if b"\0" in data or not data:
        return []
    problems = []
    for match in re.finditer(rb"[ \t]+\r?$", data, re.MULTILINE):
        line = data.count(b"\n", 0, match.start()) + 1
        problems.append(f"line {line}: trailing whitespace")
    if not data.endswith(b"\n"):
        problems.append("no newline at the end")
    elif data.endswith(b"\n\n") or data.strip() == b"":
        problems.append("blank lines at the end")
    return problems


def test_the_vendored_exclusion_is_the_configs() -> None:
    config = (ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8")
    assert f"exclude: ^{VENDORED}" in config
    assert (ROOT / VENDORED / "LICENSE").is_file()  # vendored with its licence


def test_text_problems_finds_what_the_hooks_fix() -> None:
    assert text_problems(b"a\nb\n") == []
    assert text_problems(b"a \nb\t\n") == [
        "line 1: trailing whitespace",
        "line 2: trailing whitespace",
    ]
    assert text_problems(b"a\nb") == ["no newline at the end"]
    assert text_problems(b"a\n\n") == ["blank lines at the end"]
    assert text_problems(b"\x89PNG\0 \n") == []  # binary: not a text file


def test_tracked_text_files_are_clean() -> None:
    bad = {
        str(path.relative_to(ROOT)): problems
        for path in tracked_files()
        if path.is_file() and (problems := text_problems(path.read_bytes()))
    }
    assert not bad, "\n".join(f"{name}: {', '.join(p[:3])}" for name, p in bad.items())


def test_no_tracked_file_is_large() -> None:
    large = {
        str(path.relative_to(ROOT)): path.stat().st_size // 1024
        for path in tracked_files()
        if path.is_file() and path.stat().st_size > MAX_KB * 1024
    }
    assert not large, f"files over {MAX_KB} kB: {large}"
