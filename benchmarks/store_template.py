"""Lines each store backend writes beyond its I/O, measured on the source (AST), before/after.

A backend module is its I/O (the primitives the base class calls: ``_upsert``, ``_query``,
``_delete``, ``_fetch``, ``_scan_ids``, ... and the lifecycle and tuning hooks it fills in:
``_exists``, ``_create``, ``_open_existing``, ``_recall_knob``) plus everything else: opening,
option handling, tuning loops, persistence. The second part is what the store template should
own; this script counts it per backend module:

    lines beyond I/O = physical lines of ``stores/<backend>_store.py``
                       - lines of the I/O methods of its store classes (decorators included)

Counted at a git revision (``--base``, read with ``git show``) and in the working tree, so the
table says what a change moved into the shared template.

    python benchmarks/store_template.py --base main   # writes benchmarks/results/store_template.md
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
STORES = "magretrieve/stores"
BACKENDS = ("chroma", "faiss", "lancedb", "milvus", "pgvector", "qdrant", "scann")
#: What every backend shares (the template): counted whole, before and after.
SHARED = ("base.py", "options.py", "registry.py", "_generation.py", "_ann_recall.py")
#: The methods that are a backend's own I/O: the primitives of ``VectorStore`` and the hooks of
#: its lifecycle and tuning template.
IO_METHODS = frozenset(
    {
        "_upsert",
        "_query",
        "_query_exact",
        "_delete",
        "_fetch",
        "_existing",
        "_count",
        "_scan_ids",
        "_read_meta",
        "_write_meta",
        "_describe",
        "_driver_errors",
        "dimension",
        "location",
        "_exists",
        "_create",
        "_open_existing",
        "_recorded_build",
        "_recall_knob",
        "_stored_vectors",
        "_keep_recall",
    }
)


def count(source: str) -> tuple[int, int]:
    """(lines beyond I/O, I/O lines) of one module's source."""
    tree = ast.parse(source)
    io_lines: set[int] = set()
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if (
                isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
                and item.name in IO_METHODS
            ):
                first = min([d.lineno for d in item.decorator_list] + [item.lineno])
                io_lines.update(range(first, (item.end_lineno or item.lineno) + 1))
    total = len(source.splitlines())
    return total - len(io_lines), len(io_lines)


def read(rev: str | None, path: str) -> str:
    if rev is None:
        return (ROOT / path).read_text()
    return subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout


@click.command()
@click.option("--base", default="main", show_default=True, help="Revision counted as 'before'.")
@click.option(
    "--mid",
    default=None,
    help="A revision between the two (e.g. the last merged step), shown as one more column.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=ROOT / "benchmarks/results/store_template.md",
    show_default=True,
)
def main(base: str, mid: str | None, out: Path) -> None:
    rows = []
    totals = [0, 0, 0, 0, 0]
    for backend in BACKENDS:
        path = f"{STORES}/{backend}_store.py"
        before, before_io = count(read(base, path))
        after, after_io = count(read(None, path))
        between = count(read(mid, path))[0] if mid else 0
        shown = f" {between} |" if mid else ""
        rows.append(
            f"| {backend} | {before} |{shown} {after} | {after - before:+d} | {before_io} "
            f"| {after_io} |"
        )
        for n, v in enumerate((before, after, before_io, after_io, between)):
            totals[n] += v
    mid_head = f" beyond I/O at {mid} |" if mid else ""
    mid_total = f" {totals[4]} |" if mid else ""
    shared = []
    for name in SHARED:
        try:
            old = len(read(base, f"{STORES}/{name}").splitlines())
        except subprocess.CalledProcessError:  # a file the change added
            old = 0
        new = len(read(None, f"{STORES}/{name}").splitlines())
        shared.append(f"| {name} | {old} | {new} | {new - old:+d} |")
    text = "\n".join(
        [
            "# Store template: lines each backend writes beyond its I/O",
            "",
            "Written by `python benchmarks/store_template.py --base "
            f"{base}{f' --mid {mid}' if mid else ''}` (AST count; see the script's docstring "
            "for what counts as I/O).",
            "",
            "Counted by this script at both revisions (the issue that asked for the template "
            "quoted figures of another count; compare the columns here with each other).",
            "",
            f"| backend | beyond I/O before |{mid_head} beyond I/O after | change | I/O before "
            "| I/O after |",
            "| --- | ---: |" + (" ---: |" if mid else "") + " ---: | ---: | ---: | ---: |",
            *rows,
            f"| all | {totals[0]} |{mid_total} {totals[1]} | {totals[1] - totals[0]:+d} "
            f"| {totals[2]} | {totals[3]} |",
            "",
            "The shared template (whole files) that took the work over:",
            "",
            "| file | lines before | lines after | change |",
            "| --- | ---: | ---: | ---: |",
            *shared,
            "",
        ]
    )
    out.write_text(text)
    click.echo(text)


if __name__ == "__main__":
    main()
