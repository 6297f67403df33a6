"""The recommended workflow is importable from the top, and names mean one thing."""

from __future__ import annotations

import inspect
import pkgutil
import subprocess
import sys

import pytest

import magretrieve

WORKFLOW = (
    "OnnxEncoder", "Retriever", "Hit", "open_store", "VectorStore", "StoreHit", "index_corpus",
    "index_documents", "fit_prior", "rescale_store", "export_model", "train_model",
    "EncoderConfig", "Manifest", "diagnose_model", "recommend", "DEFAULT_K",
)  # fmt: skip


def test_every_public_name_resolves() -> None:
    for name in magretrieve.__all__:
        assert getattr(magretrieve, name) is not None, name
    assert set(WORKFLOW) <= set(magretrieve.__all__)


def test_functions_and_subpackages_never_share_a_name_whatever_the_import_order() -> None:
    code = (
        "import magretrieve, magretrieve.diagnose.report, magretrieve.train.losses, types\n"
        "for package, function in (('diagnose', 'diagnose_model'), ('train', 'train_model')):\n"
        "    assert isinstance(getattr(magretrieve, package), types.ModuleType), package\n"
        "    assert not callable(getattr(magretrieve, package)), package\n"
        "    assert callable(getattr(magretrieve, function)), function\n"
        "assert magretrieve.diagnose_model is magretrieve.diagnose.diagnose\n"
        "assert magretrieve.train_model is magretrieve.train.trainer.train\n"
    )
    for first in ("", "magretrieve.diagnose_model, magretrieve.train_model\n"):
        out = subprocess.run([sys.executable, "-c", "import magretrieve\n" + first + code],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0, out.stderr


def test_pre_release_names_are_gone() -> None:
    for name in ("train", "CorpusPrior", "similarity", "adapters", "config", "testing"):
        assert name not in magretrieve.__all__
    for name in ("CorpusPrior", "adapters", "config", "testing", "similarity"):
        with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
            getattr(magretrieve, name)
    # the package's own folders (an editable install elsewhere could still resolve old paths)
    assert "adapters" not in {m.name for m in pkgutil.iter_modules(magretrieve.__path__)}


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
