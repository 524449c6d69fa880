"""Deferred work waiting for its caller's input, on SQLite and PostgreSQL: parked (running →
rejected, nothing ran) with its request and the upstream's question, answered (rejected →
accepted with the request that carries the answers) exactly once, or cancelled."""

from __future__ import annotations

from typing import Any

import pytest

from ledger import EntryState, LedgerStore, StaleToken
from ledger.deferred_ops import CANCELLED, INPUT_REQUIRED
from tests import ledger_fixtures
from tests.ledger_fixtures import claim_request

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url
ledger_settings = ledger_fixtures.ledger_settings
ledger_store = ledger_fixtures.ledger_store

REQUEST = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send"}}'
ANSWERED = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"send","x":1}}'
QUESTION = b'{"result":{"resultType":"input_required","inputRequests":{"q":{}}}}'
BIG = 1_000_000


async def _asking(store: LedgerStore, key: str = "k") -> Any:
    """Deferred work whose first attempt asked for input."""
    entry = (
        await store.deferred.defer(
            claim_request(key), REQUEST, max_per_tenant=BIG, max_per_upstream=BIG
        )
    ).entry
    claimed = await store.deferred.claim(entry.id)
    assert claimed is not None
    return await store.deferred.await_input(
        entry.id, claimed.fencing_token, question=QUESTION, max_bytes=4096
    )


async def test_work_that_asks_for_input_waits_then_runs_with_the_answers(
    ledger_store: LedgerStore,
) -> None:
    """running → rejected (input_required, request and question kept, not claimable) →
    accepted with the answering request → claimed as attempt 2; the old token cannot report."""
    waiting = await _asking(ledger_store)
    assert waiting.state is EntryState.REJECTED
    assert (waiting.error, waiting.request, waiting.outcome) == (INPUT_REQUIRED, REQUEST, QUESTION)
    assert waiting.lease_expires_at is None
    assert await ledger_store.deferred.claim(waiting.id) is None
    found = await ledger_store.deferred.task(waiting.task_id or "", "acme")
    assert found is not None
    assert (found.state, found.outcome) == (EntryState.REJECTED, QUESTION)

    answered = await ledger_store.deferred.provide_input(
        waiting.id, waiting.fencing_token, request=ANSWERED, actor="tenant:acme"
    )
    assert answered.kind == "accepted"
    assert answered.entry.state is EntryState.ACCEPTED
    assert (answered.entry.request, answered.entry.outcome, answered.entry.error) == (
        ANSWERED,
        None,
        None,
    )
    assert answered.entry.task_id == waiting.task_id
    again = await ledger_store.deferred.claim(waiting.id)
    assert again is not None
    assert (again.attempt, again.request) == (2, ANSWERED)
    with pytest.raises(StaleToken):
        await ledger_store.finish(
            waiting.id, waiting.fencing_token - 1, state="succeeded", outcome=b"late"
        )
    _, history = await ledger_store.get(waiting.id)
    moves = [(h.from_state, h.to_state, h.reason) for h in history if h.from_state != h.to_state]
    assert moves[2:5] == [
        (EntryState.RUNNING, EntryState.REJECTED, INPUT_REQUIRED),
        (EntryState.REJECTED, EntryState.ACCEPTED, "input_provided"),
        (EntryState.ACCEPTED, EntryState.RUNNING, "claimed_deferred"),
    ]


async def test_answers_are_taken_once_and_only_while_waiting(ledger_store: LedgerStore) -> None:
    """A second answer, an answer to an older question, or an answer to work that does not
    wait for input is "not_waiting" and changes nothing."""
    waiting = await _asking(ledger_store)
    stale = await ledger_store.deferred.provide_input(
        waiting.id, waiting.fencing_token - 1, request=ANSWERED, actor="tenant:acme"
    )
    assert (stale.kind, stale.entry.state) == ("not_waiting", EntryState.REJECTED)
    first = await ledger_store.deferred.provide_input(
        waiting.id, waiting.fencing_token, request=ANSWERED, actor="tenant:acme"
    )
    second = await ledger_store.deferred.provide_input(
        waiting.id, waiting.fencing_token, request=REQUEST, actor="tenant:acme"
    )
    assert (first.kind, second.kind) == ("accepted", "not_waiting")
    assert second.entry.request == ANSWERED
    plain = (
        await ledger_store.deferred.defer(
            claim_request("plain"), REQUEST, max_per_tenant=BIG, max_per_upstream=BIG
        )
    ).entry
    refused = await ledger_store.deferred.provide_input(
        plain.id, plain.fencing_token, request=ANSWERED, actor="tenant:acme"
    )
    assert (refused.kind, refused.entry.state) == ("not_waiting", EntryState.ACCEPTED)


async def test_work_waiting_for_input_can_be_cancelled(ledger_store: LedgerStore) -> None:
    """Cancelling it forgets the request: it is cancelled, never runs, takes no answer."""
    waiting = await _asking(ledger_store)
    result = await ledger_store.deferred.cancel(waiting.id, actor="tenant:acme", reason=CANCELLED)
    assert result.kind == "cancelled"
    assert result.entry.state is EntryState.REJECTED
    assert (result.entry.error, result.entry.request) == (CANCELLED, None)
    late = await ledger_store.deferred.provide_input(
        waiting.id, result.entry.fencing_token, request=ANSWERED, actor="tenant:acme"
    )
    assert late.kind == "not_waiting"
    assert await ledger_store.deferred.claim(waiting.id) is None
