"""The test suite: one folder per layer of ``magretrieve/`` (``tests/<layer>/``), plus
``tests/benchmarks/`` (smoke runs of the benchmark scripts), ``tests/package/`` (the package
as a whole: wheel, hygiene, architecture, public API, quickstart) and ``tests/support/`` (the
helpers the tests share).

A package, so files of one name may sit in two folders and the tests import their helpers as
``tests.support.…``; pytest imports it with ``--import-mode=importlib`` (pyproject.toml), which
leaves ``sys.path`` alone: the repository root never shadows the installed ``magretrieve``.
"""
