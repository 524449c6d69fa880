"""`interlock serve` on a new ledger: the schema is migrated by a child process, so the proxy's
own memory never holds the migration tool (Alembic, about 12 MB resident for the process's life
once imported)."""

from __future__ import annotations

import signal
import sqlite3
import urllib.request
from pathlib import Path

from bench.bench_idle import SERVE_LISTING
from ledger.migrate import HEAD_REVISION, VERSION_TABLE
from tests.acceptance.test_proxy_crash import _free_port, proxy_process, write_config


def _modules_of_a_serve(folder: Path) -> set[str]:
    """Start serve on `folder`'s ledger, wait until /readyz says the ledger is up, stop it
    (SIGTERM); the modules it had loaded."""
    port = _free_port()
    config = write_config(folder, port, '  mail: {mcp: "http://127.0.0.1:9/mcp"}\n')
    listing = folder / "modules.txt"
    with proxy_process(config, ("-c", SERVE_LISTING, str(listing))) as process:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            assert answer.status == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    return set(listing.read_text().split("\n"))


def _revision(ledger: Path) -> str:
    with sqlite3.connect(ledger) as db:
        (revision,) = db.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
    return str(revision)


def test_serve_migrates_a_new_ledger_without_loading_alembic(tmp_path: Path) -> None:
    modules = _modules_of_a_serve(tmp_path)
    assert "ledger.store" in modules  # the listing is serve's own: its ledger is loaded
    assert _revision(tmp_path / "ledger.db") == HEAD_REVISION
    assert sorted(m for m in modules if m.partition(".")[0] == "alembic") == []
    again = _modules_of_a_serve(tmp_path)  # a restart on the migrated ledger
    assert sorted(m for m in again if m.partition(".")[0] == "alembic") == []
