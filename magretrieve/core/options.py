"""Options, declared once: one declared-option type and one dataclass-field helper.

Every knob a user can set — a store's index options (``hnsw_m``), a backend's own options
(``quantization``), the embedding engine's and the server's settings (``max_queue``), an
indexing engine's options (``workers``) — is an :class:`Option`: its keyword, type, help,
command-line flag, default, bounds, choices and environment variable, written once. A group
of options is a frozen dataclass whose fields are made by :func:`option` (the LanceDB
``index.py`` / qdrant-client ``HnswConfigDiff`` style) and which derives from
:class:`OptionClass`; everything else is derived from the declarations:

- the checks (:meth:`Option.check`: one error line naming the option, the same from Python
  and from the command line),
- the command-line flags (:mod:`magretrieve.cli._options` turns an :class:`Option` into a
  click option: the same flag, default and help wherever it appears),
- the environment fallback (:meth:`Option.from_env`).

This module imports nothing beyond the standard library and the project's error types, so
the layers below the command line (stores, serving, engines) declare their options here
without click.
"""

from __future__ import annotations

import builtins
import dataclasses
import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from magretrieve.core.errors import ConfigError

__all__ = ["OPTION", "Option", "OptionClass", "option"]

#: The key of a field's metadata that holds its :class:`Option`.
OPTION = "option"


@dataclass(frozen=True)
class Option:
    """One option: its keyword, type, help, flag, default, bounds, choices and env variable.

    - ``name``: the Python keyword (``open_store(hnsw_m=...)``, ``ServerSettings(max_queue=...)``);
      a field made by :func:`option` without one takes the field's name.
    - ``type``: ``int``, ``float``, ``str`` or ``bool``; a field made by :func:`option` takes
      it from its annotation, so it is written once.
    - ``flag``: the command-line flag (``--hnsw-m``); None keeps the option Python-only. A
      ``bool`` option's flag is a switch (``--onnx-spinning/--no-onnx-spinning``) or a single
      flag that sets the opposite of its default (``--no-batching``).
    - ``default``: the value when the option is not given (None: not given, the owner decides).
    - ``minimum``/``maximum`` (``exclusive_minimum``: the minimum itself is refused) and
      ``choices``: what :meth:`check` accepts.
    - ``search``: a store's search-time knob (offered by ``magretrieve search`` and ``serve``).
    - ``env``: the environment variable read when the option is not given (:meth:`from_env`).
    """

    name: str
    type: type
    help: str
    flag: str | None = None
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple[str, ...] | None = None
    search: bool = False
    env: str | None = None

    @property
    def label(self) -> str:
        """How messages name the option: its flag (first spelling), else its keyword."""
        return self.flag.split("/")[0] if self.flag else self.name

    def check(
        self, value: Any, where: str = "", error: builtins.type[Exception] = ConfigError
    ) -> Any:
        """``value`` converted to the option's type, or ``error`` naming the option (after
        ``where``, when given) and what it must be."""
        label = self.label
        prefix = f"{where}: " if where else ""
        if self.type is bool:
            if not isinstance(value, bool):
                raise error(f"{prefix}{label} must be true or false, got {value!r}")
            return value
        if self.type is str:
            if not isinstance(value, str):
                raise error(f"{prefix}{label} must be a string, got {value!r}")
            if self.choices is not None and value not in self.choices:
                raise error(
                    f"{prefix}{label} must be one of {', '.join(self.choices)}, got {value!r}"
                )
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:  # numpy scalars and numeric strings from config files
                value = float(value) if self.type is float else int(str(value))
            except (TypeError, ValueError):
                raise error(
                    f"{prefix}{label} must be {'a number' if self.type is float else 'an integer'}"
                    f", got {value!r}"
                ) from None
        if self.type is int:
            if isinstance(value, float) and not value.is_integer():
                raise error(f"{prefix}{label} must be an integer, got {value!r}")
            value = int(value)
        else:
            value = float(value)
            if not math.isfinite(value):
                raise error(f"{prefix}{label} must be a finite number, got {value!r}")
        low, high = self.minimum, self.maximum
        if low is not None and (value <= low if self.exclusive_minimum else value < low):
            bound = f"> {low:g}" if self.exclusive_minimum else f">= {low:g}"
            raise error(f"{prefix}{label} must be {bound}, got {value!r}")
        if high is not None and value > high:
            raise error(f"{prefix}{label} must be <= {high:g}, got {value!r}")
        return value

    def from_env(self, given: Any) -> Any:
        """``given``; when it is None, the option's environment variable (unset or empty:
        None)."""
        if given is not None or self.env is None:
            return given
        return os.environ.get(self.env) or None


def option(help: str, *, name: str = "", default: Any = None, **declared: Any) -> Any:
    """A field of an option class, declared as an :class:`Option`: ``default`` is the field's
    default, its annotation the option's type (``int``, ``float``, ``str`` or ``bool``, or
    that ``| None``), and ``name`` (the keyword; default: the field's name), ``help`` and
    ``declared`` (``flag``, ``minimum``, ``choices``, ``env``, ...) sit in its metadata."""
    declaration = Option(name, object, help, default=default, **declared)
    return field(default=default, metadata={OPTION: declaration})


#: The types an option can have, by the name an annotation gives them.
_TYPES: dict[str, type] = {t.__name__: t for t in (int, float, str, bool)}


def _annotated_type(cls: type, f: dataclasses.Field[Any]) -> type:
    """The option type a field's annotation names (``int | None`` is ``int``)."""
    annotation = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", repr(f.type))
    names = {part.strip() for part in str(annotation).split("|")} - {"None"}
    found = _TYPES.get(names.pop()) if len(names) == 1 else None
    if found is None:
        raise TypeError(
            f"{cls.__name__}.{f.name}: an option is int, float, str or bool (or that | None), "
            f"not {annotation}"
        )
    return found


#: :func:`_own_options` per class, computed once.
_OWN: dict[type, tuple[tuple[str, Option | None], ...]] = {}


def _own_options(cls: type) -> tuple[tuple[str, Option | None], ...]:
    """(field name, its option) per field of ``cls``; None for a nested option class. Cached,
    so a class gives the same Option objects every time."""
    known = _OWN.get(cls)
    if known is not None:
        return known
    out: list[tuple[str, Option | None]] = []
    nested: Mapping[str, type] = getattr(cls, "_nested", {})
    for f in dataclasses.fields(cls):
        if f.name in nested:
            out.append((f.name, None))
        elif OPTION in f.metadata:
            declared: Option = f.metadata[OPTION]
            out.append((f.name, _named(declared, f.name, _annotated_type(cls, f))))
    return _OWN.setdefault(cls, tuple(out))


@functools.cache
def _named(declared: Option, name: str, type_: type) -> Option:
    """``declared`` with its keyword (its own, else the field's ``name``) and its type: one
    object per declaration, so a field shared by two option classes
    (``IndexOptions.target_recall``) is the same option in both."""
    return dataclasses.replace(declared, name=declared.name or name, type=type_)


class OptionClass:
    """What option classes share: their declarations, building one from keywords, checking.

    A subclass is a frozen dataclass whose fields are made by :func:`option` (or are option
    classes of their own, listed in ``_nested``: their keywords are the parent's). ``error``
    is the error type its checks raise (``StoreError`` for stores).
    """

    __dataclass_fields__: ClassVar[dict[str, Any]]
    #: Nested option classes: field name -> class (filled from the keywords of that class).
    _nested: ClassVar[Mapping[str, type[OptionClass]]] = {}
    #: The error a bad value raises.
    error: ClassVar[type[Exception]] = ConfigError

    @classmethod
    def declared(cls) -> tuple[Option, ...]:
        """Every option this class (and the classes nested in it) declares, in field order."""
        out: list[Option] = []
        for name, declared in _own_options(cls):
            out.extend(cls._nested[name].declared() if declared is None else (declared,))
        return tuple(out)

    @classmethod
    def keywords(cls) -> tuple[str, ...]:
        """The keywords of :meth:`declared`."""
        return tuple(o.name for o in cls.declared())

    @classmethod
    def named(cls, keyword: str) -> Option:
        """The declared option whose keyword is ``keyword`` (a KeyError when none is)."""
        for declared in cls.declared():
            if declared.name == keyword:
                return declared
        raise KeyError(keyword)

    @classmethod
    def take(cls, given: dict[str, Any], where: str = "") -> Any:
        """An instance from the keywords in ``given`` (removed from it), each checked: a
        value of the wrong type or out of bounds is ``error`` naming the option; a keyword
        not given (or None) keeps its declared default."""
        values: dict[str, Any] = {}
        for name, declared in _own_options(cls):
            if declared is None:
                values[name] = cls._nested[name].take(given, where)
                continue
            value = given.pop(declared.name, None)
            if value is not None:
                values[name] = declared.check(value, where, cls.error)
        return cls(**values)

    def as_keywords(self) -> dict[str, Any]:
        """The values as keywords (None where not given)."""
        out: dict[str, Any] = {}
        for name, declared in _own_options(type(self)):
            value = getattr(self, name)
            if declared is None:
                out.update(value.as_keywords())
            else:
                out[declared.name] = value
        return out

    def check_declared(self, where: str = "") -> None:
        """Check every declared field of this instance (a settings class calls it from
        ``__post_init__``), keeping the converted values; None passes only where it is the
        declared default."""
        for name, declared in _own_options(type(self)):
            value = getattr(self, name)
            if declared is None:
                value.check_declared(where)
            elif value is not None or declared.default is not None:
                object.__setattr__(self, name, declared.check(value, where, self.error))
