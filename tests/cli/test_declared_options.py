"""Every flag the library declares is derived from its declaration, the same everywhere.

A declared option (:class:`magretrieve.core.options.Option`: a store option, a server or
engine setting, an indexing engine's option) gives the same flag, default and help on every
command that offers it, and a bad value is the same error line from the command line and
from Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import click
import pytest
from click.testing import CliRunner

from magretrieve.cli import main
from magretrieve.cli._options import click_option, click_options
from magretrieve.core.errors import ConfigError, StoreError
from magretrieve.core.options import Option, OptionClass, option
from magretrieve.engines import engine_options, option_specs
from magretrieve.serving.settings import ServerSettings
from magretrieve.stores import open_store, registry
from magretrieve.stores.annotation import RECORDED_PREFETCH
from tests.support.cli import run
from tests.support.fake_encoder import write_corpus


def declared_flags() -> dict[str, Option]:
    """Every declared option with a flag: store options, serve settings, engine options."""
    out: dict[str, Option] = {}
    for o in (*registry.cli_options(), *ServerSettings.declared(), *option_specs()):
        if o.flag is not None:
            assert out.setdefault(o.name, o) == o, f"{o.name} declared twice, differently"
    return out


def test_each_declared_flag_is_the_same_on_every_command() -> None:
    declared = declared_flags()
    ctx = click.Context(main)
    seen: dict[str, list[str]] = {}
    for name in main.list_commands(ctx):
        command = main.get_command(ctx, name)
        assert command is not None
        for param in command.params:
            o = declared.get(param.name or "")
            if o is None or not isinstance(param, click.Option):
                continue
            if (name, o.name) == ("annotate", "prefetch"):
                o = RECORDED_PREFETCH  # the default annotate records, not a search knob
            else:
                seen.setdefault(o.name, []).append(name)
            assert o.flag is not None
            assert param.opts[0] == o.flag.split("/")[0], (name, o.name)
            assert param.default == o.default, (name, o.name)
            assert param.help is not None and o.help in param.help, (name, o.name)
    # every declared flag is offered somewhere, the shared ones on several commands
    assert set(seen) == set(declared)
    assert sorted(seen["ef_search"]) == ["index", "recall", "rescale", "search", "serve"]
    assert sorted(seen["workers"]) == ["index"] and sorted(seen["max_queue"]) == ["serve"]


@dataclass(frozen=True)
class _Flags(OptionClass):
    count: int = option("How many.", default=3, flag="--count", minimum=1)
    label: str | None = option("A label.", flag="--label", choices=("x", "y"))
    fast: bool = option("Go fast.", default=True, flag="--fast/--no-fast")
    check: bool = option("Skip the check.", default=True, flag="--no-check")
    hidden: int = option("Python only.", default=1)


def test_click_derivation_of_each_kind_of_option() -> None:
    @click.command()
    @click_options(_Flags.declared())
    def cmd(**kw: object) -> None:
        made = _Flags(**kw)  # type: ignore[arg-type]
        made.check_declared()
        click.echo(repr(made))

    params = {p.name: p for p in cmd.params}
    assert set(params) == {"count", "label", "fast", "check"}  # no flag, no option
    assert params["count"].default == 3 and params["count"].show_default  # type: ignore[attr-defined]
    assert isinstance(params["label"].type, click.Choice) and params["label"].default is None
    assert params["fast"].secondary_opts == ["--no-fast"]  # type: ignore[attr-defined]
    assert params["check"].flag_value is False  # type: ignore[attr-defined]
    out = CliRunner().invoke(cmd, []).output
    assert out.strip() == repr(_Flags())
    out = CliRunner().invoke(cmd, ["--count", "5", "--no-fast", "--no-check", "--label", "y"])
    assert out.output.strip() == repr(_Flags(count=5, label="y", fast=False, check=False))
    bad = CliRunner().invoke(cmd, ["--count", "0"])
    assert isinstance(bad.exception, ConfigError)
    assert str(bad.exception) == "--count must be >= 1, got 0"
    with pytest.raises(ValueError, match="no command-line flag"):
        click_option(_Flags.named("hidden"))


def test_a_bad_engine_option_is_one_line_before_the_engine_loads(tmp_path) -> None:
    corpus = write_corpus(tmp_path / "c.jsonl", 3)
    args = ["index", "EXPORT", str(corpus), "--store", f"faiss:{tmp_path / 'i'}"]
    res = run(*args, "--engine", "ray", "--workers", "0")
    assert res.exit_code == 1 and res.output.strip() == "Error: --workers must be >= 1, got 0"
    with pytest.raises(ConfigError) as bad:
        engine_options("ray", {"workers": 0}, {})
    assert str(bad.value) == "--workers must be >= 1, got 0"
    res = run(*args, "--engine", "ray", "--connect-timeout", "0")
    assert res.output.strip() == "Error: --connect-timeout must be > 0, got 0.0"


def test_a_bad_store_option_is_the_same_line_from_the_flag_and_python(use_fake, tmp_path) -> None:
    corpus = write_corpus(tmp_path / "c.jsonl", 3)
    spec = f"faiss:{tmp_path / 'i'}"
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--hnsw-m", "1", "--no-progress")
    says = f"{spec}: --hnsw-m must be >= 2, got 1"
    assert res.exit_code == 1 and res.output.strip() == f"Error: {says}"
    with pytest.raises(StoreError) as bad:
        open_store(spec, dimension=4, hnsw_m=1)
    assert str(bad.value) == says
    res = run("index", "EXPORT", str(corpus), "--store", spec, "--quantization", "pq")
    assert res.exit_code == 2 and "'pq' is not 'int8'" in res.output  # a click choice


def test_environment_variables_are_declared_with_their_options(monkeypatch) -> None:
    from magretrieve.serving.settings import key_from_env
    from magretrieve.stores.milvus_store import MilvusOptions
    from magretrieve.stores.qdrant_store import QdrantClientOptions

    envs = {
        "api_key": (ServerSettings.named("api_key"), "MAGRETRIEVE_API_KEY"),
        "qdrant": (QdrantClientOptions.named("api_key"), "QDRANT_API_KEY"),
        "milvus": (MilvusOptions.named("token"), "MILVUS_TOKEN"),
    }
    for declared, variable in envs.values():
        assert declared.env == variable and f"${variable}" in declared.help
        monkeypatch.setenv(variable, f"from-{variable}")
        assert declared.from_env(None) == f"from-{variable}"
        assert declared.from_env("given") == "given"
    assert key_from_env(None) == "from-MAGRETRIEVE_API_KEY"
    monkeypatch.setenv("MAGRETRIEVE_API_KEY", "")
    assert key_from_env(None) is None
