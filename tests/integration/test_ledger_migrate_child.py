"""A ledger whose schema is behind is migrated by a child process (`migrate_out_of_process`), so
the process that serves never loads Alembic (about 12 MB it would hold for its whole life). When
the child cannot do it, the caller is told so and migrates in-process as before. Each test runs
on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from ledger import LedgerStore
from ledger.db import open_engines
from ledger.migrate import HEAD_REVISION, current_revision, migrate_ledger, migrate_out_of_process
from policies.model import LedgerSettings
from tests import ledger_fixtures

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url
ledger_settings = ledger_fixtures.ledger_settings


async def _revision(settings: LedgerSettings) -> str | None:
    engines = open_engines(settings)
    try:
        return await current_revision(engines)
    finally:
        await engines.dispose()


async def test_a_new_ledger_is_migrated_by_a_child_process(
    ledger_settings: LedgerSettings,
) -> None:
    assert await _revision(ledger_settings) is None
    assert await migrate_out_of_process(ledger_settings) is True
    assert await _revision(ledger_settings) == HEAD_REVISION
    store = await LedgerStore.open(ledger_settings, owner="r", migrate=False)  # usable as is
    await store.close()


async def test_a_current_ledger_needs_no_child(
    ledger_settings: LedgerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    await migrate_ledger(ledger_settings)
    monkeypatch.setattr("ledger.migrate.sys.executable", "/bin/false")  # a child would fail
    assert await migrate_out_of_process(ledger_settings) is True


async def test_a_child_that_fails_leaves_the_migration_to_the_caller(
    ledger_settings: LedgerSettings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("ledger.migrate.sys.executable", "/bin/false")
    assert await migrate_out_of_process(ledger_settings) is False
    assert "migrating in this process" in caplog.text
    assert await _revision(ledger_settings) is None
    store = await LedgerStore.open(ledger_settings, owner="r")  # as before: in-process
    await store.close()
    assert await _revision(ledger_settings) == HEAD_REVISION


@ledger_fixtures.only_sqlite
async def test_a_child_that_cannot_start_leaves_the_migration_to_the_caller(
    ledger_settings: LedgerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ledger.migrate.sys.executable", "/nonexistent/python")
    assert await migrate_out_of_process(ledger_settings) is False
    assert await _revision(ledger_settings) is None


async def test_an_unreachable_ledger_is_left_to_the_caller() -> None:
    """The caller's own open reports it (or waits for it) as before; no child is started."""
    settings = LedgerSettings(url="postgresql://postgres@127.0.0.1:9/none")
    assert await migrate_out_of_process(settings) is False
