"""The SQLite ledger's plain reads (`ledger.sqlite_reads` over `ledger.sqlite_queries`: every read
of a SQLite proxy, without the query toolkit) answer exactly what the toolkit's queries answer on
the same database."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import pytest
from sqlalchemy.ext.asyncio import AsyncConnection

from ledger import (
    AmbiguousReference,
    EntryNotFound,
    LedgerError,
    LedgerStore,
    LedgerUnavailable,
    deferred_queries,
    queries,
)
from ledger.db import Engines, open_engines
from ledger.deferred import upstream_task_id
from ledger.migrate import current_revision
from ledger.sqlite_connect import sqlite_path
from ledger.sqlite_reads import SQLiteReads
from ledger.states import EntryState
from ledger.views import EntryFilter
from policies.model import LedgerSettings
from tests.ledger_fixtures import claim_request

BIG = 10_000
T = TypeVar("T")


async def _a_ledger_with_every_kind_of_entry(settings: LedgerSettings) -> None:
    store = await LedgerStore.open(settings, owner="r")
    try:
        for n in range(3):
            entry = (await store.claim(claim_request(f"ok-{n}"))).entry
            state = "succeeded" if n else "failed"
            await store.finish(entry.id, entry.fencing_token, state=state, outcome=b"x")
            await asyncio.sleep(0.002)  # times are kept to the millisecond
        running = (await store.claim(claim_request("running"))).entry
        # The upstream answered this call with a task of its own: kept, but not one of ours.
        await store.deferred.note_upstream_task(running.id, "mail", "their-task-1")
        # One key in two tenants: by key alone it names two entries.
        await store.claim(claim_request("shared", tenant="globex", upstream="crm"))
        await store.claim(claim_request("shared"))
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


@contextlib.asynccontextmanager
async def _read_both_ways(
    folder: Path,
) -> AsyncIterator[tuple[SQLiteReads, AsyncConnection, Engines]]:
    """A ledger holding every kind of entry, and both ways to read it: the plain reader, and a
    connection of the toolkit's engines (with the engines)."""
    settings = LedgerSettings(url=f"sqlite:///{folder}/ledger.db")
    await _a_ledger_with_every_kind_of_entry(settings)
    plain = SQLiteReads(sqlite_path(settings.url), settings.durability)
    engines = open_engines(settings)
    try:
        async with engines.read.connect() as conn:
            yield plain, conn, engines
    finally:
        await plain.close()
        await engines.dispose()


async def test_the_plain_reads_answer_what_the_toolkit_answers(tmp_path: Path) -> None:
    """What a proxy reads all day: counts, oldest changes, deferred work's candidates within
    their per-group window, the schema's revision."""
    async with _read_both_ways(tmp_path) as (plain, conn, engines):
        counts = await queries.count_by_state(conn)
        assert counts == {
            "succeeded": 2,
            "failed": 1,
            "running": 3,
            "unknown": 1,
            "rejected": 1,
            "accepted": 7,
        }
        assert await plain.count_by_state() == counts
        for state in EntryState:
            when = await queries.oldest_change(conn, state.value)
            assert await plain.oldest_change(state.value) == when, state
        every = await deferred_queries.candidates(conn, BIG, per_group=BIG)
        two_each = await deferred_queries.candidates(conn, BIG, per_group=2)
        assert len(every) == 7
        assert len(two_each) == 6  # acme's third on mail waits behind its first two
        assert await plain.candidates(BIG, per_group=BIG) == every
        assert await plain.candidates(BIG, per_group=2) == two_each
        first_three = await deferred_queries.candidates(conn, 3, per_group=2)
        assert await plain.candidates(3, per_group=2) == first_three
        assert await plain.revision() == await current_revision(engines)
        await plain.ping()


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
        "running": 3,
        "unknown": 1,
        "accepted": 7,
        "blocked": 0,
    }


async def _both(
    plain_read: Callable[[], Awaitable[T]], toolkit_read: Callable[[], Awaitable[T]]
) -> T:
    """Both answers, or both refusals (the same error and message); the answer."""
    try:
        theirs = await toolkit_read()
    except LedgerError as refused:
        with pytest.raises(type(refused), match=re.escape(str(refused))):
            await plain_read()
        raise
    assert await plain_read() == theirs
    return theirs


async def test_an_operators_and_a_clients_reads_answer_what_the_toolkit_answers(
    tmp_path: Path,
) -> None:
    """Entries by id, key and prefix with their history, filtered lists, counts by upstream,
    and tasks by id and page."""
    async with _read_both_ways(tmp_path) as (plain, conn, _):
        newest = await queries.list_entries(conn, limit=BIG)
        assert len(newest) == 15
        for row in newest[:4] + newest[-4:]:
            for reference in (row.id, row.id[:-3], row.idempotency_key):
                if reference == "shared":
                    continue
                found = await _both(
                    lambda r=reference: plain.find_entry(r),
                    lambda r=reference: queries.find_entry(conn, r),
                )
                assert found.id == row.id
            entry, history = await plain.entry(row.id)
            assert (entry, history) == (row, await queries.history(conn, row.id))
            assert history, "every entry has at least its first transition"
        for reference in ("shared", newest[0].id[:6], "nothing-has-this-key"):
            with pytest.raises((AmbiguousReference, EntryNotFound)):
                await _both(
                    lambda r=reference: plain.find_entry(r),
                    lambda r=reference: queries.find_entry(conn, r),
                )
        middle = newest[len(newest) // 2].created_at
        for states, upstream, tenant, since in (
            ([], None, None, None),
            (["running", "unknown"], None, None, None),
            ([], "crm", None, None),
            ([], "mail", "acme", None),
            ([], None, None, middle),
            (["accepted"], None, "acme", middle),
        ):
            for limit in (3, BIG):
                theirs = await queries.list_entries(
                    conn,
                    states=states,
                    upstream=upstream,
                    tenant=tenant,
                    since=since,
                    limit=limit,
                )
                assert theirs
                wanted = EntryFilter(tuple(states), upstream, tenant, since, limit)
                ours = await plain.list_entries(wanted)
                assert ours == theirs, (states, upstream, tenant, since, limit)
        assert await plain.stats() == await queries.stats(conn)
        tasks = [row for row in newest if row.task_id and not row.task_id.startswith("up:")]
        assert len(tasks) == 7  # the proxy's own: the upstream's task is not listed
        for row in tasks[:2]:
            assert row.task_id is not None
            owner = await deferred_queries.task_owner(conn, row.task_id)
            assert owner == row.tenant
            assert await plain.task_owner(row.task_id) == owner
            found_task = await deferred_queries.find_task(conn, row.task_id, row.tenant)
            assert found_task == row
            assert await plain.find_task(row.task_id, row.tenant) == row
            assert await plain.find_task(row.task_id, "someone-else") is None
        assert await plain.task_owner("no-such-task") is None
        theirs_id = upstream_task_id("mail", "their-task-1")
        assert await plain.task_owner(theirs_id) == "acme"
        assert await deferred_queries.task_owner(conn, theirs_id) == "acme"
        cursor = (tasks[1].created_at, tasks[1].id)  # the newer of globex's two
        for tenant, upstream, before in (
            ("acme", None, None),
            ("acme", "crm", None),
            ("acme", None, cursor),
            ("globex", "mail", cursor),
        ):
            theirs = await deferred_queries.list_tasks(
                conn, tenant, limit=BIG, before=before, upstream=upstream
            )
            assert theirs, (tenant, upstream, before)
            ours = await plain.list_tasks(tenant, BIG, before, upstream)
            assert ours == theirs, (tenant, upstream, before)


def _reader_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "ledger-reader"}


async def test_reads_racing_the_close_leave_no_thread_or_connection_behind(
    tmp_path: Path,
) -> None:
    """A store closing while reads are queued (a background finish still looking its entry up,
    say): the queued reads finish or are refused as closed, and no read after the close opens a
    new thread or connection; the close itself raises nothing."""
    settings = LedgerSettings(url=f"sqlite:///{tmp_path}/ledger.db")
    await _a_ledger_with_every_kind_of_entry(settings)
    before = _reader_threads()
    plain = SQLiteReads(sqlite_path(settings.url), settings.durability)
    await plain.ping()
    (mine,) = _reader_threads() - before  # the reader's one thread
    queued = [asyncio.ensure_future(plain.count_by_state()) for _ in range(20)]
    closing = asyncio.ensure_future(plain.close())
    late = asyncio.ensure_future(plain.ping())  # after the close began
    outcomes = await asyncio.gather(*queued, closing, late, return_exceptions=True)
    for outcome in outcomes:
        assert outcome is None or isinstance(outcome, (dict, LedgerUnavailable)), outcome
    assert isinstance(outcomes[-1], LedgerUnavailable)
    assert "closed" in str(outcomes[-1])
    with pytest.raises(LedgerUnavailable, match="closed"):
        await plain.count_by_state()
    assert _reader_threads() - before <= {mine}  # no late read started another
    mine.join(timeout=5)
    assert not mine.is_alive()
