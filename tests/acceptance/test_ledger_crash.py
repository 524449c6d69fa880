"""Real processes killed with SIGKILL: the ledger loses no committed claim and repeats nothing.

Both run on SQLite and PostgreSQL. The children are `tests/ledger_child.py`; the sweeper and the
operator are the real `interlock ledger` command in processes of their own.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from ledger import EntryState, LedgerStore
from ledger.db import open_engines
from ledger.queries import ENTRIES, TRANSITIONS
from policies.model import LedgerSettings
from tests import ledger_fixtures
from tests.ledger_fixtures import LedgerBackend, claim_request, spawn_ledger_child

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url
ledger_settings = ledger_fixtures.ledger_settings
ledger_store = ledger_fixtures.ledger_store

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
_DEADLINE_S = 60


async def _sigkill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGKILL)
    assert await asyncio.wait_for(proc.wait(), _DEADLINE_S) == -signal.SIGKILL


async def _interlock(*args: str) -> tuple[int, Any]:
    """Run `interlock ledger … --json` in its own process; return (status, parsed stdout)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "ledger",
        *args,
        "--json",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), _DEADLINE_S)
    assert proc.returncode is not None
    return proc.returncode, json.loads(out) if proc.returncode == 0 else err.decode()


async def test_sigkill_before_finish_then_sweep_reconcile_retry(
    ledger_store: LedgerStore, ledger_url: str
) -> None:
    """A claim whose process dies before finishing becomes unknown after its lease (swept by
    another process); the key then needs reconciliation; an operator retry runs attempt 2."""
    child = await spawn_ledger_child("claim", ledger_url, "order-77", "0.5")
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), _DEADLINE_S)
        claimed = json.loads(line)
        assert claimed["kind"] == "new"
    finally:
        await _sigkill(child)

    entry, _ = await ledger_store.get(claimed["id"])
    assert entry.state == EntryState.RUNNING  # write-ahead survived the kill

    loop = asyncio.get_running_loop()
    deadline = loop.time() + _DEADLINE_S
    swept = 0
    while swept == 0:  # the lease runs 0.5 s after the claim; poll the sweeper, bounded
        assert loop.time() < deadline, "the sweeper never marked the entry unknown"
        status, report = await _interlock("sweep", "--ledger-url", ledger_url)
        assert status == 0, report
        swept = report["swept"]

    again = await ledger_store.claim(claim_request("order-77", fingerprint="a" * 64))
    assert (again.kind, again.entry.state) == ("needs_reconciliation", EntryState.UNKNOWN)

    status, resolved = await _interlock(
        "resolve",
        "order-77",
        "--as",
        "retry",
        "--note",
        "not in outbox",
        "--ledger-url",
        ledger_url,
    )
    assert status == 0, resolved
    assert resolved["state"] == "accepted"

    retried = await ledger_store.claim(claim_request("order-77", fingerprint="a" * 64))
    assert retried.kind == "new"
    assert (retried.entry.id, retried.entry.attempt) == (claimed["id"], 2)
    assert retried.entry.idempotency_key == "order-77"
    assert retried.entry.owner == "test-replica"
    _, history = await ledger_store.get(claimed["id"])
    assert [h.to_state.value for h in history] == ["running", "unknown", "accepted", "running"]
    actors = [h.actor for h in history]
    assert actors[0].startswith("child-")
    assert actors[1] == f"sweeper:{actors[1].split(':', 1)[1]}"
    assert actors[2].startswith("operator")
    assert actors[3] == "test-replica"


async def test_sigkill_mid_group_commit_loses_no_committed_claim(
    ledger_settings: LedgerSettings, ledger_backend: LedgerBackend
) -> None:
    """A process flooding group-committed claims is killed twice; every claim it was told is
    committed is there, running, with its history row, and no entry is half written."""
    acknowledged: set[str] = set()
    for _ in range(2):
        child = await spawn_ledger_child("flood", ledger_settings.url, "32")
        try:
            assert child.stdout is not None
            seen = 0
            while seen < 300:  # acknowledged claims keep coming while batches commit
                line = await asyncio.wait_for(child.stdout.readline(), _DEADLINE_S)
                assert line, "the flooding child died by itself"
                acknowledged.add(json.loads(line)["id"])
                seen += 1
        finally:
            await _sigkill(child)
        if child.stdout is not None:  # lines written before the kill were acknowledged too
            for line in (await child.stdout.read()).splitlines():
                if line.strip().startswith(b"{") and line.strip().endswith(b"}"):
                    acknowledged.add(json.loads(line)["id"])

    engines = open_engines(ledger_settings)
    try:
        async with engines.read.connect() as conn:
            entries = {
                row.id: row
                for row in await conn.execute(
                    sa.select(ENTRIES.c.id, ENTRIES.c.state, ENTRIES.c.attempt)
                )
            }
            history = (
                await conn.execute(
                    sa.select(TRANSITIONS.c.entry_id, sa.func.count()).group_by(
                        TRANSITIONS.c.entry_id
                    )
                )
            ).all()
            if ledger_backend.name == "sqlite":
                integrity = (await conn.execute(sa.text("PRAGMA integrity_check"))).scalar()
                assert integrity == "ok"
    finally:
        await engines.dispose()
    assert acknowledged <= set(entries), "a claim acknowledged as committed was lost"
    assert {row.state for row in entries.values()} == {EntryState.RUNNING.value}
    assert {row.attempt for row in entries.values()} == {1}
    assert dict(history) == dict.fromkeys(entries, 1), "an entry without exactly one history row"
