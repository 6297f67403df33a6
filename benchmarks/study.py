"""Run one finished study of benchmarks/studies/: ``python benchmarks/study.py NAME [OPTIONS]``.

The benchmarks at the top of ``benchmarks/`` are measured again as the code changes; a study
answered one question once (its results are in benchmarks/results/ and docs/) and is kept so
that its figures stay reproducible. ``python benchmarks/study.py --help`` lists the studies and
``python benchmarks/study.py NAME --help`` their options.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click

STUDIES = Path(__file__).resolve().parent / "studies"


def study_names() -> list[str]:
    """The studies: every public module of benchmarks/studies/."""
    return sorted(p.stem for p in STUDIES.glob("*.py") if not p.stem.startswith("_"))


class Studies(click.Group):
    """A group whose commands are the ``main`` of each study module, imported when named."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return study_names()

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in study_names():
            return None
        # benchmarks/ is this script's folder, so it is on sys.path: `studies` imports as a package
        return importlib.import_module(f"studies.{cmd_name}").main


@click.group(cls=Studies, help=__doc__.splitlines()[0].replace("``", ""))
def main() -> None:
    pass


if __name__ == "__main__":
    main()
