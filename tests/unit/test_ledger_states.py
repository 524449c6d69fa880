"""The ledger's state machine and its operations, decided in memory (no database, no loop)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import (
    EntryNotFound,
    EntryState,
    IllegalTransition,
    LedgerError,
    StaleToken,
)
from ledger.batch import OpContext, WorkingSet
from ledger.deferred_input import AwaitInput
from ledger.deferred_ops import ClaimDeferred, Defer, Requeue
from ledger.operations import (
    Claim,
    Finish,
    MarkUnknown,
    Operation,
    RecordRejection,
    ReleaseUnsent,
    Renew,
)
from ledger.reconcile_ops import Resolve, Sweep
from ledger.states import NEEDS_RECONCILIATION, TERMINAL, check_transition, is_legal
from tests.ledger_fixtures import FakeClock, claim_request

S = EntryState


class MemoryLedger:
    """The operations applied to one long-lived working set: a ledger with no database."""

    def __init__(self, lease_s: float = 10) -> None:
        self.ws = WorkingSet()
        self.clock = FakeClock()
        self.lease_s = lease_s

    def run(self, op: Operation[Any]) -> Any:
        ctx = OpContext(self.clock(), "replica-a", self.lease_s, 16, 64)
        self.ws.expired = [
            r.id
            for r in self.ws.rows.values()
            if r.state == S.RUNNING and r.lease_expires_at and r.lease_expires_at < ctx.now
        ]
        return op.apply(self.ws, ctx)


def test_transition_table_matches_the_design() -> None:
    """Exactly the moves drawn in DESIGN.md, plus the two deferred work adds, are legal;
    everything else raises. Added: accepted → rejected (a task cancelled before it started, or
    deferred work given up after its attempts) and rejected → accepted (a refused key deferred
    again as a new task); DESIGN's diagram does not draw them."""
    legal = {
        (None, S.RUNNING),
        (None, S.REJECTED),
        (None, S.ACCEPTED),
        (S.ACCEPTED, S.RUNNING),
        (S.ACCEPTED, S.REJECTED),
        (S.RUNNING, S.SUCCEEDED),
        (S.RUNNING, S.FAILED),
        (S.RUNNING, S.UNKNOWN),
        (S.RUNNING, S.REJECTED),
        (S.REJECTED, S.RUNNING),
        (S.REJECTED, S.ACCEPTED),
        (S.UNKNOWN, S.SUCCEEDED),
        (S.UNKNOWN, S.FAILED),
        (S.UNKNOWN, S.ACCEPTED),
        (S.UNKNOWN, S.BLOCKED),
        (S.FAILED, S.ACCEPTED),
        (S.FAILED, S.BLOCKED),
        (S.BLOCKED, S.SUCCEEDED),
        (S.BLOCKED, S.FAILED),
        (S.BLOCKED, S.ACCEPTED),
    }
    for origin in [None, *S]:
        for target in S:
            assert is_legal(origin, target) == ((origin, target) in legal), (origin, target)
    with pytest.raises(IllegalTransition, match="succeeded → running"):
        check_transition("e1", S.SUCCEEDED, S.RUNNING)


def test_expired_lease_never_becomes_accepted_or_succeeded() -> None:
    """Running only leaves for succeeded/failed (the owner) or unknown — never accepted."""
    assert not is_legal(S.RUNNING, S.ACCEPTED)
    assert not is_legal(S.UNKNOWN, S.RUNNING)


def test_claim_kinds_in_memory() -> None:
    """new, in_progress, replay, mismatch and needs_reconciliation come from the entry's state."""
    ledger = MemoryLedger()
    new = ledger.run(Claim(claim_request("k")))
    assert new.kind == "new"
    assert ledger.run(Claim(claim_request("k"))).kind == "in_progress"
    assert ledger.run(Claim(claim_request("k", fingerprint="b" * 64))).kind == "mismatch"
    ledger.run(Finish(new.entry.id, 1, "succeeded", b"ok", None))
    assert ledger.run(Claim(claim_request("k"))).kind == "replay"
    lost = ledger.run(Claim(claim_request("lost")))
    ledger.run(MarkUnknown(lost.entry.id, 1, "timeout"))
    assert ledger.run(Claim(claim_request("lost"))).kind == "needs_reconciliation"


def test_stale_finish_leaves_a_note_and_changes_nothing_else() -> None:
    """A stale finish adds one evidence row and does not touch the entry's state or outcome."""
    ledger = MemoryLedger()
    entry = ledger.run(Claim(claim_request("k"))).entry
    ledger.clock.advance(11)
    assert ledger.run(Sweep()) == 1
    before = ledger.ws.rows[entry.id].values()
    with pytest.raises(StaleToken):
        ledger.run(Finish(entry.id, 1, "succeeded", b"x" * 100, None))
    assert ledger.ws.rows[entry.id].values() == before
    note = ledger.ws.history[-1]
    assert (note["from_state"], note["to_state"], note["reason"]) == (
        "unknown",
        "unknown",
        "stale_report",
    )
    assert '"outcome_bytes": 100' in note["evidence"]
    assert "outcome_b64" not in note["evidence"]  # over max_outcome_bytes: only its hash


@pytest.mark.parametrize("late", ["requeue", "await_input"])
def test_a_lapsed_deferred_attempt_stays_unknown_whatever_its_owner_reports(late: str) -> None:
    """Deferred work whose lease lapsed may have run: its owner's late requeue (or question) is
    refused as stale, and it stays unknown rather than going back in line."""
    ledger = MemoryLedger()
    entry = ledger.run(Defer(claim_request("k"), b"request", 10, 10)).entry
    claimed = ledger.run(ClaimDeferred(entry.id))
    ledger.clock.advance(11)
    token = claimed.fencing_token
    op: Operation[Any] = (
        Requeue(entry.id, token, "not executed: 429", 1.0)
        if late == "requeue"
        else AwaitInput(entry.id, token, b"which one?", 64)
    )
    with pytest.raises(StaleToken):
        ledger.run(op)
    row = ledger.ws.rows[entry.id]
    assert (row.state, row.request) == (S.UNKNOWN, b"request")
    assert [h["reason"] for h in ledger.ws.history[-2:]] == ["lease_expired", "stale_report"]


def test_finish_of_missing_entry() -> None:
    """An id that is not in the ledger raises EntryNotFound."""
    with pytest.raises(EntryNotFound):
        MemoryLedger().run(Finish("nope", 1, "succeeded", None, None))


def test_accepted_with_an_owner_is_in_progress() -> None:
    """Accepted work the proxy owns (deferred) is in progress; only an ownerless one is claimed."""
    ledger = MemoryLedger()
    entry = ledger.run(Claim(claim_request("k"))).entry
    ledger.run(MarkUnknown(entry.id, 1, "timeout"))
    ledger.run(Resolve(entry.id, "retry", None, "op"))
    ledger.ws.rows[entry.id].owner = "replica-b"
    assert ledger.run(Claim(claim_request("k"))).kind == "in_progress"


_KEYS = st.sampled_from(["k0", "k1", "k2"])
_FINGERPRINTS = st.sampled_from(["a" * 64, "b" * 64])
_OPS = st.one_of(
    st.tuples(st.just("claim"), _KEYS, _FINGERPRINTS),
    st.tuples(st.just("claim_nokey"), st.none(), _FINGERPRINTS),
    st.tuples(st.just("finish"), _KEYS, st.sampled_from(["succeeded", "failed"]), st.booleans()),
    st.tuples(st.just("mark_unknown"), _KEYS, st.booleans()),
    st.tuples(st.just("renew"), _KEYS, st.booleans()),
    st.tuples(st.just("expire"), st.floats(0, 30)),
    st.tuples(st.just("resolve"), _KEYS, st.sampled_from(["succeeded", "failed", "retry"])),
    st.tuples(st.just("reject"), _KEYS, _FINGERPRINTS),
    st.tuples(st.just("release"), _KEYS, st.booleans()),
)


def apply_random(ledger: MemoryLedger, step: tuple[Any, ...]) -> None:
    """Run one random step; refusals must be typed ledger errors."""
    ws = ledger.ws
    name, key = step[0], step[1]
    row = None
    if isinstance(key, str):
        row = ws.find("acme", "mail", key)
    token = 0 if row is None else row.fencing_token
    entry_id = "missing" if row is None else row.id
    try:
        if name == "claim":
            ledger.run(Claim(claim_request(key, fingerprint=step[2])))
        elif name == "claim_nokey":
            ledger.run(Claim(claim_request(None, fingerprint=step[2])))
        elif name == "finish":
            ledger.run(Finish(entry_id, token if step[3] else token - 1, step[2], b"o", None))
        elif name == "mark_unknown":
            ledger.run(MarkUnknown(entry_id, token if step[2] else token - 1, "timeout"))
        elif name == "renew":
            ledger.run(Renew(entry_id, token if step[2] else token - 1))
        elif name == "expire":
            ledger.clock.advance(step[1])
            ledger.run(Sweep())
        elif name == "resolve":
            ledger.run(Resolve(entry_id, step[2], "note", "op", max_attempts=2))
        elif name == "reject":
            ledger.run(RecordRejection(claim_request(key, fingerprint=step[2]), "busy", "g", 1.0))
        elif name == "release":
            ledger.run(ReleaseUnsent(entry_id, token if step[2] else token - 1, "429", 1.0))
    except LedgerError:
        pass  # a refusal: what matters is that the ledger is still consistent


def check_invariants(ws: WorkingSet, seen: set[str]) -> None:
    """Every entry is in a known state, reached through legal moves only, and none is lost."""
    assert seen <= set(ws.rows), "an entry disappeared"
    keys = [(r.tenant, r.upstream, r.idempotency_key) for r in ws.rows.values()]
    assert len(keys) == len(set(keys)), "two entries share a key in one scope"
    by_entry: dict[str, list[dict[str, Any]]] = {}
    for h in ws.history:
        by_entry.setdefault(h["entry_id"], []).append(h)
    for row in ws.rows.values():
        state = S(row.state)
        history = by_entry[row.id]
        assert history[0]["from_state"] is None
        current: S | None = None
        for h in history:
            assert h["from_state"] == (None if current is None else current.value)
            target = S(h["to_state"])
            if target is not current:
                assert is_legal(current, target), (current, target)
            else:
                assert h["reason"] in ("stale_report", "rejected_again")
            current = target
        assert current is state
        if state is S.RUNNING:
            assert row.owner is not None
            assert row.lease_expires_at is not None
            assert row.fencing_token >= 1
        if state in TERMINAL or state in NEEDS_RECONCILIATION:
            assert row.lease_expires_at is None
        tokens = [h["fencing_token"] for h in history]
        assert tokens == sorted(tokens), "a fencing token went backwards"


@settings(max_examples=300, deadline=None)
@given(st.lists(_OPS, max_size=25))
def test_random_operations_keep_the_ledger_consistent(steps: list[tuple[Any, ...]]) -> None:
    """Random sequences never reach an illegal state, never lose an entry, never fork a key."""
    ledger = MemoryLedger()
    seen: set[str] = set()
    for step in steps:
        apply_random(ledger, step)
        check_invariants(ledger.ws, seen)
        seen |= set(ledger.ws.rows)
