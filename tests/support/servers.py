"""The local database servers of ``benchmarks/_servers.py``, for the test fixtures: one
launcher for the tests and the store benchmarks."""

from __future__ import annotations

from tests.support.benchmarks import benchmark_helper

_servers = benchmark_helper("_servers")
chroma_server = _servers.chroma_server
free_ports = _servers.free_ports
milvus_server = _servers.milvus_server

__all__ = ["chroma_server", "free_ports", "milvus_server"]
