"""A real ``magretrieve serve`` for the tests: a uvicorn process on a free 127.0.0.1 port over
an export, run with torch and transformers blocked (so the server proves itself torch-free),
plus the values and checks the server tests share."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

KEY = "test-key-7f3a"
#: Runs the CLI with torch and transformers blocked, so the server proves itself torch-free.
SERVE = (
    "import sys\n"
    "for name in ('torch', 'transformers'): sys.modules[name] = None\n"
    "from magretrieve.cli import main\n"
    "sys.exit(main())\n"
)
TEXTS = [
    "statin mortality heart risk",
    "a",
    "wing flow and boundary layer pressure at high speed",
    "ÜNÏCÖDÉ vitamin dose",
]
LONG = "the effect of statins on heart risk in patients " * 40  # > 128 tokens


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running ``magretrieve serve`` process, its URL and its key."""

    proc: subprocess.Popen
    url: str
    port: int
    key: str | None
    log: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key else {}

    def post(self, path: str, body: object) -> httpx.Response:
        return httpx.post(self.url + path, json=body, headers=self.headers, timeout=60)

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM to the server's process group; its exit code."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def start_server(export: Path, *args: str, key: str | None, log_dir: Path) -> Server:
    """``magretrieve serve EXPORT ARGS`` on a free port, returned once ``/ready`` answers 200."""
    port = free_port()
    env = dict(os.environ)
    env.pop("MAGRETRIEVE_API_KEY", None)
    if key is not None:
        env["MAGRETRIEVE_API_KEY"] = key
    env["MAGRETRIEVE_ONNX_THREADS"] = "1"
    log = log_dir / f"server-{port}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, "serve", str(export), "--port", str(port), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    server = Server(proc, f"http://127.0.0.1:{port}", port, key, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited {proc.returncode}: {server.stderr()[-3000:]}")
        try:
            if httpx.get(server.url + "/ready", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise AssertionError(f"server not ready in 120 s: {server.stderr()[-3000:]}")


def store_copy(template: Path, tmp: Path, name: str) -> Path:
    """A copy of a store folder, so a test may write to it."""
    dest = tmp / name
    shutil.copytree(template, dest)
    return dest


def assert_clean_error(resp: httpx.Response, status: int, *needles: str) -> str:
    """A JSON error of ``status`` whose message holds ``needles``, with no traceback or path."""
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    message = body["error"]["message"]
    assert body["error"]["code"] == status
    for needle in needles:
        assert needle in message, message
    assert "Traceback" not in resp.text and "/tmp" not in resp.text and ".py" not in resp.text
    return message
