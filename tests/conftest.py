"""Shared fixtures: tiny random BERT encoders (hidden 32) and a tiny BEIR data set, built here.

Nothing is downloaded: the tokenizer is a WordPiece vocabulary written by the fixture.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from magretrieve.train.testing import (  # noqa: F401  (re-exported for tests)
    TINY_TOPICS,
    build_tiny_bert,
    build_tiny_sentence_transformer,
    write_tiny_beir,
)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A plain Hugging Face folder: random BERT, hidden 32. Do not modify it in a test."""
    return build_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def tiny_st_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sentence-transformers folder (mean pooling + Normalize) around a tiny BERT."""
    return build_tiny_sentence_transformer(tmp_path_factory.mktemp("tiny_st"))


@pytest.fixture(scope="session")
def tiny_beir_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 12-document BEIR folder with ``train`` and ``test`` qrels splits."""
    return write_tiny_beir(tmp_path_factory.mktemp("tiny_beir"))


#: Texts both runtimes encode in the OpenVINO and static-int8 tests: short, long, one word,
#: non-ASCII.
RUNTIME_TEXTS = [
    "magnitude as a relevance prior",
    "a much longer document about boundary layers, pressure gradients and the flow over a wing",
    "short",
    "ÜNÏCÖDÉ heart rate and vitamin dose",
    "cosine throws the length of each vector away",
]

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (real BEIR sets); tests needing it skip only if it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not present")
    return SHARED_DATA


BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` (a folder of scripts, not a package) as a module;
    ``name`` may name a study (``studies/data_size``).

    Registered in ``sys.modules`` first: dataclasses resolve annotations through it.
    """
    # Benchmarks are scripts: run as `python benchmarks/NAME.py`, their folder is on sys.path and
    # they import `_common` and siblings by plain name. Loading one here gives it the same view.
    # The folder holds no `magretrieve`, so the installed package is never shadowed.
    if str(BENCHMARKS) not in sys.path:
        sys.path.append(str(BENCHMARKS))
    module_name = "bench_" + name.replace("/", "_")
    spec = importlib.util.spec_from_file_location(module_name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def set_manifest_field(manifest: dict, key: str, value: object) -> None:
    """Set a manifest field where it lives: encoder settings sit under ``"encoder"`` (format 2)."""
    from magretrieve.core.manifest import ENCODER_FIELDS

    if key in ENCODER_FIELDS and isinstance(manifest.get("encoder"), dict):
        manifest["encoder"][key] = value
    else:
        manifest[key] = value


PG_URI_ENV = "MAGRETRIEVE_TEST_PGVECTOR_URI"  # = tests/store_examples.PG_URI_ENV
_PG_SERVER: list = []


#: Environment of a pytest-xdist worker (the unit lane runs one worker per core).
XDIST_WORKER_ENV = "PYTEST_XDIST_WORKER"


def _one_thread_per_worker() -> None:
    """Under pytest-xdist, each worker's libraries use one thread: the workers already keep
    every core busy, and torch/OpenMP thread pools of N workers on N cores only contend."""
    if not os.environ.get(XDIST_WORKER_ENV):
        return
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    import torch

    torch.set_num_threads(1)


def pytest_configure(config: pytest.Config) -> None:
    """Start a real PostgreSQL + pgvector (``pgserver``, works as root) for this session.

    Started before collection because the shared store tests take their backend list from the
    registry and tests/store_examples.py, whose pgvector example names this server (through the environment,
    so subprocesses of tests see it too). Unix socket only, in a fresh tmp folder; stopped and
    deleted at the end. Nothing is started where pgserver is not installed (the torch-free
    serving venv); ``tests/test_backend_congruence.py`` requires it. Nor is it in the unit
    lane (``-m "not integration ..."``): every test that needs it is an integration test.
    """
    _one_thread_per_worker()
    if os.environ.get(PG_URI_ENV) or importlib.util.find_spec("pgserver") is None:
        return
    if "not integration" in (config.option.markexpr or ""):
        return
    import pgserver

    folder = Path(tempfile.mkdtemp(prefix="mr-pg-"))
    server = pgserver.get_server(folder, cleanup_mode="delete")
    server.psql("CREATE EXTENSION IF NOT EXISTS vector;")
    _PG_SERVER.append(server)
    os.environ[PG_URI_ENV] = server.get_uri()


def pytest_unconfigure(config: pytest.Config) -> None:
    while _PG_SERVER:
        _PG_SERVER.pop().cleanup()
        os.environ.pop(PG_URI_ENV, None)


@pytest.fixture(scope="session")
def pg_uri() -> str:
    """The URI of the session's PostgreSQL server (each test uses its own table)."""
    uri = os.environ.get(PG_URI_ENV)
    assert uri, "pgserver is not installed: pip install 'magretrieve[dev]' (it holds pgserver)"
    return uri


@pytest.fixture(scope="session")
def milvus_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Milvus standalone server for this session (``milvus`` package), stopped at the end."""
    from servers import milvus_server

    with milvus_server(tmp_path_factory.mktemp("milvus-server") / "data") as url:
        yield url


@pytest.fixture(scope="session")
def chroma_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Chroma server (``chroma run``) for this session, stopped at the end."""
    from servers import chroma_server

    with chroma_server(tmp_path_factory.mktemp("chroma-server") / "data") as url:
        yield url


#: Debian's Chromium (packages chromium, chromium-driver); Playwright drives it, its own browser
#: download is not used.
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def ensure_chromium() -> Path:
    """``/usr/bin/chromium``, installed from Debian's packages when missing (the tests run as
    root in CI, as they start PostgreSQL themselves)."""
    if not CHROMIUM.exists():
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"],
        ):
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing after apt-get install chromium"
    return CHROMIUM


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    """A headless Debian Chromium driven by Playwright, for one test module.

    Playwright's sync API runs an event loop in this thread while it is open, and
    ``asyncio.run`` refuses to start beside it: it must close before other modules run."""
    from playwright.sync_api import sync_playwright

    path = ensure_chromium()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(path), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


# --- test lanes -----------------------------------------------------------------------------
# The unit lane is `pytest -m "not integration and not slow"`; the integration lane is
# `-m "integration or slow"` (scripts/test.sh runs both). Tests are put in the integration lane
# by what they use, not by name, so a new test joins the right lane without an edit here:
#: fixtures that start or need a real server (PostgreSQL, a local Ray cluster) or a browser
SERVER_FIXTURES = frozenset(
    {"pg_uri", "ray_local", "milvus_server_url", "chroma_server_url", "chromium"}
)
#: roots of client libraries of real servers, and of database engines that run embedded in the
#: test process (LanceDB, Chroma): a test module importing one talks to a real database
SERVER_CLIENTS = frozenset(
    {"psycopg", "pgserver", "pymilvus", "milvus_lite", "ray", "lancedb", "chromadb"}
)
#: helpers that start a real server process (``magretrieve serve`` under uvicorn)
SERVER_STARTERS = ("start_server",)
#: store backends whose tests run a server (parametrized ids naming them)
SERVER_BACKENDS = re.compile(r"(^|[-\[])(pgvector|milvus)")
#: test modules that build the wheel or run a benchmark script's smoke run
INTEGRATION_MODULES = re.compile(r"^test_(wheel|.+_benchmark)\.py$")


def _imports_server_client(module: ModuleType | None) -> bool:
    if module is None:
        return False
    for value in vars(module).values():
        name = (
            value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        )
        if isinstance(name, str) and name.split(".")[0] in SERVER_CLIENTS:
            return True
    return False


def _calls(item: pytest.Item, names: tuple[str, ...]) -> bool:
    """Whether the test, or a fixture it uses, calls one of ``names`` (by its code's names)."""
    functions = [getattr(item, "function", None)]
    fixture_info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(fixture_info, "name2fixturedefs", {}).values():
        functions += [d.func for d in defs]
    return any(
        name in getattr(getattr(f, "__code__", None), "co_names", ())
        for f in functions
        for name in names
    )


def _loads_a_benchmark(item: pytest.Item) -> bool:
    """Whether the test, or a fixture it uses, calls :func:`load_benchmark`: it runs part of a
    benchmark script (a smoke run), whatever module it sits in."""
    return _calls(item, ("load_benchmark",))


def is_integration(item: pytest.Item) -> bool:
    """Whether ``item`` needs a real server, the built wheel or a benchmark script."""
    if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    if INTEGRATION_MODULES.match(item.path.name) or _loads_a_benchmark(item):
        return True
    if _calls(item, SERVER_STARTERS):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and SERVER_BACKENDS.search(callspec.id):
        return True
    return _imports_server_client(getattr(item, "module", None))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that :func:`is_integration` recognizes with ``integration``."""
    for item in items:
        if is_integration(item) and item.get_closest_marker("integration") is None:
            item.add_marker(pytest.mark.integration)
