"""The package's layering, read from the source with ``ast`` and held to docs/architecture.md.

* torch and transformers are imported only under train/, export/ and diagnose/;
* every ``magretrieve.<layer>`` import follows the doc's "may import" table (lazy edges only
  inside a function body, and only those the doc lists);
* CLI commands import no other command, and ``magretrieve index`` names no engine;
* no two modules of ``stores/`` import each other, directly or around a circle (lazy
  imports inside a function count too: what they share goes into a small module of its own);
* no test module imports another test module: what tests share lives in ``tests/support/``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "magretrieve"
DOC = ROOT / "docs" / "architecture.md"
TESTS = ROOT / "tests"
TORCH_LAYERS = ("train", "export", "diagnose")
TORCH_MODULES = ("torch", "transformers", "sentence_transformers")


def _table(header: str) -> list[list[str]]:
    """Rows of the markdown table of DOC whose header row starts with ``| header``."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"\|\s*{header}\s*\|", line))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def allowed_imports() -> dict[str, set[str] | None]:
    """layer → layers it may import (None: every layer)."""
    out: dict[str, set[str] | None] = {}
    for layer, may in _table("layer"):
        if may == "every layer":
            out[layer] = None
        else:
            out[layer] = {x.strip() for x in may.split(",")} - {"(nothing)", ""}
    return out


def lazy_edges() -> set[tuple[str, str]]:
    return {(row[0], row[1]) for row in _table("from")}


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def layer_of(path: Path) -> str | None:
    """The layer folder of a module; None for the package's own __init__/__main__."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def imports(path: Path) -> list[tuple[str, int, bool]]:
    """(absolute module name, line, inside a function) of every import statement in ``path``."""
    package = ".".join(("magretrieve", *path.relative_to(PACKAGE).parts[:-1]))
    return read_imports(path.read_text(), package, str(path))


def read_imports(source: str, package: str, filename: str) -> list[tuple[str, int, bool]]:
    """The imports of ``source``, a module of ``package``; relative imports made absolute."""
    tree = ast.parse(source, filename=filename)
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(
                child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
            )
            if isinstance(child, ast.Import):
                found.extend((alias.name, child.lineno, in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                name = from_module(child, package)
                if name == "magretrieve":  # `from magretrieve import core` names the layer
                    found.extend(
                        (f"magretrieve.{a.name}", child.lineno, in_function) for a in child.names
                    )
                else:
                    found.append((name, child.lineno, in_function))
            visit(child, nested)

    visit(tree, False)
    return found


def from_module(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a ``from ... import`` statement of ``package`` reads."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def test_the_doc_has_a_row_for_every_layer_folder() -> None:
    table = allowed_imports()
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    missing = sorted(folders - set(table))
    assert not missing, f"docs/architecture.md has no 'may import' row for {missing}"
    for layer, may in table.items():
        assert may is None or may <= set(table), f"{layer} may import an unknown layer: {may}"
    assert table["core"] == set()  # core imports nothing above it
    assert lazy_edges() and all(a in table and b in table for a, b in lazy_edges())


def test_torch_and_transformers_only_under_train_export_diagnose() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: import {name}"
        for path in modules()
        if layer_of(path) not in TORCH_LAYERS
        for name, line, _ in imports(path)
        if name.split(".")[0] in TORCH_MODULES
    ]
    assert not bad, "torch/transformers imported outside train/, export/, diagnose/:\n" + "\n".join(
        bad
    )


def test_every_import_follows_the_layer_table() -> None:
    table, lazy = allowed_imports(), lazy_edges()
    bad = []
    for path in modules():
        layer = layer_of(path)
        if layer is None or table.get(layer) is None:
            continue  # the package root and cli may import every layer
        allowed = table[layer]
        assert allowed is not None
        for name, line, in_function in imports(path):
            parts = name.split(".")
            if parts[0] != "magretrieve" or len(parts) < 2 or parts[1] == layer:
                continue
            target = parts[1]
            if target in allowed or (in_function and (layer, target) in lazy):
                continue
            where = "inside a function" if in_function else "at module level"
            bad.append(f"{path.relative_to(ROOT)}:{line}: {layer} imports {name} ({where})")
    assert not bad, "imports against docs/architecture.md:\n" + "\n".join(bad)


def test_serving_side_never_reaches_the_torch_side() -> None:
    """The rule stated on its own: no path from serving/stores/priors/core to torch layers."""
    table = allowed_imports()
    for layer in ("core", "data", "evaluation", "stores", "serving", "priors", "engines"):
        may = table[layer]
        assert may is not None and not may & set(TORCH_LAYERS), layer
    assert "serving" not in (table["stores"] or set())


def module_edges(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside a function; ``from pkg import
    name`` counts as an import of ``pkg.name`` when that is a module of the package."""
    package = ".".join(("magretrieve", *path.relative_to(PACKAGE).parts[:-1]))
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, package)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if module_file(sub) is not None else base)
    return out


def module_file(name: str) -> Path | None:
    """The source file of a ``magretrieve.*`` module (a package's ``__init__.py``), or None."""
    parts = name.split(".")
    if parts[0] != "magretrieve":
        return None
    folder = PACKAGE.joinpath(*parts[1:])
    for candidate in (folder.with_suffix(".py"), folder / "__init__.py"):
        if len(parts) > 1 and candidate.is_file():
            return candidate
    return None


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (module → modules it imports) as a path that ends where
    it starts, or None when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_no_import_circle_inside_stores() -> None:
    """pgvector_store dispatches to pgvector_cosine_store, qdrant_store to qdrant_cosine_store;
    the way back (or any other circle) would make each module half-initialized when the other
    is imported first. Shared helpers live in their own modules (``_pgvector_sql``, ...)."""
    stores = PACKAGE / "stores"
    graph: dict[str, set[str]] = {}
    for path in sorted(stores.glob("*.py")):
        name = "magretrieve.stores" + ("" if path.stem == "__init__" else f".{path.stem}")
        graph[name] = {
            m for m in module_edges(path) if m.startswith("magretrieve.stores.") and m != name
        }
    assert "magretrieve.stores.pgvector_cosine_store" in graph["magretrieve.stores.pgvector_store"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle inside stores/: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": {"b"}}, ["b", "c", "b"]),
    ],
)
def test_the_cycle_finder_itself(graph: dict[str, set[str]], expected: list[str] | None) -> None:
    assert find_cycle(graph) == expected


def test_the_module_edge_reader_names_submodules() -> None:
    """``from magretrieve.stores import registry`` (inside a function too) is an edge to the
    registry module, not to the package: otherwise a lazy dispatch edge would go unseen."""
    edges = module_edges(PACKAGE / "stores" / "pgvector_store.py")
    assert {"magretrieve.stores.registry", "magretrieve.stores._pgvector_sql"} <= edges
    assert "magretrieve.stores.pgvector_cosine_store" in edges  # imported inside store_for


def test_cli_commands_do_not_import_each_other() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in sorted((PACKAGE / "cli").glob("*.py"))
        for name, line, _ in imports(path)
        if name.startswith("magretrieve.cli.cmd_")
    ]
    assert not bad, "shared CLI code belongs in magretrieve/cli/_common.py:\n" + "\n".join(bad)


def test_index_command_names_no_engine() -> None:
    from magretrieve.engines import ENGINES

    source = (PACKAGE / "cli" / "cmd_index.py").read_text().lower()
    named = [name for name in ENGINES if name != "local" and re.search(rf"\b{name}\b", source)]
    assert not named, f"cmd_index.py names engines {named}; declare their options in engines/"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch\n", [("torch", 1, False)]),
        ("def f():\n    from transformers import AutoModel\n", [("transformers", 2, True)]),
        ("from . import base\n", [("magretrieve.stores", 1, False)]),
        ("from ..core.errors import X\n", [("magretrieve.core.errors", 1, False)]),
        ("from magretrieve import serving\n", [("magretrieve.serving", 1, False)]),
    ],
)
def test_the_import_reader_itself(source: str, expected: list) -> None:
    """The checks above are only as good as this reader: nested and relative imports count."""
    assert read_imports(source, "magretrieve.stores", "probe.py") == expected


def imported_test_names(source: str, package: str, filename: str) -> list[tuple[str, int]]:
    """(name, line) of what a module of the ``tests`` package ``package`` imports from ``tests``
    outside ``tests.support`` (``from M import x`` reads as ``M.x``; relative made absolute)."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = from_module(node, package)
            names = [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.extend(
            (name, node.lineno)
            for name in names
            if name.startswith("tests.") and not name.startswith("tests.support.")
        )
    return found


def test_no_test_module_imports_another() -> None:
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        package = ".".join(path.relative_to(ROOT).parts[:-1])
        bad += [
            f"{path.relative_to(ROOT)}:{line}: {name}"
            for name, line in imported_test_names(path.read_text(), package, str(path))
        ]
    assert not bad, "what tests share belongs in tests/support/:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from tests.support.server import KEY\n", []),
        ("from tests.support import server\n", []),
        ("import pytest\nfrom magretrieve.core import errors\n", []),
        ("from tests.server.test_serve import KEY\n", [("tests.server.test_serve.KEY", 1)]),
        ("def f():\n    from .test_serve import KEY\n", [("tests.server.test_serve.KEY", 2)]),
        ("import tests.core.test_manifest\n", [("tests.core.test_manifest", 1)]),
        ("from tests import conftest\n", [("tests.conftest", 1)]),
    ],
)
def test_the_test_import_reader_itself(source: str, expected: list) -> None:
    assert imported_test_names(source, "tests.server", "probe.py") == expected
