"""Shared fixtures: tiny random BERT encoders (hidden 32) and a tiny BEIR data set (built by
tests/support/tiny_models.py; nothing is downloaded), the session's database servers, and the
check that every test declares the lane it needs (see "test lanes" below).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.tiny_models import (
    build_tiny_bert,
    build_tiny_sentence_transformer,
    write_tiny_beir,
)

#: fixtures every test may use: ``use_fake`` (the CLI over a FakeEncoder)
pytest_plugins = ["tests.support.cli"]


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


SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (real BEIR sets); tests needing it skip only if it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not present")
    return SHARED_DATA


PG_URI_ENV = "MAGRETRIEVE_TEST_PGVECTOR_URI"  # = tests/support/store_examples.PG_URI_ENV
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
    registry and tests/support/store_examples.py, whose pgvector example names this server (through
    the environment, so subprocesses of tests see it too). Unix socket only, in a fresh tmp folder; stopped and
    deleted at the end. Nothing is started where pgserver is not installed (the torch-free
    serving venv); the store congruence suite (``tests/stores/test_stores.py``) requires it. Nor is it in the unit
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
    from tests.support.servers import milvus_server

    with milvus_server(tmp_path_factory.mktemp("milvus-server") / "data") as url:
        yield url


@pytest.fixture(scope="session")
def chroma_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Chroma server (``chroma run``) for this session, stopped at the end."""
    from tests.support.servers import chroma_server

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
# The unit lane is `pytest -m "not integration and not slow"` (pyproject's addopts: what a bare
# `pytest` runs); the integration lane is `-m "integration or slow"` (scripts/test.sh runs both).
# A test declares its lane: `pytestmark = pytest.mark.integration` (or `slow`) in its module, or
# the mark on the test. One rule here marks parameters: a case whose parameter id names a store
# that runs a server process (SERVER_STORES: pgvector, Milvus) is an integration test, wherever
# the shared store examples put it. What a test uses is still read here, only to check the
# declarations: a test that needs a real server, the built wheel or a benchmark script but is
# not marked fails with one line naming it and what it uses.
#: fixtures that start or need a real server (PostgreSQL, a local Ray cluster) or a browser
SERVER_FIXTURES = frozenset(
    {"pg_uri", "ray_local", "milvus_server_url", "chroma_server_url", "chromium"}
)
#: roots of client libraries of real servers, and of database engines that run embedded in the
#: test process (LanceDB, Chroma): a test module importing one talks to a real database
SERVER_CLIENTS = frozenset(
    {"psycopg", "pgserver", "pymilvus", "milvus_lite", "ray", "lancedb", "chromadb"}
)
#: helpers that start a real server process (``magretrieve serve`` under uvicorn) or run part
#: of a benchmark script (a smoke run)
STARTERS = ("start_server", "load_benchmark")
#: store backends that run a server process (PostgreSQL, Milvus Lite): parametrized cases whose
#: id names one are marked integration
SERVER_STORES = re.compile(r"(^|[-\[])(pgvector|milvus)")
#: folders and modules that hold only integration tests: benchmark smoke runs, the wheel
INTEGRATION_PATHS = re.compile(r"(^|/)tests/benchmarks/|(^|/)test_wheel\.py$")


def _server_client(module: ModuleType | None) -> str | None:
    if module is None:
        return None
    for value in vars(module).values():
        name = (
            value.__name__ if isinstance(value, ModuleType) else getattr(value, "__module__", None)
        )
        if isinstance(name, str) and name.split(".")[0] in SERVER_CLIENTS:
            return name.split(".")[0]
    return None


def _called(item: pytest.Item, names: tuple[str, ...]) -> str | None:
    """The first of ``names`` the test, or a fixture it uses, calls (by its code's names)."""
    functions = [getattr(item, "function", None)]
    fixture_info = getattr(item, "_fixtureinfo", None)
    for defs in getattr(fixture_info, "name2fixturedefs", {}).values():
        functions += [d.func for d in defs]
    for name in names:
        for f in functions:
            if name in getattr(getattr(f, "__code__", None), "co_names", ()):
                return name
    return None


def integration_use(item: pytest.Item) -> str | None:
    """What makes ``item`` an integration test (a real server, the built wheel or a benchmark
    script), or None."""
    fixtures = sorted(SERVER_FIXTURES & set(getattr(item, "fixturenames", ())))
    if fixtures:
        return f"the {fixtures[0]} fixture"
    if INTEGRATION_PATHS.search(item.path.as_posix()):
        return "a benchmark script or the built wheel"
    called = _called(item, STARTERS)
    if called:
        return f"{called}()"
    client = _server_client(getattr(item, "module", None))
    return f"{client} (imported by its module)" if client else None


#: stash key: why a test that is not marked needs the integration lane
_MISFILED = pytest.StashKey[str]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the cases of server-backed stores, then find tests that need the integration lane
    but declare no lane (see above)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and SERVER_STORES.search(callspec.id):
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("integration") or item.get_closest_marker("slow"):
            continue
        use = integration_use(item)
        if use:
            item.stash[_MISFILED] = use


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A misfiled test fails before it runs: one line naming what it uses."""
    use = item.stash.get(_MISFILED, None)
    if use:
        pytest.fail(
            f"{item.nodeid} uses {use} but is not marked integration: add "
            "`pytestmark = pytest.mark.integration` to its module (or mark the test)",
            pytrace=False,
        )
