"""The recommended workflow is importable from the top, and names mean one thing."""

from __future__ import annotations

import inspect
import subprocess
import sys

import magretrieve

WORKFLOW = (
    "OnnxEncoder", "Retriever", "Hit", "open_store", "VectorStore", "StoreHit", "index_corpus",
    "index_documents", "fit_prior", "CorpusPrior", "rescale_store", "export_model",
    "EncoderConfig", "Manifest", "diagnose_model", "recommend", "DEFAULT_K",
)  # fmt: skip


def test_every_public_name_resolves() -> None:
    for name in magretrieve.__all__:
        assert getattr(magretrieve, name) is not None, name
    assert set(WORKFLOW) <= set(magretrieve.__all__)


def test_diagnose_is_always_the_subpackage_whatever_the_import_order() -> None:
    code = (
        "import magretrieve, magretrieve.diagnose.report, types\n"
        "assert isinstance(magretrieve.diagnose, types.ModuleType)\n"
        "assert callable(magretrieve.diagnose_model)\n"
        "assert magretrieve.diagnose_model is magretrieve.diagnose.diagnose\n"
        "import magretrieve as m2\n"
        "assert isinstance(m2.diagnose, types.ModuleType)\n"
    )
    for first in ("", "magretrieve.diagnose_model\n"):
        out = subprocess.run([sys.executable, "-c", "import magretrieve\n" + first + code],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0, out.stderr


def test_one_default_k_for_every_search() -> None:
    from magretrieve.cli.cmd_search import search_cmd

    defaults = {
        name: inspect.signature(getattr(magretrieve.Retriever, name)).parameters["k"].default
        for name in ("search", "search_batch", "search_vectors")
    }
    assert set(defaults.values()) == {magretrieve.DEFAULT_K}
    k_option = next(p for p in search_cmd.params if p.name == "k")
    assert k_option.default == magretrieve.DEFAULT_K


def test_quickstart_example_uses_the_public_api_only() -> None:
    from pathlib import Path

    source = (Path(__file__).resolve().parents[2] / "examples" / "quickstart.py").read_text()
    imports = [
        line.strip()
        for line in source.splitlines()
        if line.strip().startswith(("from ", "import "))
    ]
    submodule = [line for line in imports if line.startswith("from magretrieve.")]
    assert not submodule, submodule
