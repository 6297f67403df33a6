"""Without the server extra, `magretrieve serve` and the server layer refuse in one line."""

from __future__ import annotations

import subprocess
import sys

BLOCK_FASTAPI = (
    "import sys; sys.modules['fastapi'] = None; sys.argv = ['magretrieve', *sys.argv[1:]]; "
    "from magretrieve.cli import main; main()"
)


def test_serve_without_the_server_extra_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_FASTAPI, "serve", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == ["Error: magretrieve serve needs fastapi: pip install 'magretrieve[server]'"]
    assert "Traceback" not in proc.stderr


def test_other_commands_work_without_the_server_extra():
    proc = subprocess.run(
        [sys.executable, "-c", BLOCK_FASTAPI, "--help"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and "serve" in proc.stdout and "index" in proc.stdout
