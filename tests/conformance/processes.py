"""The processes a conformance run needs: the reference upstream over HTTP, and `interlock serve`.

Both are real subprocesses on free 127.0.0.1 ports, waited for with a bounded deadline and ended
(SIGTERM, then SIGKILL) when the block ends. Their output goes to log files in the test's folder.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.integration.mcp_servers import REPO_ROOT

__all__ = ["interlock_serve", "reference_http", "reference_stdio_command"]


def reference_stdio_command() -> list[str]:
    """The command line of the reference upstream over stdio (run with cwd=REPO_ROOT)."""
    return [sys.executable, "-m", "tests.conformance.reference_server", "--stdio"]


def _wait_http(url: str, process: subprocess.Popen[bytes], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                answer.read()
                return
        except urllib.error.HTTPError:
            return  # any HTTP answer means it is serving
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout_s} s")
        time.sleep(0.05)


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
    process.wait(timeout=10)


@contextlib.contextmanager
def reference_http(log: Path) -> Iterator[str]:
    """Serve the reference upstream over Streamable HTTP; yields its MCP URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "tests.conformance.reference_server",
        "--fd",
        str(listener.fileno()),
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(
            command, cwd=REPO_ROOT, pass_fds=[listener.fileno()], stdout=out, stderr=out
        )
    listener.close()
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        _wait_http(url, process)
        yield url
    finally:
        _stop(process)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def interlock_serve(config_template: str, folder: Path) -> Iterator[str]:
    """Run `interlock serve` with `config_template` (`{listen}` filled in); yields its base URL."""
    port = _free_port()
    config = folder / "interlock.yaml"
    config.write_text(config_template.format(listen=f"127.0.0.1:{port}"))
    with (folder / "interlock.log").open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--config", str(config)],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=out,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{base}/healthz", process)
        yield base
    finally:
        _stop(process)
