"""The ledger under faults (DESIGN.md "Edges — The ledger under faults"), on SQLite and PostgreSQL:
one bad write fails only itself, transient errors are retried, the writer's death fails fast,
lease times come from the database's clock, and retention purges in small batches."""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import sqlalchemy as sa

from ledger import (
    ClaimResult,
    EntryState,
    EntryView,
    LedgerStore,
    LedgerUnavailable,
    StaleToken,
    pg_sql,
    sqlite_connect,
    sqlite_sql,
)
from ledger import store as store_module
from ledger.db import open_engines
from policies.model import LedgerSettings
from tests import ledger_fixtures
from tests.integration.waiting import wait_until
from tests.ledger_fixtures import (
    claim_request,
    only_postgres,
    only_sqlite,
    pg_terminate_backends,
    sqlite_write_lock_in_another_process,
)

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url
ledger_settings = ledger_fixtures.ledger_settings
ledger_store = ledger_fixtures.ledger_store

_DEADLINE_S = 30
# Values that some database refuses to store. The contract validates them away at the edge; the
# ledger must still survive one that gets through, whatever the backend does with it.
POISONS: dict[str, dict[str, Any]] = {
    "lone surrogate in the key": {"key": "order-\ud800"},
    "NUL in the run id": {"run_id": "run\x00one"},
    # Random, so that PostgreSQL cannot compress the index row under its 2704-byte limit.
    "tenant over PostgreSQL's index row limit": {"tenant": secrets.token_hex(1400)},
}


@pytest.mark.parametrize("poison", list(POISONS))
async def test_poisoned_batch_fails_only_the_poisoned_operation(
    ledger_store: LedgerStore, poison: str
) -> None:
    """One claim with a value the database refuses, group-committed with twenty other claims
    and finishes: every other claim and finish commits; the poisoned one alone may fail."""
    running = [await ledger_store.claim(claim_request(f"running-{i}")) for i in range(10)]
    fields = dict(POISONS[poison])
    key = fields.pop("key", "poisoned")
    poisoned = claim_request(key, **fields)
    finishes = [
        ledger_store.finish(c.entry.id, c.entry.fencing_token, state="succeeded", outcome=b"ok")
        for c in running
    ]
    claims = [ledger_store.claim(claim_request(f"fresh-{i}")) for i in range(10)]
    before = ledger_store.writer_stats.batches
    results = await asyncio.gather(
        *finishes[:5],
        *claims[:5],
        ledger_store.claim(poisoned),
        *finishes[5:],
        *claims[5:],
        return_exceptions=True,
    )
    poisoned_result = results.pop(10)
    assert ledger_store.writer_stats.batches > before
    assert [r.state for r in results[:5] + results[10:15]] == [EntryState.SUCCEEDED] * 10  # type: ignore[union-attr]
    assert [r.kind for r in results[5:10] + results[15:]] == ["new"] * 10  # type: ignore[union-attr]
    if isinstance(poisoned_result, BaseException):
        assert isinstance(poisoned_result, LedgerUnavailable), repr(poisoned_result)
    states = {e.idempotency_key: e.state for e in await ledger_store.list_entries(limit=100)}
    assert [states[f"running-{i}"] for i in range(10)] == [EntryState.SUCCEEDED] * 10
    assert [states[f"fresh-{i}"] for i in range(10)] == [EntryState.RUNNING] * 10


async def test_one_poison_fails_alone_in_a_batch_of_many(ledger_store: LedgerStore) -> None:
    """A lone surrogate refused by both backends, in a batch of a hundred claims: exactly that
    claim fails, with LedgerUnavailable; the ninety-nine others are new and committed."""
    keys = [f"k{i}" for i in range(100)]
    keys[37] = "bad-\udc80"
    results = await asyncio.gather(
        *(ledger_store.claim(claim_request(k)) for k in keys), return_exceptions=True
    )
    failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
    assert failed == [37]
    assert isinstance(results[37], LedgerUnavailable)
    assert len(await ledger_store.list_entries(limit=200)) == 99


async def test_a_rollback_that_never_ran_does_not_poison_the_next_batches(
    ledger_store: LedgerStore, ledger_settings: LedgerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refused batch whose ROLLBACK never reached the database leaves the writer's connection
    mid-transaction: the next batch starts clean instead of failing on that transaction."""
    on_sqlite = ledger_settings.url.startswith("sqlite")

    def skipped(_conn: object) -> None:
        return None

    async def skipped_async(_conn: object) -> None:
        return None

    if on_sqlite:
        monkeypatch.setattr(sqlite_sql, "rollback", skipped)
        poisoned = claim_request("bad-\udc80")
    else:
        monkeypatch.setattr(pg_sql, "rollback", skipped_async)
        poisoned = claim_request("poisoned", tenant=secrets.token_hex(1400))
    with pytest.raises(LedgerUnavailable):
        await ledger_store.claim(poisoned)
    monkeypatch.undo()
    after = await asyncio.wait_for(ledger_store.claim(claim_request("after")), _DEADLINE_S)
    assert after.kind == "new"
    assert [e.idempotency_key for e in await ledger_store.list_entries()] == ["after"]


@only_postgres
@pytest.mark.parametrize("batched_with", ["renew of an earlier row", "lease sweep"])
async def test_a_finish_that_waited_for_its_row_past_its_lease_is_decided_after_the_wait(
    ledger_settings: LedgerSettings, batched_with: str
) -> None:
    """PostgreSQL: another session holds a running entry's row lock while its lease (2 s) lapses.
    Its owner's finish, queued meanwhile, is decided when it gets the lock, so with a time read
    after that wait: the lease has lapsed, the entry is `unknown` and the finish is refused
    (DESIGN: an expired lease becomes unknown, never succeeded). Both ways a batch reads: the
    plain path, with an earlier row (locked at once) in the same read, and the full path, which
    a lease sweep in the batch takes."""
    store = await LedgerStore.open(
        LedgerSettings(url=ledger_settings.url, lease_s=2.0), owner="owner"
    )
    try:
        earlier = (await store.claim(claim_request("earlier"))).entry
        waited = (await store.claim(claim_request("waited"))).entry
        assert earlier.id < waited.id
        holder = await asyncpg.connect(ledger_fixtures.pg_dsn(ledger_settings.url), timeout=5)
        try:
            await holder.execute("BEGIN")
            await holder.execute("SELECT 1 FROM ledger_entries WHERE id = $1 FOR UPDATE", waited.id)
            await asyncio.sleep(1.0)
            other = (
                store.renew(earlier.id, earlier.fencing_token)
                if batched_with.startswith("renew")
                else store.sweep_expired()
            )
            finish = store.finish(
                waited.id, waited.fencing_token, state="succeeded", outcome=b"late"
            )
            both = asyncio.gather(finish, other, return_exceptions=True)
            await asyncio.sleep(1.5)  # the lease lapses (at 2 s) while the batch waits
            await holder.execute("ROLLBACK")
        finally:
            await holder.close()
        finished, _ = await asyncio.wait_for(both, _DEADLINE_S)
        assert isinstance(finished, StaleToken), repr(finished)
        entry, history = await store.get(waited.id)
        assert entry.state == EntryState.UNKNOWN
        assert [t.at for t in history] == sorted(t.at for t in history)
    finally:
        await store.close()


@only_postgres
async def test_a_full_batch_locks_rows_named_by_id_and_by_key_in_one_id_order(
    ledger_settings: LedgerSettings,
) -> None:
    """PostgreSQL: a batch that also sweeps names row `late` by id and row `early` (a smaller id)
    by key. It must lock them in id order, as every batch does: waiting for `early` (held by
    another session), it has not locked `late` yet. Locking by id first and by key after, it
    held `late` while it waited, and two replicas doing so crosswise deadlocked (each broken
    only after PostgreSQL's deadlock_timeout, 1 s)."""
    store = await LedgerStore.open(LedgerSettings(url=ledger_settings.url), owner="r")
    try:
        early = (await store.claim(claim_request("early"))).entry
        late = (await store.claim(claim_request("late"))).entry
        assert early.id < late.id
        dsn = ledger_fixtures.pg_dsn(ledger_settings.url)
        holder = await asyncpg.connect(dsn, timeout=5)
        prober = await asyncpg.connect(dsn, timeout=5)
        try:
            await holder.execute("BEGIN")
            await holder.execute("SELECT 1 FROM ledger_entries WHERE id = $1 FOR UPDATE", early.id)
            batch = asyncio.gather(
                store.renew(late.id, late.fencing_token),  # `late`, by id
                store.claim(claim_request("early")),  # `early`, by key
                store.sweep_expired(),  # the full path
            )
            await asyncio.sleep(0.5)  # the batch is waiting for `early`
            await prober.execute("BEGIN")
            free = await prober.fetchval(
                "SELECT count(*) FROM (SELECT 1 FROM ledger_entries WHERE id = $1 "
                "FOR UPDATE SKIP LOCKED) AS free",
                late.id,
            )
            await prober.execute("ROLLBACK")
            await holder.execute("ROLLBACK")
            renewed, claimed, _ = await asyncio.wait_for(batch, _DEADLINE_S)
        finally:
            await prober.close()
            await holder.close()
        assert free == 1, "the batch held `late` while it waited for `early`"
        assert renewed is True
        assert claimed.kind == "in_progress"
    finally:
        await store.close()


@only_postgres
async def test_a_commit_the_database_refuses_is_never_acknowledged(
    ledger_store: LedgerStore, ledger_settings: LedgerSettings
) -> None:
    """PostgreSQL: a deferred constraint refuses one claim at COMMIT. That caller hears
    LedgerUnavailable, never "new"; the other claims of its batch commit without it."""
    engines = open_engines(ledger_settings)
    try:
        async with engines.write.begin() as conn:
            await conn.execute(
                sa.text(
                    "CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS "
                    "$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$"
                )
            )
            await conn.execute(
                sa.text(
                    "CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON ledger_entries "
                    "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
                    "WHEN (NEW.tenant = 'refused') EXECUTE FUNCTION refuse_at_commit()"
                )
            )
    finally:
        await engines.dispose()
    requests = [claim_request(f"k{i}") for i in range(6)]
    requests.insert(3, claim_request("k-refused", tenant="refused"))
    results = await asyncio.gather(
        *(ledger_store.claim(r) for r in requests), return_exceptions=True
    )
    refused = results.pop(3)
    assert isinstance(refused, LedgerUnavailable), repr(refused)
    assert "refused at commit" in str(refused)
    assert [r.kind for r in results] == ["new"] * 6  # type: ignore[union-attr]
    entries = await ledger_store.list_entries(limit=20)
    assert sorted(e.idempotency_key or "" for e in entries) == [f"k{i}" for i in range(6)]


@only_postgres
async def test_a_connection_killed_between_batches_is_retried(
    ledger_store: LedgerStore, ledger_settings: LedgerSettings
) -> None:
    """PostgreSQL kills the writer's connection between two batches (pg_terminate_backend):
    the next claim is retried on a new connection and commits; nothing is lost or doubled."""
    first = await ledger_store.claim(claim_request("before"))
    assert await pg_terminate_backends(ledger_settings.url)
    second = await ledger_store.claim(claim_request("after"))
    assert (first.kind, second.kind) == ("new", "new")
    keys = sorted(e.idempotency_key or "" for e in await ledger_store.list_entries())
    assert keys == ["after", "before"]


@only_sqlite
async def test_a_lock_held_past_the_busy_timeout_is_retried(
    ledger_settings: LedgerSettings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """SQLite: another process holds the write lock past the busy timeout (500 ms here); the
    writer retries instead of failing, and the claim commits once the lock is released."""
    monkeypatch.setattr(sqlite_connect, "BUSY_TIMEOUT_MS", 500)
    store = await LedgerStore.open(ledger_settings, owner="r")
    try:
        async with sqlite_write_lock_in_another_process(ledger_settings.url) as release:
            claim = asyncio.create_task(store.claim(claim_request("waited")))
            await wait_until(lambda: "ledger write retried" in caplog.text, timeout_s=_DEADLINE_S)
            assert not claim.done()
            release()
            result = await asyncio.wait_for(claim, _DEADLINE_S)
    finally:
        await store.close()
    assert result.kind == "new"


async def test_a_replica_whose_clock_runs_fast_sweeps_no_live_call(
    ledger_settings: LedgerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replica whose wall clock is 45 s fast sweeps, renews and claims against the database's
    clock: another replica's live call (30 s lease, just claimed) stays running."""
    settings = LedgerSettings(url=ledger_settings.url, lease_s=30)
    honest = await LedgerStore.open(settings, owner="honest")
    try:
        live = await honest.claim(claim_request("live"))
        with _wall_clock_skewed(monkeypatch, seconds=45):
            fast = await LedgerStore.open(settings, owner="fast")
            try:
                assert await fast.sweep_expired() == 0
                again = await fast.claim(claim_request("live"))
            finally:
                await fast.close()
        assert again.kind == "in_progress"
        entry, _ = await honest.get(live.entry.id)
        assert (entry.state, entry.fencing_token) == (EntryState.RUNNING, 1)
        assert await honest.renew(live.entry.id, live.entry.fencing_token)
    finally:
        await honest.close()


async def test_a_writer_that_dies_fails_waiting_writes_and_is_restarted(
    ledger_store: LedgerStore,
) -> None:
    """The writer task dies (cancelled) with a claim waiting on it: that claim fails at once with
    LedgerUnavailable instead of waiting forever, and the next claim runs on a new writer."""
    waiting = asyncio.create_task(ledger_store.claim(claim_request("waiting")))
    await asyncio.sleep(0)
    (writer,) = [t for t in asyncio.all_tasks() if t.get_name() == "ledger-group-commit"]
    writer.cancel()
    with pytest.raises(LedgerUnavailable, match="writer"):
        await asyncio.wait_for(waiting, _DEADLINE_S)
    after = await asyncio.wait_for(ledger_store.claim(claim_request("after")), _DEADLINE_S)
    assert after.kind == "new"
    assert ledger_store.writer_restarts == 1


async def test_a_write_made_as_soon_as_the_writer_died_runs_on_the_new_writer(
    ledger_store: LedgerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer dies with a batch in hand; its caller, told LedgerUnavailable, writes again at
    once (in the same step). That write starts a new writer and is committed there: the dead
    writer's clean-up, which runs a turn later, must not fail it too."""
    writer = ledger_store._writer
    run_batch = writer._run_batch
    in_hand = asyncio.Event()

    async def held_once(ops: list[Any]) -> list[object]:
        if in_hand.is_set():
            return await run_batch(ops)
        in_hand.set()
        await asyncio.Event().wait()  # until the writer is cancelled
        raise AssertionError("unreachable")

    monkeypatch.setattr(writer, "_run_batch", held_once)

    async def claim_then_retry() -> tuple[str, ClaimResult]:
        try:
            return "first", await ledger_store.claim(claim_request("first"))
        except LedgerUnavailable:
            return "retry", await ledger_store.claim(claim_request("retry"))

    caller = asyncio.create_task(claim_then_retry())
    await asyncio.wait_for(in_hand.wait(), _DEADLINE_S)
    (task,) = [t for t in asyncio.all_tasks() if t.get_name() == "ledger-group-commit"]
    task.cancel()
    which, result = await asyncio.wait_for(caller, _DEADLINE_S)
    assert (which, result.kind) == ("retry", "new")
    assert ledger_store.writer_restarts == 1
    entry, _ = await ledger_store.get(result.entry.id)
    assert entry.state == EntryState.RUNNING


async def _claimed(settings: LedgerSettings, key: str) -> tuple[LedgerStore, EntryView]:
    store = await LedgerStore.open(settings, owner="r")
    return store, (await store.claim(claim_request(key))).entry


def _finish_in_background(store: LedgerStore, claimed: EntryView) -> asyncio.Future[EntryView]:
    """Its outcome, recorded behind the call as the proxy records it (a 30 s lease to retry in)."""
    until = asyncio.get_running_loop().time() + 30
    return store.finish_in_background(
        claimed.id, claimed.fencing_token, state="succeeded", outcome=b"ok", until=until
    )


@only_sqlite
async def test_an_outcome_still_being_written_at_shutdown_lands_and_is_not_called_lost(
    ledger_settings: LedgerSettings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Shutdown stops waiting for background finishes (0.2 s here) while one's first try is
    still with the writer (another process holds the write lock for 1 s). The writer's close
    commits it: the entry ends succeeded, its caller gets the entry, and no ERROR says that
    outcome was not recorded."""
    monkeypatch.setattr(store_module, "_FINISH_DRAIN_S", 0.2)
    store, claimed = await _claimed(ledger_settings, "late")
    async with sqlite_write_lock_in_another_process(ledger_settings.url) as release:
        finishing = _finish_in_background(store, claimed)
        asyncio.get_running_loop().call_later(1.0, release)
        await asyncio.wait_for(store.close(), _DEADLINE_S)
    assert (await finishing).state == EntryState.SUCCEEDED
    assert "cancelled at shutdown" not in caplog.text
    assert "NOT recorded" not in caplog.text
    reopened = await LedgerStore.open(ledger_settings, owner="r")
    try:
        entry, _ = await reopened.get(claimed.id)
        assert entry.state == EntryState.SUCCEEDED
    finally:
        await reopened.close()


@only_sqlite
async def test_an_outcome_the_closing_writer_cannot_write_is_logged_and_never_retried_after(
    ledger_settings: LedgerSettings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The write lock is held through the whole shutdown: the finish's first try fails as the
    writer closes. It is logged at ERROR with its entry id (its lease lapses: unknown), and no
    retry outlives the closed store."""
    monkeypatch.setattr(store_module, "_FINISH_DRAIN_S", 0.2)
    monkeypatch.setattr(sqlite_connect, "BUSY_TIMEOUT_MS", 100)
    store, claimed = await _claimed(ledger_settings, "lost")
    async with sqlite_write_lock_in_another_process(ledger_settings.url) as release:
        finishing = _finish_in_background(store, claimed)
        await asyncio.wait_for(store.close(), _DEADLINE_S)
        release()
    with pytest.raises(LedgerUnavailable):  # at once: a retry would go on for the lease's 30 s
        await asyncio.wait_for(finishing, 2.0)
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("ledger-finish-")]
    assert f"entry {claimed.id}: outcome NOT recorded at shutdown" in caplog.text


@pytest.mark.parametrize(("durability", "expected"), [("full", 2), ("normal", 1)])
async def test_the_writer_connection_runs_the_configured_synchronous_level(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str, expected: int
) -> None:
    """SQLite: the group-commit writer's own connection runs `PRAGMA synchronous` FULL (2) by
    default and NORMAL (1) with `durability: normal`, read on that connection as a batch begins."""
    seen: list[int] = []
    begin = sqlite_sql.begin

    def reading_begin(conn: sqlite3.Connection) -> None:
        seen.append(conn.execute("PRAGMA synchronous").fetchone()[0])
        begin(conn)

    monkeypatch.setattr(sqlite_sql, "begin", reading_begin)
    settings = LedgerSettings(url=f"sqlite:///{tmp_path / 'l.db'}", durability=durability)  # type: ignore[arg-type]
    store = await LedgerStore.open(settings, owner="r")
    try:
        await store.claim(claim_request("k"))
    finally:
        await store.close()
    assert seen, "no batch began on the writer's connection"
    assert set(seen) == {expected}


async def test_purge_deletes_in_small_batches(ledger_store: LedgerStore) -> None:
    """Retention deletes 35 old entries ten per write transaction (four commits), each queued
    with the other writes, and keeps the open ones."""
    for i in range(35):
        claim = await ledger_store.claim(claim_request(f"old-{i}"))
        await ledger_store.finish(
            claim.entry.id, claim.entry.fencing_token, state="succeeded", outcome=b"x"
        )
    await ledger_store.claim(claim_request("open"))
    before = ledger_store.writer_stats.batches
    assert await ledger_store.purge(older_than=timedelta(0), batch_size=10) == 35
    assert ledger_store.writer_stats.batches - before == 4
    assert [e.idempotency_key for e in await ledger_store.list_entries()] == ["open"]


# ----------------------------------------------------------------------------------- helpers


class _SkewedDatetime(datetime):
    skew = timedelta(0)

    @classmethod
    def now(cls, tz: Any = None) -> Any:
        return datetime.now(tz or UTC) + cls.skew


def _wall_clock_skewed(monkeypatch: pytest.MonkeyPatch, *, seconds: float) -> Any:
    """This process's wall clock, as every `ledger` module reads it, runs `seconds` fast."""
    skewed = type("Skewed", (_SkewedDatetime,), {"skew": timedelta(seconds=seconds)})

    class _Patch:
        def __enter__(self) -> None:
            for name, module in list(sys.modules.items()):
                if name.split(".")[0] == "ledger" and getattr(module, "datetime", None) is datetime:
                    monkeypatch.setattr(module, "datetime", skewed)

        def __exit__(self, *_: object) -> None:
            monkeypatch.undo()

    return _Patch()
