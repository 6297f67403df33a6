"""The version of the package, written only here: ``pyproject.toml`` reads it at build time
(``[tool.setuptools.dynamic]``), the root package and the server at run time."""

__version__ = "0.1.0"
