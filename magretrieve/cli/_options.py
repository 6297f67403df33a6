"""Declared options as click options: the one place the command line derives its flags.

Every option the library declares (:class:`magretrieve.core.options.Option`: the store
options of the registry, the server and engine settings, an indexing engine's options)
becomes a click option here, by :func:`click_option`, so a flag has the same spelling,
default and help on every command that offers it, and what it accepts is checked where it
is declared (one error line, the same from Python and from the command line).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click

from magretrieve.core.options import Option

F = TypeVar("F", bound=Callable[..., Any])


def click_option(declared: Option) -> Callable[[F], F]:
    """The click option of ``declared``: its flag, keyword, default and help.

    A ``bool`` option is a switch (``--x/--no-x``) or, with a single flag, sets the opposite
    of its default (``--no-batching``). Choices are a click choice; every other check is the
    declaration's own, run when the value reaches the library. The default is shown when
    there is one to show; an option declared without help text has none.
    """
    if declared.flag is None:
        raise ValueError(f"option {declared.name!r} has no command-line flag")
    kwargs: dict[str, Any] = {"default": declared.default, "help": declared.help or None}
    if declared.type is bool:
        if "/" not in declared.flag:
            kwargs["flag_value"] = not declared.default
    elif declared.choices is not None:
        kwargs["type"] = click.Choice(list(declared.choices))
    else:
        kwargs["type"] = declared.type
    if declared.default is not None and "flag_value" not in kwargs:
        kwargs["show_default"] = True
    return click.option(declared.flag, declared.name, **kwargs)


def click_options(declared: Iterable[Option]) -> Callable[[F], F]:
    """Every option of ``declared`` that has a flag, as click options in the given order."""
    flagged = cli_declared(declared)

    def decorate(command: F) -> F:
        for o in reversed(flagged):
            command = click_option(o)(command)
        return command

    return decorate


def cli_declared(declared: Iterable[Option]) -> list[Option]:
    """The options of ``declared`` the command line sets (those with a flag)."""
    return [o for o in declared if o.flag is not None]
