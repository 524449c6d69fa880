"""The SQLite ledger's plain reads (`ledger.sqlite_reads`: what a proxy reads all day without the
query toolkit) answer exactly what the toolkit's queries answer on the same database."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest

from ledger import LedgerStore, LedgerUnavailable, deferred_queries, queries
from ledger.db import open_engines
from ledger.migrate import current_revision
from ledger.sqlite_connect import sqlite_path
from ledger.sqlite_reads import SQLiteReads
from ledger.states import EntryState
from policies.model import LedgerSettings
from tests.ledger_fixtures import claim_request

BIG = 10_000


async def _a_ledger_with_every_kind_of_entry(settings: LedgerSettings) -> None:
    store = await LedgerStore.open(settings, owner="r")
    try:
        for n in range(3):
            entry = (await store.claim(claim_request(f"ok-{n}"))).entry
            state = "succeeded" if n else "failed"
            await store.finish(entry.id, entry.fencing_token, state=state, outcome=b"x")
            await asyncio.sleep(0.002)  # times are kept to the millisecond
        await store.claim(claim_request("running"))
        await store.record_rejection(
            claim_request("refused"), reason="overloaded", scope="global", retry_after_s=1.0
        )
        # Deferred work of two tenants on two upstreams: three, one, two and one waiting.
        for tenant, upstream, count in (
            ("acme", "mail", 3),
            ("acme", "crm", 1),
            ("globex", "mail", 2),
            ("initech", "mail", 1),
        ):
            for n in range(count):
                request = claim_request(
                    f"{tenant}-{upstream}-{n}", tenant=tenant, upstream=upstream
                )
                await store.deferred.defer(request, b"{}", max_per_tenant=BIG, max_per_upstream=BIG)
                await asyncio.sleep(0.002)
    finally:
        await store.close()
    lapsing = LedgerSettings(url=settings.url, lease_s=0.01)
    store = await LedgerStore.open(lapsing, owner="r")
    try:
        await store.claim(claim_request("swept"))
        await asyncio.sleep(0.05)
        assert await store.sweep_expired() == 1  # "swept" is unknown now; "running" still runs
    finally:
        await store.close()


async def test_the_plain_reads_answer_what_the_toolkit_answers(tmp_path: Path) -> None:
    settings = LedgerSettings(url=f"sqlite:///{tmp_path}/ledger.db")
    await _a_ledger_with_every_kind_of_entry(settings)
    plain = SQLiteReads(sqlite_path(settings.url), settings.durability)
    engines = open_engines(settings)
    try:
        async with engines.read.connect() as conn:
            counts = await queries.count_by_state(conn)
            oldest = {s.value: await queries.oldest_change(conn, s.value) for s in EntryState}
            every = await deferred_queries.candidates(conn, BIG, per_group=BIG)
            two_each = await deferred_queries.candidates(conn, BIG, per_group=2)
            first_three = await deferred_queries.candidates(conn, 3, per_group=2)
        assert counts == {
            "succeeded": 2,
            "failed": 1,
            "running": 1,
            "unknown": 1,
            "rejected": 1,
            "accepted": 7,
        }
        assert len(every) == 7
        assert len(two_each) == 6  # acme's third on mail waits behind its first two
        assert await plain.count_by_state() == counts
        for state, when in oldest.items():
            assert await plain.oldest_change(state) == when, state
        assert await plain.candidates(BIG, per_group=BIG) == every
        assert await plain.candidates(BIG, per_group=2) == two_each
        assert await plain.candidates(3, per_group=2) == first_three
        assert await plain.revision() == await current_revision(engines)
        await plain.ping()
    finally:
        await plain.close()
        await engines.dispose()


async def test_a_plain_read_of_a_ledger_that_cannot_be_read_is_unavailable(
    tmp_path: Path,
) -> None:
    """Neither file nor folder: a clear `LedgerUnavailable`, and the next read tries again."""
    plain = SQLiteReads(tmp_path / "missing" / "ledger.db", "full")
    try:
        for _ in range(2):
            with pytest.raises(LedgerUnavailable, match="ledger ping failed: unable to open"):
                await plain.ping()
        (tmp_path / "missing").mkdir()
        assert await plain.revision() is None  # a new, empty database: never migrated
    finally:
        await plain.close()


async def test_an_entry_purged_by_the_plain_statements_is_one_the_toolkit_would_purge(
    tmp_path: Path,
) -> None:
    """Only closed entries older than the age, at most the limit per batch."""
    settings = LedgerSettings(url=f"sqlite:///{tmp_path}/ledger.db")
    await _a_ledger_with_every_kind_of_entry(settings)
    store = await LedgerStore.open(settings, owner="r")
    try:
        assert await store.purge(older_than=timedelta(hours=1)) == 0  # none that old
        assert await store.purge(older_than=timedelta(0), batch_size=2) == 4
        counts = await store.count_by_state()
    finally:
        await store.close()
    assert counts == {
        "succeeded": 0,
        "failed": 0,
        "rejected": 0,
        "running": 1,
        "unknown": 1,
        "accepted": 7,
        "blocked": 0,
    }
