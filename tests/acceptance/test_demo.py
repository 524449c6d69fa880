"""`interlock demo` (what `make demo` runs) completes every step and proves what it claims."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.mcp_servers import REPO_ROOT


@pytest.mark.slow
def test_demo_runs_every_step():
    """The guided demo exits 0, shows refusals with retry_after_s, a queued call, one execution
    for the duplicate, an unknown entry resolved through the ledger CLI, and task handles that
    survive a SIGKILL and run exactly once after the restart."""
    done = subprocess.run(
        [sys.executable, "-m", "proxy", "demo"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "refused overloaded retry_after_s=" in out
    assert "progress queued" in out
    assert "send_email ran 1 time(s)" in out
    assert "answer: code -32053, state=unknown" in out
    assert "needs_reconciliation (not sent again)" in out
    assert "--as succeeded → succeeded" in out
    assert out.count("resultType=task status=working") == 3
    assert "the ledger holds 3 accepted task(s)" in out
    assert out.count("→ completed: sent to billing@example.com") == 3
    assert "upstream's own counter per email: [1, 1, 1]" in out
    assert "What Interlock did" in out
