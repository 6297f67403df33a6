"""Each server setting is declared once: ``magretrieve serve``'s options are derived from the
``ServerSettings`` fields (same defaults, same flag names), and what the flags say is what the
server is started with."""

from __future__ import annotations

from dataclasses import fields

import click
import pytest
from click.testing import CliRunner

from magretrieve.cli import cmd_serve, main
from magretrieve.core.errors import ConfigError
from magretrieve.serving.settings import EngineSettings, ServerSettings

#: Every flag of the serve command, as the users' scripts spell them.
SETTING_FLAGS = {
    "api_key": "--api-key",
    "max_inputs": "--max-inputs",
    "max_text_chars": "--max-text-chars",
    "max_batch_tokens": "--max-batch-tokens",
    "max_batch_rows": "--max-batch-rows",
    "max_wait_ms": "--max-wait-ms",
    "max_queue": "--max-queue",
    "batching": "--no-batching",
    "graph_workers": "--graph-workers",
    "onnx_spinning": "--onnx-spinning",
    "model_id": "--model-id",
    "limit_concurrency": "--limit-concurrency",
    "timeout_keep_alive": "--timeout-keep-alive",
    "timeout_body": "--timeout-body",
    "timeout_response": "--timeout-response",
    "recall_sample": "--recall-sample",
    "recall_cpu_share": "--recall-cpu-share",
}
PYTHON_ONLY = {"min_batch_fill", "max_body_bytes", "max_k", "retry_after_s"}


def serve_params() -> dict[str, click.Parameter]:
    return {p.name: p for p in main.commands["serve"].params if p.name}


def test_every_setting_is_a_flag_or_declared_python_only() -> None:
    declared = {o.name: o for o in ServerSettings.declared()}
    assert set(declared) == {f.name for f in fields(ServerSettings)}
    assert set(declared) == set(SETTING_FLAGS) | PYTHON_ONLY
    params = serve_params()
    for name, flag in SETTING_FLAGS.items():
        o = declared[name]
        assert o.flag is not None and o.help
        option = params[name]
        assert flag in option.opts
        assert option.default == o.default == getattr(ServerSettings(), name), name  # once
        assert option.help == o.help
    assert "--no-onnx-spinning" in params["onnx_spinning"].secondary_opts
    for name in PYTHON_ONLY:
        assert declared[name].flag is None and name not in params
    # the engine's settings are the server's first fields, with the same defaults
    assert [f.name for f in fields(EngineSettings)] == [f.name for f in fields(ServerSettings)][
        : len(fields(EngineSettings))
    ]


@pytest.fixture
def started(monkeypatch) -> list[ServerSettings]:
    """``magretrieve serve`` up to the point where it would open the export: the settings."""
    from magretrieve.server import app

    seen: list[ServerSettings] = []

    def open_state(export, store, *, settings, **_):
        seen.append(settings)
        raise click.exceptions.Exit(0)

    monkeypatch.setattr(cmd_serve, "_listen", lambda host, port: None)
    monkeypatch.setattr(app, "open_state", open_state)
    monkeypatch.delenv("MAGRETRIEVE_API_KEY", raising=False)
    return seen


def test_no_flags_start_the_declared_defaults(started, tmp_path) -> None:
    result = CliRunner().invoke(main, ["serve", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert started == [ServerSettings()]


def test_the_flags_reach_the_settings(started, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MAGRETRIEVE_API_KEY", "k-from-env")
    args = [
        "--max-inputs", "7", "--max-text-chars", "99", "--max-batch-tokens", "512",
        "--max-batch-rows", "8", "--max-wait-ms", "0.5", "--max-queue", "3", "--no-batching",
        "--graph-workers", "1", "--no-onnx-spinning", "--model-id", "acme/m",
        "--limit-concurrency", "9", "--timeout-keep-alive", "2.5", "--timeout-body", "7",
        "--timeout-response", "11.5", "--recall-sample", "0", "--recall-cpu-share", "0.2",
    ]  # fmt: skip
    result = CliRunner().invoke(main, ["serve", str(tmp_path), *args])
    assert result.exit_code == 0, result.output
    assert started == [
        ServerSettings(
            api_key="k-from-env",
            max_inputs=7,
            max_text_chars=99,
            max_batch_tokens=512,
            max_batch_rows=8,
            max_wait_ms=0.5,
            max_queue=3,
            batching=False,
            graph_workers=1,
            onnx_spinning=False,
            model_id="acme/m",
            limit_concurrency=9,
            timeout_keep_alive=2.5,
            timeout_body=7.0,
            timeout_response=11.5,
            recall_sample=0.0,
            recall_cpu_share=0.2,
        )
    ]


@pytest.mark.parametrize(
    "args,python,says",
    [
        (
            ["--recall-sample", "1.5"],
            {"recall_sample": 1.5},
            "--recall-sample must be <= 1, got 1.5",
        ),
        (
            ["--recall-cpu-share", "0"],
            {"recall_cpu_share": 0},
            "--recall-cpu-share must be > 0, got 0.0",
        ),
        (["--max-queue", "0"], {"max_queue": 0}, "--max-queue must be >= 1, got 0"),
        (["--max-wait-ms", "-1"], {"max_wait_ms": -1}, "--max-wait-ms must be >= 0, got -1.0"),
        (
            ["--timeout-keep-alive", "0"],
            {"timeout_keep_alive": 0},
            "--timeout-keep-alive must be > 0, got 0.0",
        ),
        (
            ["--timeout-keep-alive", "nan"],
            {"timeout_keep_alive": float("nan")},
            "--timeout-keep-alive must be a finite number, got nan",
        ),
        (["--timeout-body", "0"], {"timeout_body": 0}, "--timeout-body must be > 0, got 0.0"),
        (
            ["--timeout-response", "3601"],
            {"timeout_response": 3601},
            "--timeout-response must be <= 3600, got 3601.0",
        ),
    ],
)
def test_a_bad_value_is_the_same_line_from_python_and_the_flag(
    started, tmp_path, args, python, says
) -> None:
    result = CliRunner().invoke(main, ["serve", str(tmp_path), *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1 and lines == [f"Error: {says}"]
    assert started == []
    with pytest.raises(ConfigError) as bad:
        ServerSettings(**python)
    assert str(bad.value) == says


def test_python_only_settings_are_checked_by_their_declaration() -> None:
    with pytest.raises(ConfigError, match=r"^max_k must be >= 1, got 0$"):
        ServerSettings(max_k=0)
    with pytest.raises(ConfigError, match=r"^min_batch_fill must be <= 1, got 1.5$"):
        EngineSettings(min_batch_fill=1.5)
    with pytest.raises(ConfigError, match=r"^--graph-workers must be an integer, got True$"):
        EngineSettings(graph_workers=True)
    assert ServerSettings(max_wait_ms=3).max_wait_ms == 3.0  # converted to the declared type
