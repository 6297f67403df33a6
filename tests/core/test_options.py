"""The one declared-option type: an option's checks, its field helper and option classes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

from magretrieve.core.errors import ConfigError, StoreError
from magretrieve.core.options import Option, OptionClass, option


@dataclass(frozen=True)
class _Inner(OptionClass):
    depth: int | None = option("How deep.", name="inner_depth", flag="--depth", minimum=1)


@dataclass(frozen=True)
class _Toy(OptionClass):
    size: int = option("How many.", default=4, flag="--size", minimum=1, maximum=10)
    ratio: float = option("A share.", default=0.5, minimum=0, exclusive_minimum=True)
    mode: str | None = option("A kind.", flag="--mode", choices=("a", "b"))
    on: bool = option("Turn it off.", default=True, flag="--off")
    key: str | None = option("A key.", flag="--key", env="TOY_KEY")
    inner: _Inner = field(default_factory=_Inner)
    _nested: ClassVar[Any] = {"inner": _Inner}


def test_a_field_declares_its_keyword_default_and_flag_once() -> None:
    size, ratio, mode, on, key, depth = _Toy.declared()
    assert (size.name, size.type, size.default, size.flag) == ("size", int, 4, "--size")
    assert (ratio.name, ratio.flag, ratio.label) == ("ratio", None, "ratio")
    assert depth.name == "inner_depth" and depth.label == "--depth"  # an explicit keyword
    assert _Toy.keywords() == ("size", "ratio", "mode", "on", "key", "inner_depth")
    assert _Toy.declared() == _Toy.declared() and _Toy.declared()[0] is _Toy.declared()[0]
    assert _Toy.named("key") is key and key.env == "TOY_KEY"
    assert _Toy().size == 4 and _Toy().on is True  # the declared default is the field's
    with pytest.raises(KeyError):
        _Toy.named("nope")


@pytest.mark.parametrize(
    "keyword,value,message",
    [
        ("size", 0, "--size must be >= 1, got 0"),
        ("size", 11, "--size must be <= 10, got 11"),
        ("size", 2.5, "--size must be an integer, got 2.5"),
        ("size", "x", "--size must be an integer, got 'x'"),
        ("size", True, "--size must be an integer, got True"),
        ("ratio", 0, "ratio must be > 0, got 0.0"),
        ("ratio", float("inf"), "ratio must be a finite number, got inf"),
        ("ratio", "many", "ratio must be a number, got 'many'"),
        ("mode", "c", "--mode must be one of a, b, got 'c'"),
        ("mode", 3, "--mode must be a string, got 3"),
        ("on", "yes", "--off must be true or false, got 'yes'"),
        ("inner_depth", 0, "--depth must be >= 1, got 0"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_option(keyword: str, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as bad:
        _Toy.take({keyword: value})
    assert str(bad.value) == message
    with pytest.raises(StoreError) as where:  # the owner picks the error type and the place
        _Toy.named(keyword).check(value, "here", StoreError)
    assert str(where.value) == f"here: {message}"


def test_values_are_converted_to_the_declared_type() -> None:
    given = {"size": "7", "ratio": 1, "inner_depth": 2.0, "other": "left"}
    made = _Toy.take(given)
    assert made == _Toy(size=7, ratio=1.0, inner=_Inner(depth=2))
    assert isinstance(made.ratio, float) and isinstance(made.inner.depth, int)
    assert given == {"other": "left"}  # what no option took stays with the caller
    assert made.as_keywords() == {
        "size": 7,
        "ratio": 1.0,
        "mode": None,
        "on": True,
        "key": None,
        "inner_depth": 2,
    }


def test_check_declared_checks_an_instance_in_place() -> None:
    @dataclass(frozen=True)
    class Settings(OptionClass):
        workers: int = option("Workers.", default=2, minimum=1)
        name: str | None = option("A name.")

        def __post_init__(self) -> None:
            self.check_declared()

    assert Settings(workers="3").workers == 3  # type: ignore[arg-type]
    assert Settings().name is None  # None passes where it is the declared default
    with pytest.raises(ConfigError, match=r"^workers must be >= 1, got 0$"):
        Settings(workers=0)
    with pytest.raises(ConfigError, match=r"^workers must be an integer, got None$"):
        Settings(workers=None)  # type: ignore[arg-type]


def test_the_environment_fills_an_option_not_given(monkeypatch) -> None:
    key = _Toy.named("key")
    monkeypatch.delenv("TOY_KEY", raising=False)
    assert key.from_env(None) is None
    monkeypatch.setenv("TOY_KEY", "")
    assert key.from_env(None) is None  # empty is unset
    monkeypatch.setenv("TOY_KEY", "from-env")
    assert key.from_env(None) == "from-env"
    assert key.from_env("given") == "given"  # what is given wins
    assert Option("plain", str, "No variable.").from_env(None) is None


def test_the_type_is_the_fields_annotation_and_only_a_scalar_one() -> None:
    assert [o.type for o in _Toy.declared()] == [int, float, str, bool, str, int]

    @dataclass(frozen=True)
    class Bad(OptionClass):
        items: list[int] | None = option("A list.")

    with pytest.raises(TypeError, match=r"^Bad.items: an option is int, float, str or bool"):
        Bad.declared()
