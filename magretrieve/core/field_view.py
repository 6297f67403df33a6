"""An attribute that shows one field of a dataclass its owner holds, under the owner's name.

``Manifest.mode`` is ``Manifest.encoder.mode`` and ``EncoderConfig.norm_head`` is
``EncoderConfig.head.kind``: one owner keeps each setting, and the other names read it (or,
when writable, replace the held dataclass with that field changed), instead of a property
written out per name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")

__all__ = ["FieldView"]


class FieldView(Generic[T]):
    """The field ``field`` (default: the attribute's own name) of the dataclass held in the
    owner's attribute ``holder``; read-only unless ``writable``."""

    def __init__(self, holder: str, field: str | None = None, *, writable: bool = False) -> None:
        self.holder, self.field, self.writable = holder, field, writable
        self.name = field or ""

    def __set_name__(self, owner: type[Any], name: str) -> None:
        self.name = name
        if self.field is None:
            self.field = name

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> FieldView[T]: ...
    @overload
    def __get__(self, obj: object, owner: type[Any] | None = None) -> T: ...
    def __get__(self, obj: object, owner: type[Any] | None = None) -> Any:
        if obj is None:
            return self
        return getattr(getattr(obj, self.holder), str(self.field))

    def __set__(self, obj: object, value: T) -> None:
        if not self.writable:
            raise AttributeError(
                f"{self.name!r} of {type(obj).__name__!r} is a read-only view of "
                f"{self.holder}.{self.field}"
            )
        held = getattr(obj, self.holder)
        setattr(obj, self.holder, replace(held, **{str(self.field): value}))
