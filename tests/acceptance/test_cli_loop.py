"""`interlock serve` on uvloop (the default where installed) or the standard asyncio loop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.integration.mcp_servers import REPO_ROOT


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[str, int]:
    """Start `serve`, read its listening line, answer one /healthz, stop it with SIGTERM."""
    port = _free_port()
    config = tmp_path / "i.yaml"
    config.write_text(
        f'listen: "127.0.0.1:{port}"\n'
        'ledger: {url: "sqlite:///ledger.db"}\n'
        'upstreams:\n  mail: {mcp: "http://127.0.0.1:9/mcp"}\n'
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--config", str(config), *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "INTERLOCK_LOG_LEVEL": "WARNING", **(env or {})},
    )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline and "listening on" not in line:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                raise AssertionError(f"serve exited with {process.returncode}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            status = answer.status
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
        return line, status
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()


def test_serve_runs_on_uvloop_by_default(tmp_path: Path) -> None:
    """Without a choice, serve runs on uvloop (installed with Interlock) and says so."""
    pytest.importorskip("uvloop")
    line, status = _serve(tmp_path)
    assert "(uvloop event loop)" in line
    assert status == 200


def test_serve_runs_on_the_standard_loop_when_asked(tmp_path: Path) -> None:
    """`--loop asyncio` (or INTERLOCK_LOOP=asyncio) runs the proxy on the standard loop."""
    line, status = _serve(tmp_path, "--loop", "asyncio")
    assert "(asyncio event loop)" in line
    assert status == 200
    line, status = _serve(tmp_path, env={"INTERLOCK_LOOP": "asyncio"})
    assert "(asyncio event loop)" in line
    assert status == 200


def test_an_unknown_loop_is_refused_before_listening(tmp_path: Path) -> None:
    """An unknown INTERLOCK_LOOP exits 2 with a message naming the choices, no traceback."""
    config = tmp_path / "i.yaml"
    config.write_text('upstreams:\n  mail: {mcp: "http://127.0.0.1:9/mcp"}\n')
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--config", str(config)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "INTERLOCK_LOOP": "tokio"},
    )
    assert done.returncode == 2
    assert "unknown event loop 'tokio'" in done.stderr
    assert "Traceback" not in done.stderr
