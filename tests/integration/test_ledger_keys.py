"""How long a key answers (the derived-key dedup window) and what spends the operator's retry
budget, against real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, Literal

import pytest

from ledger import ClaimRequest, EntryState, LedgerStore
from policies.model import LedgerSettings
from tests import ledger_fixtures
from tests.ledger_fixtures import FakeClock, claim_request

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url

WINDOW_S = 300.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(ledger_url: str, clock: FakeClock) -> AsyncIterator[LedgerStore]:
    """A store on a fake database clock with a lease of an hour (leases never lapse here)."""
    settings = LedgerSettings(url=ledger_url, lease_s=3600)
    store = await LedgerStore.open(settings, owner="replica-a", clock=clock)
    try:
        yield store
    finally:
        await store.close()


def derived(key: str = "derived-1", **overrides: Any) -> ClaimRequest:
    """A claim of a derived key with a 300 s dedup window."""
    return claim_request(key, key_source="derived", dedup_window_s=WINDOW_S, **overrides)


async def _finished(
    store: LedgerStore, key: str = "derived-1", state: Literal["succeeded", "failed"] = "succeeded"
) -> str:
    claim = await store.claim(derived(key))
    assert claim.kind == "new"
    await store.finish(claim.entry.id, claim.entry.fencing_token, state=state, outcome=b"first")
    return claim.entry.id


@pytest.mark.parametrize("state", ["succeeded", "failed"])
async def test_a_derived_key_past_its_window_starts_a_new_entry(
    store: LedgerStore, clock: FakeClock, state: Literal["succeeded", "failed"]
) -> None:
    """A finished entry of a derived key replays within the window; once its last transition is
    older than the window, the same call is a new entry (attempt 1) and the old one stays in the
    history with its key, marked superseded."""
    first_id = await _finished(store, state=state)
    clock.advance(WINDOW_S - 1)
    assert (await store.claim(derived())).kind == "replay"
    clock.advance(2)
    again = await store.claim(derived())
    assert (again.kind, again.entry.attempt, again.entry.state) == ("new", 1, EntryState.RUNNING)
    assert again.entry.id != first_id
    old, history = await store.get(first_id)
    assert (old.state, old.idempotency_key, old.superseded) == (
        EntryState(state),
        "derived-1",
        True,
    )
    assert history[-1].reason == "key_released"
    current, _ = await store.get("derived-1")
    assert (current.id, current.superseded) == (again.entry.id, False)
    listed = await store.list_entries()
    assert sorted(e.idempotency_key or "" for e in listed) == ["derived-1", "derived-1"]


async def test_explicit_keys_answer_whatever_the_age(store: LedgerStore, clock: FakeClock) -> None:
    """A key without a window (explicit) replays its finished entry a day later."""
    claim = await store.claim(claim_request("explicit-1"))
    await store.finish(claim.entry.id, claim.entry.fencing_token, state="succeeded", outcome=b"x")
    clock.advance(86_000)
    replay = await store.claim(claim_request("explicit-1"))
    assert (replay.kind, replay.entry.id) == ("replay", claim.entry.id)


async def test_open_entries_answer_for_their_key_whatever_the_window(
    store: LedgerStore, clock: FakeClock
) -> None:
    """Running, unknown, blocked and operator-accepted entries of a derived key still answer
    long after the window: in progress, needs reconciliation, or the accepted retry runs."""
    running = await store.claim(derived("running"))
    unknown = await store.claim(derived("unknown"))
    await store.mark_unknown(unknown.entry.id, unknown.entry.fencing_token, reason="t/o")
    blocked = await store.claim(derived("blocked"))
    await store.mark_unknown(blocked.entry.id, blocked.entry.fencing_token, reason="t/o")
    await store.resolve(blocked.entry.id, as_="retry", note=None, actor="op", max_attempts=1)
    accepted = await store.claim(derived("accepted"))
    await store.mark_unknown(accepted.entry.id, accepted.entry.fencing_token, reason="t/o")
    await store.resolve(accepted.entry.id, as_="retry", note=None, actor="op")
    clock.advance(10 * WINDOW_S)
    answers = [
        await store.claim(derived(key)) for key in ("running", "unknown", "blocked", "accepted")
    ]
    assert [(a.kind, a.entry.state) for a in answers] == [
        ("in_progress", EntryState.RUNNING),
        ("needs_reconciliation", EntryState.UNKNOWN),
        ("needs_reconciliation", EntryState.BLOCKED),
        ("new", EntryState.RUNNING),
    ]
    assert [a.entry.id for a in answers] == [
        e.entry.id for e in (running, unknown, blocked, accepted)
    ]
    assert answers[3].entry.attempt == 2


async def test_a_rejected_derived_key_runs_again_within_the_window_and_anew_after(
    store: LedgerStore, clock: FakeClock
) -> None:
    """A refusal recorded for a derived key: sent again within the window it is the same entry's
    next attempt; sent after the window, a new entry; a refusal past the window is recorded on a
    new rejected entry, not as a note on the old one."""
    first = await store.record_rejection(
        derived("r1"),
        reason="overloaded",
        scope="global",
        retry_after_s=1,
    )
    assert first is not None
    within = await store.claim(derived("r1"))
    assert (within.kind, within.entry.id, within.entry.attempt) == ("new", first.id, 1)

    second = await store.record_rejection(
        derived("r2"),
        reason="overloaded",
        scope="global",
        retry_after_s=1,
    )
    assert second is not None
    clock.advance(WINDOW_S + 1)
    again = await store.record_rejection(
        derived("r2"),
        reason="overloaded",
        scope="global",
        retry_after_s=1,
    )
    assert again is not None
    assert (again.id != second.id, again.state) == (True, EntryState.REJECTED)
    clock.advance(WINDOW_S + 1)
    after = await store.claim(derived("r2"))
    assert after.kind == "new"
    assert after.entry.id not in (second.id, again.id)


async def test_racing_claims_past_the_window_start_one_new_entry(
    store: LedgerStore, clock: FakeClock
) -> None:
    """Twenty claims of a derived key whose entry just left its window, at once: one new entry
    runs, the rest are told it is in progress."""
    await _finished(store)
    clock.advance(WINDOW_S + 1)
    results = await asyncio.gather(*(store.claim(derived()) for _ in range(20)))
    assert sorted(r.kind for r in results) == ["in_progress"] * 19 + ["new"]
    assert len({r.entry.id for r in results}) == 1
    assert len(await store.list_entries()) == 2


async def test_a_superseded_entry_is_purged_like_any_other(
    store: LedgerStore, clock: FakeClock
) -> None:
    """Retention deletes a superseded entry once it is old enough; the current one stays."""
    await _finished(store)
    clock.advance(WINDOW_S + 1)
    current = await store.claim(derived())
    assert await store.purge(older_than=timedelta(seconds=WINDOW_S)) == 1
    assert [e.id for e in await store.list_entries()] == [current.entry.id]


async def test_the_proxys_own_hand_overs_do_not_spend_the_operator_retry_budget(
    store: LedgerStore,
) -> None:
    """Two attempts released as certainly not executed and claimed again (attempt 3), then the
    third is lost: the operator's first retry is accepted, not blocked — only operator retries
    count against `max_attempts`."""
    claim = await store.claim(claim_request("handed-over"))
    for _ in range(2):
        await store.release_unsent(
            claim.entry.id, claim.entry.fencing_token, reason="429", retry_after_s=None
        )
        claim = await store.claim(claim_request("handed-over"))
    assert claim.entry.attempt == 3
    await store.mark_unknown(claim.entry.id, claim.entry.fencing_token, reason="t/o")
    retried = await store.resolve(claim.entry.id, as_="retry", note=None, actor="op")
    assert (retried.state, retried.operator_retries) == (EntryState.ACCEPTED, 1)
    run = await store.claim(claim_request("handed-over"))
    assert (run.kind, run.entry.attempt) == ("new", 4)
    await store.mark_unknown(run.entry.id, run.entry.fencing_token, reason="t/o")
    second = await store.resolve(run.entry.id, as_="retry", note=None, actor="op")
    assert second.state == EntryState.ACCEPTED
    run = await store.claim(claim_request("handed-over"))
    await store.mark_unknown(run.entry.id, run.entry.fencing_token, reason="t/o")
    third = await store.resolve(run.entry.id, as_="retry", note=None, actor="op")
    assert (third.state, third.operator_retries) == (EntryState.BLOCKED, 2)
