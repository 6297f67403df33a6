"""The quickstart's closing hint: serve the store that scored best, key-less on this machine,
so the search page shows each hit's magnitude and the API docs open (examples/quickstart.py).

The example's functions are loaded from its file; heavy imports live inside its main().
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path
from types import ModuleType

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


@pytest.fixture(scope="module")
def quickstart() -> ModuleType:
    spec = importlib.util.spec_from_file_location("quickstart_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def commands(lines: list[str]) -> list[list[str]]:
    return [
        shlex.split(line) for line in lines if line.strip().split(" ", 1)[0].endswith("magretrieve")
    ]


def stores(quickstart: ModuleType, tuned: float, prior: float, mode: str = "cosine") -> list:
    result = quickstart.StoreResult
    return [
        result(
            f"fine-tuned {mode}",
            "qdrant-edge:out/index",
            tuned,
            None if mode == "cosine" else "‖d‖",
        ),
        result(f"fine-tuned {mode} + hub", "qdrant-edge:out/index-prior", prior, "m(d)"),
    ]


def test_the_best_store_is_the_one_that_scored_best(quickstart: ModuleType) -> None:
    assert quickstart.best_store(stores(quickstart, 0.6388, 0.6430)).spec.endswith("index-prior")
    assert quickstart.best_store(stores(quickstart, 0.6430, 0.6388)).spec.endswith("/index")
    # a tie keeps the simpler store, listed first
    assert quickstart.best_store(stores(quickstart, 0.64, 0.64)).spec.endswith("/index")


def test_the_hint_serves_the_prior_store_without_a_key(quickstart: ModuleType) -> None:
    lines = quickstart.serve_hint(
        "out/exported", stores(quickstart, 0.6388, 0.6430), program=".venv/bin/magretrieve"
    )
    text = "\n".join(lines)
    (command,) = commands(lines)
    assert command == [
        ".venv/bin/magretrieve", "serve", "out/exported",
        "--store", "qdrant-edge:out/index-prior", "--port", "8080",
    ]  # fmt: skip
    assert "0.6430" in lines[0] and "+ hub" in lines[0]
    # no key: the page and its API docs open as they are (a key would turn /docs into a 401)
    assert "--api-key" not in text and "MAGRETRIEVE_API_KEY=change-me" not in text
    assert "http://127.0.0.1:8080/" in text and "http://127.0.0.1:8080/docs" in text
    assert "m(d)" in text  # what the page shows as each hit's magnitude
    assert "pip install" not in text  # the server extra is installed (the default)


def test_a_cosine_best_store_also_offers_the_store_with_magnitude(quickstart: ModuleType) -> None:
    lines = quickstart.serve_hint("out/exported", stores(quickstart, 0.6430, 0.6388))
    text = "\n".join(lines)
    best, other = commands(lines)
    assert best[best.index("--store") + 1] == "qdrant-edge:out/index"
    assert other[other.index("--store") + 1] == "qdrant-edge:out/index-prior"
    assert "every norm is 1.0" in text and "to see magnitude on the page" in text


def test_a_magnitude_mode_store_needs_no_second_command(quickstart: ModuleType) -> None:
    only = stores(quickstart, 0.65, 0.0, mode="qnorm")[:1]
    lines = quickstart.serve_hint("out/exported", only, port=9000)
    (command,) = commands(lines)
    assert command[-2:] == ["--port", "9000"] and "‖d‖" in "\n".join(lines)


def test_without_the_server_extra_the_hint_names_its_install(quickstart: ModuleType) -> None:
    lines = quickstart.serve_hint(
        "out/exported", stores(quickstart, 0.6, 0.7), server_installed=False
    )
    assert any("pip install 'magretrieve[server]'" in line for line in lines)
