"""A Milvus standalone server for the store benchmarks, started and stopped by the benchmark.

The ``milvus-server`` command (the ``milvus`` package, a dev dependency) runs in its own process
group on free 127.0.0.1 ports; on exit the whole group gets SIGTERM, then SIGKILL, because the
wrapper leaves its ``milvus`` child running when only the wrapper is signalled. A small copy of
the test helper (tests/servers.py), since benchmarks import only from their own folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

#: Seconds the server may take to answer (it is ready in ~10 s on 2 cores).
READY_TIMEOUT = 120.0
PORT_NAMES = (
    "proxy-port",
    "etcd-port",
    "root-coord-port",
    "proxy-internal-port",
    "query-coord-port",
    "query-node-port",
    "index-coord-port",
    "index-node-port",
    "data-coord-port",
    "data-node-port",
)


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group of ``proc``, then SIGKILL what is left after ``grace`` s."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        proc.poll()
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _ready(url: str) -> bool:
    from pymilvus import MilvusClient

    try:
        client = MilvusClient(uri=url, timeout=2)
    except Exception:
        return False
    try:
        client.list_collections()
        return True
    except Exception:
        return False
    finally:
        client.close()


@contextlib.contextmanager
def milvus_server(data_dir: Path) -> Iterator[str]:
    """Run ``milvus-server`` with its data in ``data_dir``; yields its ``http://`` URL."""
    here = Path(sys.executable).with_name("milvus-server")
    script = str(here) if here.exists() else shutil.which("milvus-server")
    if not script:
        raise SystemExit("milvus-server is not installed: pip install 'magretrieve[dev]'")
    ports = _free_ports(len(PORT_NAMES))
    cmd = [script, "--data", str(data_dir)]
    for name, port in zip(PORT_NAMES, ports, strict=True):
        cmd += [f"--{name}", str(port)]
    url = f"http://127.0.0.1:{ports[0]}"
    data_dir.mkdir(parents=True, exist_ok=True)
    log = data_dir.parent / "milvus-server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while not _ready(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
                raise RuntimeError(f"milvus-server did not come up ({proc.returncode}):\n{tail}")
            time.sleep(0.5)
        yield url
    finally:
        _stop_group(proc)
