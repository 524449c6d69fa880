"""The ledger store against real databases: every test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from ledger import (
    AmbiguousReference,
    EntryNotFound,
    EntryState,
    IllegalTransition,
    LedgerStore,
    LedgerUnavailable,
    StaleToken,
)
from policies.model import LedgerSettings
from tests import ledger_fixtures
from tests.ledger_fixtures import FakeClock, claim_request

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url
ledger_settings = ledger_fixtures.ledger_settings
ledger_store = ledger_fixtures.ledger_store


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(ledger_url: str, clock: FakeClock) -> AsyncIterator[LedgerStore]:
    """A store on a fake clock with a 10 s lease and small caps."""
    settings = LedgerSettings(
        url=ledger_url, lease_s=10, max_outcome_bytes=16, max_argument_bytes=64
    )
    store = await LedgerStore.open(settings, owner="replica-a", clock=clock)
    try:
        yield store
    finally:
        await store.close()


async def test_new_claim_is_committed_running_before_claim_returns(
    store: LedgerStore, ledger_url: str
) -> None:
    """A new claim is running, owned, leased and fenced — and another connection already sees it."""
    result = await store.claim(claim_request("k"))
    assert result.kind == "new"
    entry = result.entry
    assert (entry.state, entry.attempt, entry.fencing_token) == (EntryState.RUNNING, 1, 1)
    assert entry.owner == "replica-a"
    assert entry.lease_expires_at == entry.started_at + timedelta(seconds=10)  # type: ignore[operator]
    other = await LedgerStore.open(LedgerSettings(url=ledger_url), owner="reader")
    try:
        seen, history = await other.get(entry.id)
    finally:
        await other.close()
    assert seen.state == EntryState.RUNNING
    assert [(h.from_state, h.to_state, h.actor) for h in history] == [
        (None, EntryState.RUNNING, "replica-a")
    ]


async def test_same_key_while_running_is_in_progress(store: LedgerStore) -> None:
    """A second send of a running key is told "in_progress" and gets the same entry."""
    first = await store.claim(claim_request("k"))
    second = await store.claim(claim_request("k"))
    assert second.kind == "in_progress"
    assert second.entry.id == first.entry.id


async def test_replay_returns_stored_outcome_byte_identical(store: LedgerStore) -> None:
    """A finished key replays its outcome exactly as stored, bytes that are not UTF-8 included."""
    outcome = bytes(range(16))
    claimed = await store.claim(claim_request("k"))
    await store.finish(claimed.entry.id, 1, state="succeeded", outcome=outcome)
    replay = await store.claim(claim_request("k"))
    assert replay.kind == "replay"
    assert replay.entry.outcome == outcome
    assert replay.entry.outcome_retained


async def test_failed_outcome_is_replayed_too(store: LedgerStore) -> None:
    """A failed entry is terminal: the same call replays the failure instead of resending."""
    claimed = await store.claim(claim_request("k"))
    await store.finish(claimed.entry.id, 1, state="failed", outcome=b"{}", error="bounced")
    replay = await store.claim(claim_request("k"))
    assert (replay.kind, replay.entry.state, replay.entry.error) == (
        "replay",
        EntryState.FAILED,
        "bounced",
    )


async def test_outcome_over_cap_keeps_only_its_hash(store: LedgerStore) -> None:
    """An outcome over max_outcome_bytes is stored as its sha256 and marked not retained."""
    claimed = await store.claim(claim_request("k"))
    done = await store.finish(claimed.entry.id, 1, state="succeeded", outcome=b"x" * 17)
    assert done.outcome is None
    assert not done.outcome_retained
    assert done.outcome_hash == hashlib.sha256(b"x" * 17).hexdigest()


async def test_arguments_are_capped(store: LedgerStore) -> None:
    """Arguments longer than max_argument_bytes are cut, with a marker giving the full size."""
    claimed = await store.claim(claim_request("k", arguments="é" * 100))
    arguments = claimed.entry.arguments
    assert arguments is not None
    assert len(arguments.encode()) <= 64
    assert arguments.endswith("[truncated, 200 bytes]")


async def test_different_fingerprint_is_a_mismatch_in_any_state(store: LedgerStore) -> None:
    """The same key with other arguments is refused, whether running or finished."""
    claimed = await store.claim(claim_request("k"))
    assert (await store.claim(claim_request("k", fingerprint="b" * 64))).kind == "mismatch"
    await store.finish(claimed.entry.id, 1, state="succeeded", outcome=b"ok")
    assert (await store.claim(claim_request("k", fingerprint="b" * 64))).kind == "mismatch"


async def test_keys_are_scoped_by_tenant_and_upstream(store: LedgerStore) -> None:
    """One key string from two tenants, or for two upstreams, names different entries."""
    a = await store.claim(claim_request("k"))
    b = await store.claim(claim_request("k", tenant="globex"))
    c = await store.claim(claim_request("k", upstream="files"))
    assert [a.kind, b.kind, c.kind] == ["new", "new", "new"]
    assert len({a.entry.id, b.entry.id, c.entry.id}) == 3


async def test_key_mode_none_always_makes_a_new_entry(store: LedgerStore) -> None:
    """Without an idempotency key every call is a new entry, each with no visible key."""
    first = await store.claim(claim_request(None))
    second = await store.claim(claim_request(None))
    assert (first.kind, second.kind) == ("new", "new")
    assert first.entry.id != second.entry.id
    assert first.entry.idempotency_key is None
    assert first.entry.key_source == "none"


async def test_stale_token_finish_is_refused_and_kept_as_evidence(
    store: LedgerStore, clock: FakeClock
) -> None:
    """After the lease expires, the old owner's finish raises StaleToken and its report is kept."""
    claimed = await store.claim(claim_request("k"))
    clock.advance(11)
    assert await store.sweep_expired() == 1
    with pytest.raises(StaleToken) as raised:
        await store.finish(claimed.entry.id, 1, state="succeeded", outcome=b"sent!")
    assert (raised.value.token, raised.value.current_token) == (1, 2)
    entry, history = await store.get(claimed.entry.id)
    assert entry.state == EntryState.UNKNOWN
    note = history[-1]
    assert (note.from_state, note.to_state, note.reason) == (
        EntryState.UNKNOWN,
        EntryState.UNKNOWN,
        "stale_report",
    )
    assert note.evidence is not None
    assert note.evidence["report"]["state"] == "succeeded"
    assert note.evidence["report"]["outcome_b64"] == "c2VudCE="  # b"sent!"


async def test_a_lapsed_lease_is_unknown_even_before_the_sweeper_runs(
    store: LedgerStore, clock: FakeClock
) -> None:
    """An expired lease becomes unknown, never succeeded: a late finish, release or renewal by
    its owner (the sweeper has not come by yet) is refused and turns the entry unknown."""
    finished = await store.claim(claim_request("late-finish"))
    released = await store.claim(claim_request("late-release"))
    renewed = await store.claim(claim_request("late-renew"))
    clock.advance(11)
    with pytest.raises(StaleToken):
        await store.finish(finished.entry.id, 1, state="succeeded", outcome=b"ok")
    with pytest.raises(StaleToken):
        await store.release_unsent(released.entry.id, 1, reason="429", retry_after_s=1.0)
    assert not await store.renew(renewed.entry.id, 1)
    for claimed in (finished, released, renewed):
        entry, history = await store.get(claimed.entry.id)
        assert entry.state == EntryState.UNKNOWN
        assert "lease_expired" in [h.reason for h in history]
    assert await store.sweep_expired() == 0


async def test_oldest_in_state_is_when_the_longest_waiting_entry_got_there(
    store: LedgerStore, clock: FakeClock
) -> None:
    """The age of the oldest `unknown` entry comes from the database, however many there are."""
    assert await store.oldest_in_state("unknown") is None
    first = await store.claim(claim_request("first"))
    await store.mark_unknown(first.entry.id, 1, reason="timeout")
    marked_at = clock()
    clock.advance(30)
    second = await store.claim(claim_request("second"))
    await store.mark_unknown(second.entry.id, 1, reason="timeout")
    assert await store.oldest_in_state("unknown") == marked_at


async def test_finish_twice_is_an_illegal_transition(store: LedgerStore) -> None:
    """The owner cannot finish an entry that is already finished."""
    claimed = await store.claim(claim_request("k"))
    await store.finish(claimed.entry.id, 1, state="succeeded", outcome=b"ok")
    with pytest.raises(IllegalTransition):
        await store.finish(claimed.entry.id, 1, state="failed", outcome=None)


async def test_a_closed_store_takes_no_write(store: LedgerStore) -> None:
    """Fail closed: once the store is closed, a claim is refused as unavailable (the call must
    not be forwarded), and an outcome handed over in the background fails the same way once its
    retries run out, instead of being left pending."""
    claimed = await store.claim(claim_request("before-close"))
    await store.close()
    with pytest.raises(LedgerUnavailable):
        await store.claim(claim_request("after-close"))
    until = asyncio.get_running_loop().time()  # no time left to retry
    finishing = store.finish_in_background(
        claimed.entry.id, 1, state="succeeded", outcome=b"ok", until=until
    )
    with pytest.raises(LedgerUnavailable):
        await asyncio.wait_for(finishing, 5.0)


async def test_finish_of_unknown_entry_is_not_found(store: LedgerStore) -> None:
    """Finishing an id that does not exist raises EntryNotFound."""
    with pytest.raises(EntryNotFound):
        await store.finish("0" * 32, 1, state="succeeded", outcome=None)


async def test_renew_extends_lease_only_for_current_token(
    store: LedgerStore, clock: FakeClock
) -> None:
    """Renewing keeps a live call out of the sweeper's hands; a stale token cannot renew."""
    claimed = await store.claim(claim_request("k"))
    clock.advance(8)
    assert await store.renew(claimed.entry.id, 1)
    clock.advance(8)
    assert await store.sweep_expired() == 0
    assert not await store.renew(claimed.entry.id, 2)
    clock.advance(3)
    assert await store.sweep_expired() == 1
    assert not await store.renew(claimed.entry.id, 1)


async def test_mark_unknown_by_owner(store: LedgerStore) -> None:
    """The owner can give up on knowing: running → unknown, and the key then needs reconciling."""
    claimed = await store.claim(claim_request("k"))
    entry = await store.mark_unknown(claimed.entry.id, 1, reason="upstream timed out")
    assert (entry.state, entry.error, entry.fencing_token) == (
        EntryState.UNKNOWN,
        "upstream timed out",
        2,
    )
    assert (await store.claim(claim_request("k"))).kind == "needs_reconciliation"


async def test_expired_lease_becomes_unknown_and_needs_reconciliation(
    store: LedgerStore, clock: FakeClock
) -> None:
    """The sweeper turns an expired lease into unknown; the key is then never re-sent by itself."""
    claimed = await store.claim(claim_request("k"))
    clock.advance(10.5)
    assert await store.sweep_expired() == 1
    again = await store.claim(claim_request("k"))
    assert again.kind == "needs_reconciliation"
    assert again.entry.state == EntryState.UNKNOWN
    _, history = await store.get(claimed.entry.id)
    assert history[-1].actor == "sweeper:replica-a"
    assert history[-1].reason == "lease_expired"


async def test_resolve_retry_gives_next_attempt_with_same_key(
    store: LedgerStore, clock: FakeClock
) -> None:
    """An operator retry leaves the entry accepted; the next send runs it as attempt 2."""
    claimed = await store.claim(claim_request("k"))
    clock.advance(11)
    await store.sweep_expired()
    resolved = await store.resolve("k", as_="retry", note="checked: not sent", actor="op:ann")
    assert (resolved.state, resolved.owner, resolved.note) == (
        EntryState.ACCEPTED,
        None,
        "checked: not sent",
    )
    again = await store.claim(claim_request("k"))
    assert again.kind == "new"
    assert again.entry.id == claimed.entry.id
    assert (again.entry.attempt, again.entry.idempotency_key) == (2, "k")
    await store.finish(again.entry.id, again.entry.fencing_token, state="succeeded", outcome=b"1")
    _, history = await store.get(claimed.entry.id)
    assert [h.to_state.value for h in history] == [
        "running",
        "unknown",
        "accepted",
        "running",
        "succeeded",
    ]


async def test_resolve_retry_past_budget_blocks(store: LedgerStore, clock: FakeClock) -> None:
    """A retry that would exceed max_attempts blocks the entry; a blocked entry cannot retry."""
    await store.claim(claim_request("k"))
    clock.advance(11)
    await store.sweep_expired()
    await store.resolve("k", as_="retry", note=None, actor="op", max_attempts=2)
    assert (await store.claim(claim_request("k"))).entry.attempt == 2
    clock.advance(11)
    await store.sweep_expired()
    blocked = await store.resolve("k", as_="retry", note=None, actor="op", max_attempts=2)
    assert (blocked.state, blocked.attempt) == (EntryState.BLOCKED, 2)
    assert (await store.claim(claim_request("k"))).kind == "needs_reconciliation"
    with pytest.raises(IllegalTransition, match="retry budget spent"):
        await store.resolve("k", as_="retry", note=None, actor="op", max_attempts=2)
    done = await store.resolve("k", as_="failed", note="gave up", actor="op")
    assert done.state == EntryState.FAILED


async def test_resolve_running_entry_is_illegal(store: LedgerStore) -> None:
    """An operator cannot resolve an entry whose owner still holds the lease."""
    await store.claim(claim_request("k"))
    with pytest.raises(IllegalTransition, match="running"):
        await store.resolve("k", as_="succeeded", note=None, actor="op")


async def test_resolve_as_succeeded_replays_afterwards(
    store: LedgerStore, clock: FakeClock
) -> None:
    """Reconciling unknown as succeeded makes the key a replay with the note recorded."""
    claimed = await store.claim(claim_request("k"))
    clock.advance(11)
    await store.sweep_expired()
    await store.resolve(claimed.entry.id, as_="succeeded", note="seen in outbox", actor="op")
    replay = await store.claim(claim_request("k"))
    assert (replay.kind, replay.entry.note) == ("replay", "seen in outbox")


async def test_rejection_is_recorded_and_same_key_runs_next(store: LedgerStore) -> None:
    """A refusal is a rejected entry with retry_after; sending the key again runs it (attempt 1)."""
    rejected = await store.record_rejection(
        claim_request("k"), reason="overloaded", scope="tenant:acme", retry_after_s=2.5
    )
    assert rejected is not None
    assert (rejected.state, rejected.retry_after_s, rejected.attempt) == (
        EntryState.REJECTED,
        2.5,
        0,
    )
    listed = await store.list_entries(state="rejected")
    assert [e.id for e in listed] == [rejected.id]
    again = await store.claim(claim_request("k"))
    assert (again.kind, again.entry.id, again.entry.attempt) == ("new", rejected.id, 1)


async def test_rejection_never_clobbers_a_live_entry(store: LedgerStore) -> None:
    """Recording a refusal for a key that is running writes nothing and returns None."""
    claimed = await store.claim(claim_request("k"))
    result = await store.record_rejection(
        claim_request("k"), reason="overloaded", scope="global", retry_after_s=1
    )
    assert result is None
    entry, history = await store.get(claimed.entry.id)
    assert entry.state == EntryState.RUNNING
    assert len(history) == 1


async def test_get_by_key_prefix_and_ambiguity(store: LedgerStore) -> None:
    """Entries are found by id, key or unique id prefix; a key used by two tenants is ambiguous."""
    a = await store.claim(claim_request("shared"))
    await store.claim(claim_request("shared", tenant="globex"))
    assert (await store.get(a.entry.id))[0].id == a.entry.id
    assert (await store.get(a.entry.id[:20]))[0].id == a.entry.id
    with pytest.raises(AmbiguousReference):
        await store.get("shared")
    with pytest.raises(EntryNotFound):
        await store.get("no-such-key")


async def test_list_filters_stats_and_counts(store: LedgerStore, clock: FakeClock) -> None:
    """list_entries filters by state, upstream, tenant and time; stats count by state×upstream."""
    first = await store.claim(claim_request("a"))
    await store.finish(first.entry.id, 1, state="succeeded", outcome=None)
    clock.advance(60)
    await store.claim(claim_request("b", upstream="files"))
    clock.advance(1)
    await store.claim(claim_request("c", tenant="globex"))
    assert len(await store.list_entries()) == 3
    assert [e.idempotency_key for e in await store.list_entries(state="running")] == ["c", "b"]
    assert [e.idempotency_key for e in await store.list_entries(upstream="files")] == ["b"]
    assert [e.idempotency_key for e in await store.list_entries(tenant="globex")] == ["c"]
    since = clock() - timedelta(seconds=2)
    assert {e.idempotency_key for e in await store.list_entries(since=since)} == {"b", "c"}
    assert len(await store.list_entries(limit=1)) == 1
    assert await store.stats() == {
        ("succeeded", "mail"): 1,
        ("running", "files"): 1,
        ("running", "mail"): 1,
    }
    counts = await store.count_by_state()
    assert (counts["running"], counts["succeeded"], counts["unknown"]) == (2, 1, 0)


async def test_purge_deletes_only_old_closed_entries(store: LedgerStore, clock: FakeClock) -> None:
    """Retention removes old succeeded/failed/rejected entries (freeing keys), never open ones."""
    done = await store.claim(claim_request("done"))
    await store.finish(done.entry.id, 1, state="succeeded", outcome=b"ok")
    await store.record_rejection(claim_request("refused"), reason="x", scope="g", retry_after_s=1)
    await store.claim(claim_request("running"))
    lost = await store.claim(claim_request("lost"))
    await store.mark_unknown(lost.entry.id, 1, reason="timeout")
    clock.advance(3600)
    assert await store.purge(older_than=timedelta(hours=2)) == 0
    assert await store.purge(older_than=timedelta(minutes=30)) == 2
    remaining = {e.idempotency_key for e in await store.list_entries()}
    assert remaining == {"running", "lost"}
    assert (await store.claim(claim_request("done"))).kind == "new"


async def test_refused_operation_fails_only_its_caller(store: LedgerStore) -> None:
    """In one group-committed batch, an illegal finish fails alone; its neighbours commit."""
    running = await store.claim(claim_request("r"))
    done = await store.claim(claim_request("d"))
    await store.finish(done.entry.id, 1, state="succeeded", outcome=None)
    results = await asyncio.gather(
        store.claim(claim_request("n1")),
        store.finish(done.entry.id, 1, state="failed", outcome=None),
        store.finish(running.entry.id, 1, state="succeeded", outcome=b"ok"),
        store.claim(claim_request("n2")),
        return_exceptions=True,
    )
    assert isinstance(results[1], IllegalTransition)
    assert [getattr(r, "kind", None) for r in (results[0], results[3])] == ["new", "new"]
    assert (await store.get(running.entry.id))[0].state == EntryState.SUCCEEDED


async def test_one_batch_of_differently_filled_entries_keeps_each_ones_values(
    store: LedgerStore,
) -> None:
    """Entries whose optional values differ (set or absent) are written in one commit with their
    own values, NULLs where absent; so are their finishes and their history rows."""
    shapes = [
        {},
        {"arguments": None},
        {"run_id": "run-7", "trace_id": "a" * 32},
        {"arguments": None, "run_id": "run-8", "work_class": "background"},
    ]
    batches = store.writer_stats.batches
    claims = await asyncio.gather(
        *(store.claim(claim_request(f"shape-{i}", **extra)) for i, extra in enumerate(shapes))
    )
    assert store.writer_stats.batches == batches + 1  # one batch held every shape
    finishes = [
        store.finish(claims[0].entry.id, 1, state="succeeded", outcome=b"ok"),
        store.finish(claims[1].entry.id, 1, state="failed", outcome=None, error="boom"),
        store.finish(claims[2].entry.id, 1, state="succeeded", outcome=None),
        store.mark_unknown(claims[3].entry.id, 1, reason="lost"),
    ]
    await asyncio.gather(*finishes)
    expected_states = [
        EntryState.SUCCEEDED,
        EntryState.FAILED,
        EntryState.SUCCEEDED,
        EntryState.UNKNOWN,
    ]
    for claimed, extra, state in zip(claims, shapes, expected_states, strict=True):
        entry, history = await store.get(claimed.entry.id)
        want = claim_request("x", **extra)
        got = (entry.arguments, entry.run_id, entry.trace_id, entry.work_class)
        assert got == (want.arguments, want.run_id, want.trace_id, want.work_class)
        assert entry.state == state
        assert entry.lease_expires_at is None
        assert [(h.from_state, h.to_state) for h in history] == [
            (None, EntryState.RUNNING),
            (EntryState.RUNNING, state),
        ]
    first, failed, empty = [(await store.get(c.entry.id))[0] for c in claims[:3]]
    assert (first.outcome, first.error) == (b"ok", None)
    assert (failed.outcome, failed.error) == (None, "boom")
    assert (empty.outcome, empty.outcome_hash) == (None, None)


async def test_default_store_fixture_roundtrip(ledger_store: LedgerStore) -> None:
    """The shared `ledger_store` fixture opens a migrated, writable store on each backend."""
    result = await ledger_store.claim(claim_request("fixture"))
    assert result.kind == "new"
    await ledger_store.ping()


async def test_release_unsent_frees_the_key_for_the_next_attempt(store: LedgerStore) -> None:
    """A call certainly not executed goes running → rejected; the same key then runs attempt 2,
    and the released lease's token can no longer finish anything."""
    claimed = await store.claim(claim_request("k"))
    released = await store.release_unsent(
        claimed.entry.id, 1, reason="upstream 429 before processing", retry_after_s=3.0
    )
    assert (released.state, released.retry_after_s, released.fencing_token) == (
        EntryState.REJECTED,
        3.0,
        2,
    )
    again = await store.claim(claim_request("k"))
    assert (again.kind, again.entry.id, again.entry.attempt) == ("new", claimed.entry.id, 2)
    with pytest.raises(StaleToken):
        await store.finish(claimed.entry.id, 1, state="succeeded", outcome=b"late")
    with pytest.raises(StaleToken):
        await store.release_unsent(claimed.entry.id, 1, reason="again", retry_after_s=None)
