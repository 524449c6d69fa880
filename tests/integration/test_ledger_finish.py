"""A finish that cannot be written at once (issue 10, case 8), end to end through the proxy: the
caller is answered without waiting for the ledger, and the outcome lands once the ledger is back
— the entry ends `succeeded`, never `unknown`. SQLite: another process holds the write lock past
the busy timeout. PostgreSQL: the database stops taking connections and the server kills the
proxy's (pg_terminate_backend) between the claim and the finish."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from sqlalchemy.engine import make_url

from ledger import EntryState, sqlite_connect
from tests import ledger_fixtures
from tests.integration import fake_provider
from tests.integration.fake_provider import FakeProvider
from tests.integration.proxy_harness import RunningProxy, running_proxy
from tests.integration.waiting import wait_until
from tests.ledger_fixtures import LedgerBackend, sqlite_write_lock_in_another_process

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url
provider = fake_provider.provider

BOUNDED_S = 30.0
ACTIONS = "/http/fake/v1/actions"


@contextlib.asynccontextmanager
async def ledger_cannot_be_written(
    backend: LedgerBackend, url: str
) -> AsyncIterator[Callable[[], Any]]:
    """The ledger refuses writes until the yielded `restore()` is awaited (or the block ends)."""
    if backend.name == "sqlite":
        async with sqlite_write_lock_in_another_process(url) as release:

            async def restore_sqlite() -> None:
                release()

            yield restore_sqlite
        return
    name = make_url(url).database
    server = ledger_fixtures.pg_admin_dsn()
    await ledger_fixtures.pg_execute(server, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
    await ledger_fixtures.pg_terminate_backends(url)
    restored = False

    async def restore_pg() -> None:
        nonlocal restored
        if not restored:
            restored = True
            await ledger_fixtures.pg_execute(
                server, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'
            )

    try:
        yield restore_pg
    finally:
        await restore_pg()


async def test_a_finish_that_fails_then_lands(
    ledger_backend: LedgerBackend,
    ledger_url: str,
    provider: FakeProvider,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The upstream acts and answers while the ledger cannot be written: the caller gets the
    upstream's 201 while the ledger is still down, the proxy logs that the entry's outcome is
    not recorded yet; once the ledger is back, the entry is `succeeded` with the outcome (not
    `unknown` after its lease), and the upstream ran once."""
    monkeypatch.setattr(sqlite_connect, "BUSY_TIMEOUT_MS", 200)
    config = f"""
        ledger: {{url: "{ledger_url}", lease_s: 20}}
        defaults: {{timeout_s: 20, deadline_s: 30}}
        upstreams:
          fake: {{http: "{provider.url}"}}
        """
    provider.action_gate = asyncio.Event()
    async with (
        running_proxy(config, tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        headers = {"Idempotency-Key": "lands-later"}
        post = asyncio.create_task(
            http.post(f"{proxy.base}{ACTIONS}", json={"amount": 5}, headers=headers)
        )
        await wait_until(lambda: provider.executions["lands-later"] == 1, BOUNDED_S)
        async with ledger_cannot_be_written(ledger_backend, ledger_url) as restore:
            provider.action_gate.set()
            response = await asyncio.wait_for(post, BOUNDED_S)
            body = await asyncio.wait_for(response.read(), BOUNDED_S)
            assert response.status == 201, body
            if ledger_backend.name == "sqlite":  # readers still read; the writer is locked out
                entry, _ = await proxy.store.get("lands-later")
                assert entry.state == EntryState.RUNNING
            # Down for longer than one write's patience (busy timeout, connection retries):
            await wait_until(lambda: "outcome not recorded yet" in caplog.text, BOUNDED_S)
            await restore()
        entry = await _settled(proxy, "lands-later")
    assert entry.state == EntryState.SUCCEEDED
    assert entry.outcome is not None
    stored = json.loads(entry.outcome)
    assert (stored["status"], base64.b64decode(stored["body"])) == (201, body)
    assert provider.executions["lands-later"] == 1
    assert f"entry {entry.id}: outcome not recorded yet" in caplog.text


async def _settled(proxy: RunningProxy, key: str) -> Any:
    """The entry once it has left `running` (bounded)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUNDED_S
    while True:
        with contextlib.suppress(Exception):
            entry, _ = await proxy.store.get(key)
            if entry.state != EntryState.RUNNING:
                return entry
        assert loop.time() < deadline, "the entry never left running"
        await asyncio.sleep(0.05)
