"""The shipped artifact: the wheel holds every module of the tree, and the suite tests it.

``scripts/test.sh`` builds the wheel, installs it (not editable) and runs the suite from outside
the checkout with ``MAGRETRIEVE_WHEEL`` / ``MAGRETRIEVE_TEST_INSTALLED`` set; run directly,
the test builds a wheel of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
#: Source folder of the one package of the design.
SOURCES = {"magretrieve": REPO / "magretrieve"}


def tree_modules(patterns: tuple[str, ...] = ("*.py",)) -> set[str]:
    """Every module (or file matching ``patterns``) of the source tree, as its wheel path."""
    out = set()
    for package, folder in SOURCES.items():
        base = Path(*package.split("."))
        for file in (f for pattern in patterns for f in folder.rglob(pattern)):
            if "__pycache__" in file.parts:
                continue
            out.add((base / file.relative_to(folder)).as_posix())
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = os.environ.get("MAGRETRIEVE_WHEEL")
    if built:
        return Path(built)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
    )
    return next(out.glob("magretrieve-*.whl"))


def test_wheel_holds_every_module_of_the_tree(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    # modules, the data files they read, and the pages and assets the server serves
    expected = tree_modules(("*.py", "*.json", "*.html", "*.css", "*.js", "*.svg"))
    assert {"magretrieve/diagnose/evidence.json", "magretrieve/stores/base.py"} <= expected
    assert {
        "magretrieve/server/static/index.html",
        "magretrieve/server/static/swagger/swagger-ui-bundle.js",
    } <= expected
    expected.add("magretrieve/py.typed")  # PEP 561: type checkers read the package's hints
    missing = sorted(expected - names)
    assert not missing, f"{wheel.name} lacks {missing}"
    # and nothing of the tree's tests or benchmarks leaks into the wheel
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]


def test_every_module_imports_from_the_installed_package() -> None:
    import importlib

    import magretrieve

    installed = Path(magretrieve.__file__).resolve().parent
    optional = {"torch", "transformers", "onnx", "onnxscript", "matplotlib"}
    for path in sorted(tree_modules()):
        name = path[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        if name.endswith(".__main__"):  # runs the CLI when imported
            continue
        try:
            module = importlib.import_module(name)
        except ImportError as exc:  # only a missing *optional* dependency may stop an import
            assert exc.name and exc.name.split(".")[0] in optional, f"{name}: {exc}"
            continue
        except Exception as exc:  # an integration whose extra is not installed says which
            assert "pip install 'magretrieve[" in str(exc), f"{name}: {exc}"
            continue
        origin = Path(module.__file__).resolve()
        assert origin.is_relative_to(installed) or origin.is_relative_to(REPO), origin


@pytest.mark.skipif(
    os.environ.get("MAGRETRIEVE_TEST_INSTALLED") != "1",
    reason="only scripts/test.sh installs the wheel non-editable; an editable dev install is fine",
)
def test_suite_runs_against_the_installed_wheel_not_the_checkout() -> None:
    import magretrieve
    import magretrieve.export
    import magretrieve.stores

    for module in (magretrieve, magretrieve.stores, magretrieve.export):
        origin = Path(module.__file__).resolve()
        # installed (the test venv may itself sit inside the checkout), never the source folders
        assert "site-packages" in origin.parts, origin
        assert not any(origin.is_relative_to(folder) for folder in SOURCES.values()), origin
