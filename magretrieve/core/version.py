"""The version of the package (one place; the root package and the server read it)."""

__version__ = "0.1.0"
