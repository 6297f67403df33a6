"""Engines declare their own options: the schema ``magretrieve index`` derives its flags from,
and the checks that keep one engine's options away from another."""

from __future__ import annotations

import pytest

from magretrieve.core.errors import ConfigError
from magretrieve.engines import ENGINES, engine_options, get_engine, option_specs


def test_the_schema_lists_each_engine_option_once_with_its_flag() -> None:
    specs = option_specs()
    assert [(o.name, o.flag, o.type) for o in specs] == [
        ("address", "--address", str),
        ("workers", "--workers", int),
        ("connect_timeout", "--connect-timeout", float),
    ]
    assert sorted(ENGINES) == ["local", "ray"]


def test_local_takes_nothing_and_refuses_another_engines_options() -> None:
    unset = {"address": None, "workers": None}
    assert engine_options("local", unset, {"threads": 4, "runtime": "openvino"}) == {}
    with pytest.raises(ConfigError, match=r"^--address and --workers need --engine ray$"):
        engine_options("local", {"address": "auto", "workers": 2}, {})
    with pytest.raises(ConfigError, match=r"^--connect-timeout needs --engine ray$"):
        engine_options("local", {"address": None, "connect_timeout": 5.0}, {})


def test_ray_gets_its_options_and_the_forwarded_threads() -> None:
    got = engine_options("ray", {"address": "auto", "workers": None}, {"threads": None})
    assert got == {"address": "auto", "workers": None, "connect_timeout": None}
    got = engine_options("ray", {"address": None, "workers": 3}, {"threads": 2})
    assert got == {"address": None, "workers": 3, "connect_timeout": None, "threads": 2}
    with pytest.raises(ConfigError, match=r"^--runtime applies to --engine local \(Ray workers"):
        engine_options("ray", {}, {"runtime": "openvino"})


def test_unknown_or_local_engine_has_no_function() -> None:
    with pytest.raises(
        ConfigError, match="unknown indexing engine 'spark'; choose one of local, ray"
    ):
        get_engine("spark")
    with pytest.raises(ConfigError, match="unknown indexing engine 'local'"):
        get_engine("local")
