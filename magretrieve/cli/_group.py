"""The click group every ``magretrieve`` command hangs on, and its error policy."""

from __future__ import annotations

import logging
import re
from typing import Any

import click

from magretrieve import __version__
from magretrieve.cli._warnings import route_library_warnings
from magretrieve.core.errors import MagRetrieveError


def describe_os_error(exc: OSError) -> str:
    """``path: cause`` for an error the operating system raised (disk full, read-only, ...)."""
    cause = exc.strerror or str(exc) or type(exc).__name__
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    where = " -> ".join(paths)
    return f"{where}: {cause}" if where else cause


class CliCommand(click.Command):
    """A command whose unknown-option error points to the short option a usual long spelling
    means: ``--top-k``, ``--topk`` or ``--k`` for ``-k``. Click's own guess compares long
    options only, so it never offers ``-k`` (for ``--topk`` it offered ``--store``)."""

    def short_option_for(self, name: str) -> str | None:
        """The short option ``name`` (``--top-k``) most likely means, or None."""
        word = re.sub(r"[-_]", "", name.lstrip("-").lower())
        for param in self.params:
            for opt in (*param.opts, *param.secondary_opts):
                letter = opt[1:].lower()
                if len(opt) == 2 and opt[0] == "-" and word in (letter, f"top{letter}"):
                    return opt
        return None

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            short = self.short_option_for(exc.option_name)
            if short is None:
                raise
            message = f"No such option {exc.option_name!r}. Did you mean {short!r}?"
            raise click.NoSuchOption(exc.option_name, message, ctx=ctx) from None


class CliGroup(click.Group):
    """Turns user errors (:class:`MagRetrieveError`) into one line on stderr and exit code 1.

    So do errors of the operating system (:class:`OSError`: disk full, read-only folder,
    permission denied): they name the path and the cause, and every write path leaves what it
    was writing in its old state (temp files, staging folders, atomic renames). Other
    exceptions are bugs and keep their traceback.
    """

    command_class: Any = CliCommand

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            return super().invoke(ctx)
        except MagRetrieveError as exc:
            raise click.ClickException(str(exc)) from None
        except OSError as exc:
            raise click.ClickException(describe_os_error(exc)) from None


@click.group(cls=CliGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="magretrieve")
@click.option("-v", "--verbose", is_flag=True, help="Log debug details.")
def main(verbose: bool) -> None:
    """magretrieve: dense retrieval that keeps embedding magnitude."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    route_library_warnings()
