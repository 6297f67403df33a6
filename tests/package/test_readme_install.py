"""The README's install table lists every extra pyproject.toml declares, and no other.

The extras are read from the installed package's metadata (built from pyproject.toml). The
table's first column names extras in backticks (``faiss`` / ``qdrant``); the ``all`` row says
which extras ``all`` bundles, which must be what the package's ``all`` installs.
"""

from __future__ import annotations

import re
from importlib.metadata import metadata, requires
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]


def declared() -> dict[str, list[Requirement]]:
    """Extra -> its requirements, as the installed package declares them."""
    extras = metadata("magretrieve").get_all("Provides-Extra") or []
    reqs = [Requirement(line) for line in requires("magretrieve") or []]
    return {
        extra: [r for r in reqs if r.marker is not None and r.marker.evaluate({"extra": extra})]
        for extra in extras
    }


def install_table() -> dict[str, str]:
    """Extra -> the table's "what for" cell, for each row of the README's install table."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not line.startswith("|"):
            continue
        for name in re.findall(r"`([\w-]+)`", cells[0]):
            rows[name] = cells[1]
    return rows


def test_the_install_table_lists_every_declared_extra() -> None:
    table, extras = install_table(), declared()
    assert len(table) >= 10  # the table was found and read
    assert set(extras) - set(table) == set(), "extras missing from the README's install table"
    assert set(table) - set(extras) == set(), "the README's install table names unknown extras"


def test_the_all_row_names_what_all_installs() -> None:
    (bundle,) = declared()["all"]
    assert bundle.name == "magretrieve"
    inside = set(bundle.extras)
    listed = {word.strip() for word in install_table()["all"].split(",")}
    assert listed == inside
