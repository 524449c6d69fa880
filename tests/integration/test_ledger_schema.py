"""Schema, migrations and failure handling of the ledger database, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import make_url

from ledger import EntryState, LedgerStore, LedgerUnavailable, migrate_ledger, sqlite_connect
from ledger.db import open_engines
from ledger.migrate import VERSION_TABLE, head_revision
from ledger.tables import metadata
from policies.model import LedgerSettings
from tests import ledger_fixtures
from tests.ledger_fixtures import FakeClock, LedgerBackend, claim_request

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url
ledger_settings = ledger_fixtures.ledger_settings
ledger_store = ledger_fixtures.ledger_store


def _differences(connection: sa.Connection) -> list[object]:
    context = MigrationContext.configure(
        connection, opts={"version_table": VERSION_TABLE, "compare_type": True}
    )
    return list(compare_metadata(context, metadata))


async def test_migrations_build_exactly_the_models(ledger_settings: LedgerSettings) -> None:
    """After `migrate`, the database schema equals the SQLModel tables (Alembic finds no diff)."""
    assert await migrate_ledger(ledger_settings) == (None, head_revision())
    engines = open_engines(ledger_settings)
    try:
        async with engines.read.connect() as conn:
            assert await conn.run_sync(_differences) == []
    finally:
        await engines.dispose()


async def test_unique_key_scope_is_enforced_by_the_database(
    ledger_settings: LedgerSettings,
) -> None:
    """Two rows with one (key, tenant, upstream) are refused by the database itself."""
    await migrate_ledger(ledger_settings)
    engines = open_engines(ledger_settings)
    row = {
        "tenant": "acme", "upstream": "mail", "tool": "send", "idempotency_key": "k",
        "key_source": "explicit", "fingerprint": "a" * 64, "state": "running", "attempt": 1,
        "fencing_token": 1, "work_class": "interactive", "outcome_retained": True,
        "created_at": FakeClock()(), "updated_at": FakeClock()(),
    }  # fmt: skip
    table = metadata.tables["ledger_entries"]
    try:
        async with engines.write.begin() as conn:
            await conn.execute(sa.insert(table), [{**row, "id": "1" * 32}])
        with pytest.raises(sa.exc.IntegrityError):
            async with engines.write.begin() as conn:
                await conn.execute(sa.insert(table), [{**row, "id": "2" * 32}])
    finally:
        await engines.dispose()


async def test_store_without_migrate_refuses_an_unmigrated_database(
    ledger_settings: LedgerSettings, ledger_backend: LedgerBackend
) -> None:
    """`migrate=False` on an empty database names the fix instead of creating tables."""
    if ledger_backend.name == "sqlite":
        sqlite3.connect(ledger_settings.url.removeprefix("sqlite:///")).close()
    with pytest.raises(LedgerUnavailable, match="interlock ledger migrate"):
        await LedgerStore.open(ledger_settings, owner="r", migrate=False)


async def test_replicas_starting_together_migrate_once(ledger_settings: LedgerSettings) -> None:
    """Several stores opening an empty database at once all succeed on one schema."""
    stores = await asyncio.gather(
        *(LedgerStore.open(ledger_settings, owner=f"r{i}") for i in range(3))
    )
    try:
        results = await asyncio.gather(*(s.claim(claim_request("k")) for s in stores))
        assert sorted(r.kind for r in results) == ["in_progress", "in_progress", "new"]
    finally:
        for store in stores:
            await store.close()


async def test_refused_connection_is_ledger_unavailable() -> None:
    """A database that refuses connections raises LedgerUnavailable from open()."""
    settings = LedgerSettings(url="postgresql://postgres@127.0.0.1:9/nothing")
    with pytest.raises(LedgerUnavailable, match="ledger"):
        await LedgerStore.open(settings, owner="r")


@pytest.fixture
def short_busy_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """SQLite gives up on a lock after 100 ms instead of 5 s (keeps the test quick)."""
    monkeypatch.setattr(sqlite_connect, "BUSY_TIMEOUT_MS", 100)


@contextlib.asynccontextmanager
async def _database_failure(
    backend: LedgerBackend, settings: LedgerSettings
) -> AsyncIterator[None]:
    """SQLite: another process holds the write lock. PostgreSQL: the database stops accepting
    connections and the server drops every connection to it (the store's writer included)."""
    if backend.name == "sqlite":
        blocker = sqlite3.connect(settings.url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            yield
            blocker.execute("ROLLBACK")
        finally:
            blocker.close()
        return
    name = make_url(settings.url).database
    server = ledger_fixtures.pg_admin_dsn()
    await ledger_fixtures.pg_execute(
        server,
        f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false',
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        f"WHERE datname = '{name}' AND pid <> pg_backend_pid()",
    )
    try:
        yield
    finally:
        await ledger_fixtures.pg_execute(server, f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')


async def test_database_failure_fails_closed_then_recovers(
    short_busy_timeout: None,
    ledger_backend: LedgerBackend,
    ledger_store: LedgerStore,
    ledger_settings: LedgerSettings,
) -> None:
    """A database that cannot be written refuses the claim with LedgerUnavailable and records
    nothing; once it is back, the same store writes again."""
    await ledger_store.claim(claim_request("before"))
    async with _database_failure(ledger_backend, ledger_settings):
        with pytest.raises(LedgerUnavailable):
            await ledger_store.claim(claim_request("during"))
    result = await ledger_store.claim(claim_request("after"))
    assert (result.kind, result.entry.attempt) == ("new", 1)
    keys = {e.idempotency_key for e in await ledger_store.list_entries()}
    assert keys == {"before", "after"}


async def test_two_sweepers_mark_each_expired_lease_once(ledger_url: str) -> None:
    """Two replicas sweeping the same expired leases at once mark each entry unknown once."""
    clock = FakeClock()
    settings = LedgerSettings(url=ledger_url, lease_s=1)
    stores = [await LedgerStore.open(settings, owner=f"r{i}", clock=clock) for i in range(2)]
    try:
        claims = await asyncio.gather(*(stores[0].claim(claim_request(f"k{i}")) for i in range(40)))
        clock.advance(2)
        counts = await asyncio.gather(*(s.sweep_expired(limit=25) for s in stores * 2))
        assert sum(counts) == 40
        for claim in claims:
            entry, history = await stores[1].get(claim.entry.id)
            assert entry.state == EntryState.UNKNOWN
            assert [h.reason for h in history].count("lease_expired") == 1
    finally:
        for store in stores:
            await store.close()
