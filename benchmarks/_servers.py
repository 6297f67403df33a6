"""Real database servers that the tests and the store benchmarks start themselves, on
127.0.0.1 and free ports (tests/support/servers.py loads this module).

Each server runs in its own process group (``start_new_session=True``) and the whole group is
stopped afterwards: the ``milvus-server`` wrapper leaves its ``milvus`` child running when only
the wrapper gets SIGTERM, so SIGTERM goes to the group, then SIGKILL to whatever is left.
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
from collections.abc import Callable, Iterator
from pathlib import Path

#: Seconds a server may take to answer (milvus-server is ready in ~6-11 s on 2 cores).
READY_TIMEOUT = 120.0


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on 127.0.0.1 right now."""
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


def _tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM the process group of ``proc``, then SIGKILL it after ``grace`` seconds."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, 0)  # anyone left in the group?
            time.sleep(0.2)
            proc.poll()
            continue
        break
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


@contextlib.contextmanager
def server_group(
    cmd: list[str], log: Path, ready: Callable[[], bool], what: str
) -> Iterator[subprocess.Popen]:
    """Run ``cmd`` in a new process group until ``ready()`` holds; stop the group on exit."""
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
        while not ready():
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} not ready after {READY_TIMEOUT:.0f} s:\n{_tail(log)}")
            time.sleep(0.5)
        yield proc
    finally:
        stop_group(proc)


def _script(name: str) -> str:
    """A console script of this interpreter's environment (else from PATH)."""
    here = Path(sys.executable).with_name(name)
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        raise RuntimeError(f"{name} is not installed: pip install 'magretrieve[dev]'")
    return found


@contextlib.contextmanager
def milvus_server(data_dir: Path) -> Iterator[str]:
    """A Milvus standalone server (the ``milvus`` package's ``milvus-server``); yields its URL.

    Every port it opens (etcd, coordinators, nodes, proxy) is a free one, so two test runs on
    one machine do not collide on Milvus' fixed defaults.
    """
    names = (
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
    ports = free_ports(len(names))
    cmd = [_script("milvus-server"), "--data", str(data_dir)]
    for name, port in zip(names, ports, strict=True):
        cmd += [f"--{name}", str(port)]
    url = f"http://127.0.0.1:{ports[0]}"

    def ready() -> bool:
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

    data_dir.mkdir(parents=True, exist_ok=True)
    with server_group(cmd, data_dir.parent / "milvus-server.log", ready, "milvus-server"):
        yield url


@contextlib.contextmanager
def chroma_server(path: Path) -> Iterator[str]:
    """A Chroma server (``chroma run``) persisting in ``path``; yields its URL."""
    port = free_ports(1)[0]
    cmd = [
        _script("chroma"),
        "run",
        "--path",
        str(path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        import urllib.request

        try:
            with urllib.request.urlopen(f"{url}/api/v2/heartbeat", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    path.mkdir(parents=True, exist_ok=True)
    with server_group(cmd, path.parent / "chroma-server.log", ready, "chroma run"):
        yield url
