"""`interlock serve` on a new ledger: the schema is migrated by a child process, so the proxy's
own memory never holds the migration tool (Alembic, about 12 MB resident for the process's life
once imported)."""

from __future__ import annotations

import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

from ledger.migrate import HEAD_REVISION, VERSION_TABLE
from tests.integration.mcp_servers import REPO_ROOT

# `interlock serve`, writing the names of the modules it has loaded to argv[1] as it exits.
_SERVE_LISTING = textwrap.dedent(
    """
    import atexit, sys
    listing = sys.argv.pop(1)
    def dump():
        with open(listing, "w") as out:
            out.write("\\n".join(sys.modules))
    atexit.register(dump)
    from proxy.ops.cli import main
    sys.exit(main())
    """
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _modules_of_a_serve(tmp_path: Path, ledger: Path) -> set[str]:
    """Start serve, wait until /readyz says the ledger is up, stop it; what it had loaded."""
    port = _free_port()
    config = tmp_path / "i.yaml"
    config.write_text(
        f'listen: "127.0.0.1:{port}"\n'
        f'ledger: {{url: "sqlite:///{ledger}"}}\n'
        'upstreams:\n  mail: {mcp: "http://127.0.0.1:9/mcp"}\n'
    )
    listing = tmp_path / "modules.txt"
    argv = [sys.executable, "-c", _SERVE_LISTING, str(listing), "serve", "--config", str(config)]
    process = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 30
        line = ""
        while time.monotonic() < deadline and "listening on" not in line:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                raise AssertionError(f"serve exited with {process.returncode}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            assert answer.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()
    return set(listing.read_text().split("\n"))


def _revision(ledger: Path) -> str:
    with sqlite3.connect(ledger) as db:
        (revision,) = db.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
    return str(revision)


def test_serve_migrates_a_new_ledger_without_loading_alembic(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    modules = _modules_of_a_serve(tmp_path, ledger)
    assert "ledger.store" in modules  # the listing is serve's own: its ledger is loaded
    assert _revision(ledger) == HEAD_REVISION
    assert sorted(m for m in modules if m.partition(".")[0] == "alembic") == []
    again = _modules_of_a_serve(tmp_path, ledger)  # a restart on the migrated ledger
    assert sorted(m for m in again if m.partition(".")[0] == "alembic") == []
