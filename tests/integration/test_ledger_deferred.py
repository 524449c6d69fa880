"""Deferred work in the ledger, on SQLite and PostgreSQL: accepted with its request and a task id,
claimed exactly once (across processes too), put back in line, finished, cancelled, bounded."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

from ledger import EntryState, LedgerStore, StaleToken
from ledger.deferred_ops import CANCELLED
from policies.model import LedgerSettings
from tests import ledger_fixtures
from tests.ledger_fixtures import claim_request, read_child_json, spawn_ledger_child

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url
ledger_settings = ledger_fixtures.ledger_settings
ledger_store = ledger_fixtures.ledger_store

REQUEST = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send"}}'
BIG = 1_000_000
_DEADLINE_S = 60


async def _defer(store: LedgerStore, key: str | None = "k", **overrides: Any) -> Any:
    return await store.deferred.defer(
        claim_request(key, **overrides), REQUEST, max_per_tenant=BIG, max_per_upstream=BIG
    )


async def test_deferred_work_is_accepted_with_its_request_and_an_unguessable_task(
    ledger_store: LedgerStore,
) -> None:
    """Deferring records an accepted entry holding the whole request under a long random task
    id, which only its own tenant can look up."""
    result = await _defer(ledger_store)
    assert result.kind == "accepted"
    entry = result.entry
    assert entry.state is EntryState.ACCEPTED
    assert entry.request == REQUEST
    assert entry.task_id is not None
    assert len(entry.task_id) >= 32
    assert entry.owner == "test-replica"
    found = await ledger_store.deferred.task(entry.task_id, "acme")
    assert found is not None
    assert found.id == entry.id
    assert await ledger_store.deferred.task(entry.task_id, "globex") is None
    other = await _defer(ledger_store, "k2")
    assert other.entry.task_id != entry.task_id
    _, history = await ledger_store.get(entry.id)
    assert [(h.from_state, h.to_state, h.reason) for h in history] == [
        (None, EntryState.ACCEPTED, "deferred")
    ]


async def test_a_claim_is_write_ahead_and_happens_once(ledger_store: LedgerStore) -> None:
    """Claiming waiting work makes it running under this replica's lease (attempt 1) before
    anything runs; a second claim of it gets nothing."""
    entry = (await _defer(ledger_store)).entry
    claimed = await ledger_store.deferred.claim(entry.id)
    assert claimed is not None
    assert claimed.state is EntryState.RUNNING
    assert (claimed.attempt, claimed.owner) == (1, "test-replica")
    assert claimed.lease_expires_at is not None
    assert claimed.request == REQUEST
    assert await ledger_store.deferred.claim(entry.id) is None
    stored, _ = await ledger_store.get(entry.id)
    assert stored.state is EntryState.RUNNING


async def test_an_attempt_that_did_not_run_goes_back_in_line(ledger_store: LedgerStore) -> None:
    """A requeued attempt goes running → rejected → accepted with its task and request; the next
    claim is attempt 2, and the old token can no longer report."""
    entry = (await _defer(ledger_store)).entry
    claimed = await ledger_store.deferred.claim(entry.id)
    assert claimed is not None
    back = await ledger_store.deferred.requeue(
        entry.id, claimed.fencing_token, reason="not executed: 429", retry_after_s=2.0
    )
    assert back.state is EntryState.ACCEPTED
    assert (back.task_id, back.request) == (entry.task_id, REQUEST)
    again = await ledger_store.deferred.claim(entry.id)
    assert again is not None
    assert again.attempt == 2
    with pytest.raises(StaleToken):
        await ledger_store.finish(
            entry.id, claimed.fencing_token, state="succeeded", outcome=b"late"
        )
    _, history = await ledger_store.get(entry.id)
    moves = [(h.from_state, h.to_state) for h in history if h.from_state != h.to_state]
    assert moves[1:4] == [
        (EntryState.ACCEPTED, EntryState.RUNNING),
        (EntryState.RUNNING, EntryState.REJECTED),
        (EntryState.REJECTED, EntryState.ACCEPTED),
    ]


async def test_a_result_larger_than_outcomes_is_kept_and_the_request_forgotten(
    ledger_settings: LedgerSettings,
) -> None:
    """Deferred results are kept up to their own cap (beyond `max_outcome_bytes`: nobody saw
    them yet), and a finished entry no longer holds its request; past the cap, only a hash."""
    settings = LedgerSettings(url=ledger_settings.url, max_outcome_bytes=16)
    store = await LedgerStore.open(settings, owner="r")
    try:
        for key, size, kept in (("small", 1000, True), ("huge", 5000, False)):
            entry = (await _defer(store, key)).entry
            claimed = await store.deferred.claim(entry.id)
            assert claimed is not None
            result = b"x" * size
            done = await store.deferred.finish(
                entry.id,
                claimed.fencing_token,
                state="succeeded",
                outcome=result,
                error=None,
                max_bytes=4096,
            )
            assert done.state is EntryState.SUCCEEDED
            assert done.request is None
            assert done.outcome_retained is kept
            assert done.outcome == (result if kept else None)
            assert done.outcome_hash is not None
    finally:
        await store.close()


async def test_cancelled_work_never_starts(ledger_store: LedgerStore) -> None:
    """Cancelling waiting work makes it rejected ("cancelled") and unclaimable; work that
    started is not cancelled."""
    waiting = (await _defer(ledger_store, "w")).entry
    result = await ledger_store.deferred.cancel(waiting.id, actor="tenant:acme", reason=CANCELLED)
    assert result.kind == "cancelled"
    assert result.entry.state is EntryState.REJECTED
    assert (result.entry.error, result.entry.request) == (CANCELLED, None)
    assert await ledger_store.deferred.claim(waiting.id) is None
    started = (await _defer(ledger_store, "s")).entry
    assert await ledger_store.deferred.claim(started.id) is not None
    late = await ledger_store.deferred.cancel(started.id, actor="tenant:acme", reason=CANCELLED)
    assert (late.kind, late.entry.state) == ("started", EntryState.RUNNING)
    again = await ledger_store.deferred.cancel(waiting.id, actor="tenant:acme", reason=CANCELLED)
    assert again.kind == "finished"


async def test_accepted_work_is_bounded_per_tenant_and_per_upstream(
    ledger_store: LedgerStore,
) -> None:
    """Beyond the bound of waiting work of its tenant (or upstream) a deferral is refused
    ("full", naming the scope) and nothing is written; finished work frees its place."""
    defer = ledger_store.deferred.defer
    for i in range(2):
        ok = await defer(claim_request(f"t{i}"), REQUEST, max_per_tenant=2, max_per_upstream=9)
        assert ok.kind == "accepted"
    full = await defer(claim_request("t2"), REQUEST, max_per_tenant=2, max_per_upstream=9)
    assert (full.kind, full.scope, full.entry) == ("full", "tenant:acme", None)
    other = claim_request("g0", tenant="globex")
    up = await defer(other, REQUEST, max_per_tenant=2, max_per_upstream=2)
    assert (up.kind, up.scope) == ("full", "upstream:mail")
    assert len(await ledger_store.list_entries()) == 2
    first = (await ledger_store.list_entries(state="accepted"))[0]
    await ledger_store.deferred.cancel(first.id, actor="a", reason=CANCELLED)
    again = await defer(claim_request("t2"), REQUEST, max_per_tenant=2, max_per_upstream=9)
    assert again.kind == "accepted"


async def test_a_batch_of_deferrals_respects_the_bound(ledger_store: LedgerStore) -> None:
    """Twenty deferrals committed together still stop at the bound (counted inside the batch)."""
    results = await asyncio.gather(
        *(
            ledger_store.deferred.defer(
                claim_request(f"b{i}"), REQUEST, max_per_tenant=5, max_per_upstream=BIG
            )
            for i in range(20)
        )
    )
    assert sorted(r.kind for r in results) == ["accepted"] * 5 + ["full"] * 15


async def test_the_key_of_deferred_work_answers_for_it(ledger_store: LedgerStore) -> None:
    """The same key again is the same task while it waits, a mismatch with other arguments, a
    replay once finished, and 'in progress' while it runs; a live claim of it waits too."""
    entry = (await _defer(ledger_store)).entry
    same = await _defer(ledger_store)
    assert (same.kind, same.entry.task_id) == ("existing", entry.task_id)
    assert (await _defer(ledger_store, fingerprint="b" * 64)).kind == "mismatch"
    assert (await ledger_store.claim(claim_request("k"))).kind == "in_progress"
    claimed = await ledger_store.deferred.claim(entry.id)
    assert claimed is not None
    assert (await _defer(ledger_store)).kind == "in_progress"
    await ledger_store.deferred.finish(
        entry.id, claimed.fencing_token, state="succeeded", outcome=b"ok", error=None, max_bytes=9
    )
    assert (await _defer(ledger_store)).kind == "replay"


async def test_a_rejected_key_deferred_again_gets_a_new_task(ledger_store: LedgerStore) -> None:
    """A key refused before (rejected) is deferred on the same entry, under a fresh task id."""
    rejected = await ledger_store.record_rejection(
        claim_request("r"), reason="overloaded", scope="global", retry_after_s=1.0
    )
    assert rejected is not None
    result = await _defer(ledger_store, "r")
    assert result.kind == "accepted"
    assert result.entry.id == rejected.id
    assert result.entry.task_id is not None


async def test_tasks_are_listed_per_tenant_in_pages(ledger_store: LedgerStore) -> None:
    """A tenant lists only its own tasks, newest first, page by page (tasks created within one
    millisecond too: their ids count up, `ledger.batch.new_entry_id`)."""
    for i in range(5):
        await _defer(ledger_store, f"p{i}")
    await _defer(ledger_store, "x", tenant="globex")
    first = await ledger_store.deferred.tasks("acme", limit=3)
    assert len(first.entries) == 3
    assert first.next_cursor is not None
    rest = await ledger_store.deferred.tasks("acme", limit=3, cursor=first.next_cursor)
    assert len(rest.entries) == 2
    assert rest.next_cursor is None
    keys = [e.idempotency_key for e in first.entries + rest.entries]
    assert keys == [f"p{i}" for i in reversed(range(5))]
    with pytest.raises(ValueError, match="cursor"):
        await ledger_store.deferred.tasks("acme", cursor="nonsense!")
    # A cursor forged with a time that names no zone is refused the same way, on both backends.
    forged = base64.urlsafe_b64encode(b"2026-12-05T10:00:00|" + first.entries[-1].id.encode())
    with pytest.raises(ValueError, match="cursor"):
        await ledger_store.deferred.tasks("acme", cursor=forged.decode())


async def test_tasks_are_listed_per_upstream_in_full_pages(ledger_store: LedgerStore) -> None:
    """`tasks/list` on one upstream's endpoint pages through that upstream's tasks only: every
    page but the last is full, however the tenant's tasks on other upstreams interleave."""
    for i in range(6):
        await _defer(ledger_store, f"m{i}")
        await _defer(ledger_store, f"o{i}", upstream="other")
    first = await ledger_store.deferred.tasks("acme", limit=3, upstream="mail")
    rest = await ledger_store.deferred.tasks(
        "acme", limit=3, cursor=first.next_cursor, upstream="mail"
    )
    assert [e.idempotency_key for e in first.entries] == ["m5", "m4", "m3"]
    assert [e.idempotency_key for e in rest.entries] == ["m2", "m1", "m0"]
    assert rest.next_cursor is None


async def test_three_processes_racing_for_waiting_work_start_each_once(
    ledger_store: LedgerStore, ledger_url: str
) -> None:
    """Three processes claim all waiting work at the same moment, round after round: every
    entry is started by exactly one of them (row locks on PostgreSQL, the single writer on
    SQLite)."""
    children = [await spawn_ledger_child("claim_deferred", ledger_url) for _ in range(3)]
    try:
        for child in children:
            assert await read_child_json(child) == {"ready": True}
        for round_ in range(5):
            ids = {(await _defer(ledger_store, f"race-{round_}-{i}")).entry.id for i in range(40)}
            for child in children:
                assert child.stdin is not None
                child.stdin.write(b"go\n")
                await child.stdin.drain()
            started = [i for child in children for i in (await read_child_json(child))["started"]]
            assert sorted(started) == sorted(ids), f"round {round_}"
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"\n")
            await child.stdin.drain()
            assert await asyncio.wait_for(child.wait(), _DEADLINE_S) == 0
    finally:
        for child in children:
            if child.returncode is None:
                child.kill()
                await child.wait()
    running = await ledger_store.list_entries(state="running", limit=500)
    assert len(running) == 200
    assert {e.attempt for e in running} == {1}


async def test_an_attempt_given_up_ends_rejected_and_forgets_its_request(
    ledger_store: LedgerStore,
) -> None:
    """A requeue that gives up (attempts spent) leaves the work rejected, its request dropped,
    and nothing left to claim."""
    entry = (await _defer(ledger_store)).entry
    claimed = await ledger_store.deferred.claim(entry.id)
    assert claimed is not None
    done = await ledger_store.deferred.requeue(
        entry.id, claimed.fencing_token, reason="given up", retry_after_s=None, give_up=True
    )
    assert done.state is EntryState.REJECTED
    assert done.request is None
    assert (done.error, done.task_id) == ("given up", entry.task_id)
    assert await ledger_store.deferred.claim(entry.id) is None
    assert await ledger_store.deferred.candidates(10) == []


async def test_a_cancelled_tasks_key_sent_live_again_is_no_longer_that_task(
    ledger_store: LedgerStore,
) -> None:
    """Once its task was cancelled, the key sent again runs as a live attempt of the same entry,
    and the old task id names nothing any more."""
    entry = (await _defer(ledger_store)).entry
    await ledger_store.deferred.cancel(entry.id, actor="a", reason=CANCELLED)
    live = await ledger_store.claim(claim_request("k"))
    assert (live.kind, live.entry.id, live.entry.task_id) == ("new", entry.id, None)
    assert entry.task_id is not None
    assert await ledger_store.deferred.task(entry.task_id, "acme") is None


async def test_an_upstreams_own_task_of_any_length_is_owned_by_its_tenant(
    ledger_store: LedgerStore,
) -> None:
    """An upstream's task id is the upstream's to choose (the specification bounds no length): a
    long one is recorded like a short one and found only for the tenant whose call created it."""
    for key, task_id in (("short", "up-task-1"), ("long", "t" * 300)):
        claimed = await ledger_store.claim(claim_request(key))
        await ledger_store.deferred.note_upstream_task(claimed.entry.id, "up", task_id)
        assert await ledger_store.deferred.upstream_task_owner("up", task_id) == "acme"
        assert await ledger_store.deferred.upstream_task_owner("other", task_id) is None
    assert await ledger_store.deferred.upstream_task_owner("up", "t" * 299) is None
