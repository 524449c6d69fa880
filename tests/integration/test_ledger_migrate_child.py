"""A ledger whose schema is behind is migrated by a child process (`revisions.migrate_in_child`,
what `LedgerStore.open(migrate_in_child=True)` does for `interlock serve`), so the process that
serves never loads Alembic (about 12 MB it would hold for its whole life). When the child cannot
do it, the open migrates in-process as before. Each test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from ledger import LedgerStore, LedgerUnavailable
from ledger.db import Engines, open_engines
from ledger.migrate import HEAD_REVISION, current_revision, migrate_ledger
from ledger.revisions import migrate_in_child
from policies.model import LedgerSettings
from tests import ledger_fixtures

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url
ledger_settings = ledger_fixtures.ledger_settings


@contextlib.asynccontextmanager
async def _engines(settings: LedgerSettings) -> AsyncIterator[Engines]:
    engines = open_engines(settings)
    try:
        yield engines
    finally:
        await engines.dispose()


async def _revision(settings: LedgerSettings) -> str | None:
    async with _engines(settings) as engines:
        return await current_revision(engines)


async def test_a_new_ledger_is_migrated_by_a_child_process(
    ledger_settings: LedgerSettings,
) -> None:
    assert await _revision(ledger_settings) is None
    assert await migrate_in_child(ledger_settings) is True
    assert await _revision(ledger_settings) == HEAD_REVISION
    store = await LedgerStore.open(ledger_settings, owner="r", migrate=False)  # usable as is
    await store.close()


async def test_a_current_ledger_needs_no_child(
    ledger_settings: LedgerSettings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await migrate_ledger(ledger_settings)
    monkeypatch.setattr("ledger.migrate.sys.executable", "/bin/false")  # a child would fail
    store = await LedgerStore.open(ledger_settings, owner="r", migrate_in_child=True)
    await store.close()
    assert "child process" not in caplog.text  # none was started


async def test_a_child_that_fails_leaves_the_migration_to_the_open(
    ledger_settings: LedgerSettings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("ledger.migrate.sys.executable", "/bin/false")
    assert await migrate_in_child(ledger_settings) is False
    assert "migrating in this process" in caplog.text
    assert await _revision(ledger_settings) is None
    store = await LedgerStore.open(ledger_settings, owner="r", migrate_in_child=True)
    await store.close()  # the open migrated in-process, as it would have
    assert await _revision(ledger_settings) == HEAD_REVISION


@ledger_fixtures.only_sqlite
async def test_a_child_that_cannot_start_leaves_the_migration_to_the_open(
    ledger_settings: LedgerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ledger.migrate.sys.executable", "/nonexistent/python")
    assert await migrate_in_child(ledger_settings) is False
    assert await _revision(ledger_settings) is None


async def test_an_unreachable_ledger_fails_the_open_once_without_a_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The open reports it (the proxy then retries it later, failing closed meanwhile); the
    database was tried once, not once for the child's check and again for the open."""
    monkeypatch.setattr("ledger.migrate.sys.executable", "/bin/false")  # no child either
    attempts = 0

    async def hang_up(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal attempts
        attempts += 1
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        settings = LedgerSettings(url=f"postgresql://postgres@127.0.0.1:{port}/none")
        with pytest.raises(LedgerUnavailable):
            await LedgerStore.open(settings, owner="r", migrate_in_child=True)
    finally:
        server.close()
        await server.wait_closed()
    assert attempts == 1


@ledger_fixtures.only_sqlite
async def test_opening_a_current_ledger_for_serve_takes_no_write_lock(
    ledger_settings: LedgerSettings,
) -> None:
    """The check that found the schema current is the open's only look at it: no second read
    under the write lock. So `serve` starts while another process holds that lock (a purge, an
    operator's command) instead of waiting for it, up to the busy timeout on every retry."""
    await migrate_ledger(ledger_settings)
    async with ledger_fixtures.sqlite_write_lock_in_another_process(ledger_settings.url) as release:
        try:
            opening = LedgerStore.open(ledger_settings, owner="r", migrate_in_child=True)
            store = await asyncio.wait_for(opening, 4.0)  # below the 5 s busy timeout
            await store.close()
        finally:
            release()
