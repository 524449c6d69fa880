"""The ledger's write operations as pure decisions over a batch's working set.

Each operation says which rows it needs (`declare`), then decides against the loaded rows
(`apply`), changing them and appending history, or raising a `LedgerError` that fails only its own
caller. An operation validates before it changes anything, so a refused operation leaves the
working set as it found it — except a stale owner's report, which is kept as evidence on purpose.

Fencing tokens: a token names one lease. It is bumped when a lease begins (a claim starts an
attempt) and whenever the entry changes hands without its holder (lease expiry, mark_unknown,
operator resolve), so a stale holder's finish can never overwrite a newer decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal, Protocol, TypeVar

from ledger.batch import (
    EntryRow,
    Needs,
    OpContext,
    WorkingSet,
    cap_text,
    describe_report,
    internal_key,
    new_entry_id,
    stored_outcome,
)
from ledger.errors import EntryNotFound, IllegalTransition, StaleToken
from ledger.states import NEEDS_RECONCILIATION, TERMINAL, EntryState
from ledger.views import ClaimRequest, ClaimResult, EntryView, Outcome

__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "Claim",
    "Finish",
    "MarkUnknown",
    "Operation",
    "RecordRejection",
    "ReleaseUnsent",
    "Renew",
]

T_co = TypeVar("T_co", covariant=True)
DEFAULT_MAX_ATTEMPTS = 3
"""Retry budget of an entry: an operator retry past this many attempts blocks the entry."""

_S = EntryState


class Operation(Protocol[T_co]):
    """One write, batched with others into a single transaction."""

    def declare(self, needs: Needs) -> None:
        """Add the rows this operation must see to `needs`."""

    def apply(self, ws: WorkingSet, ctx: OpContext) -> T_co:
        """Decide against the loaded rows; raise a `LedgerError` to refuse."""


def _get(ws: WorkingSet, entry_id: str) -> EntryRow:
    row = ws.rows.get(entry_id)
    if row is None:
        raise EntryNotFound(entry_id)
    return row


def _declare_key(needs: Needs, req: ClaimRequest) -> None:
    """The entry `req`'s idempotency key names, if it has one (a keyless call starts a new one)."""
    if req.idempotency_key is not None:
        needs.keys.add((req.tenant, req.upstream, req.idempotency_key))


def _lease_end(ctx: OpContext) -> timedelta:
    return timedelta(seconds=ctx.lease_s)


def _new_row(
    req: ClaimRequest, ctx: OpContext, state: EntryState, entry_id: str | None = None
) -> EntryRow:
    entry_id = entry_id or new_entry_id(ctx.now)
    key = req.idempotency_key
    return EntryRow(
        id=entry_id,
        tenant=req.tenant,
        upstream=req.upstream,
        tool=req.tool,
        idempotency_key=internal_key(entry_id) if key is None else key,
        key_source="none" if key is None else req.key_source,
        fingerprint=req.fingerprint,
        arguments=cap_text(req.arguments, ctx.max_argument_bytes),
        state=state,
        attempt=0,
        owner=None,
        lease_expires_at=None,
        fencing_token=0,
        work_class=req.work_class,
        run_id=req.run_id,
        trace_id=req.trace_id,
        created_at=ctx.now,
        updated_at=ctx.now,
        started_at=None,
        finished_at=None,
        outcome=None,
        outcome_hash=None,
        outcome_retained=True,
        error=None,
        retry_after_s=None,
        note=None,
        operator_retries=0,
    )


_WINDOWED = frozenset({_S.SUCCEEDED, _S.FAILED, _S.REJECTED})
"""States whose entry stops answering for its key once the claim's dedup window has passed."""


def _current_row(ws: WorkingSet, req: ClaimRequest, ctx: OpContext) -> EntryRow | None:
    """The entry answering for the request's key, if any. A closed entry whose last transition
    is older than the request's dedup window gives the key up (it stays in the history)."""
    if req.idempotency_key is None:
        return None
    row = ws.find(req.tenant, req.upstream, req.idempotency_key)
    window = req.dedup_window_s
    if row is None or window is None or row.state not in _WINDOWED:
        return row
    if row.updated_at >= ctx.now - timedelta(seconds=window):
        return row
    ws.release_key(row)
    evidence = {"dedup_window_s": window, "last_transition": row.updated_at.isoformat()}
    ws.record(row, row.state, at=ctx.now, actor=ctx.owner, reason="key_released", evidence=evidence)
    return None


def _start_attempt(row: EntryRow, req: ClaimRequest, ctx: OpContext) -> None:
    """Make `row` running under a fresh lease owned by `ctx.owner`, for `req`'s caller."""
    _begin_lease(row, ctx)
    row.work_class, row.run_id, row.trace_id = req.work_class, req.run_id, req.trace_id


def _begin_lease(row: EntryRow, ctx: OpContext) -> None:
    """Make `row` running as a new attempt under a fresh lease owned by `ctx.owner`."""
    row.state = _S.RUNNING
    row.attempt += 1
    row.fencing_token += 1
    row.owner = ctx.owner
    row.lease_expires_at = ctx.now + _lease_end(ctx)
    row.started_at = ctx.now
    row.finished_at = None
    row.outcome, row.outcome_hash, row.outcome_retained = None, None, True
    row.error = None
    row.retry_after_s = None


def _expire_if_lapsed(ws: WorkingSet, row: EntryRow, ctx: OpContext, *, actor: str) -> bool:
    """A running entry whose lease has run out becomes `unknown` (token bumped) — whoever
    notices first, the sweeper or its late owner. Returns whether it did."""
    lease = row.lease_expires_at
    if row.state != _S.RUNNING or lease is None or lease >= ctx.now:
        return False
    evidence: dict[str, object] = {
        "owner": row.owner,
        "lease_expires_at": lease.isoformat(),
        "stale_token": row.fencing_token,
    }
    row.state = _S.UNKNOWN
    row.fencing_token += 1
    row.lease_expires_at = None
    row.error = "lease expired"
    ws.touch(row, ctx.now)
    ws.record(row, _S.RUNNING, at=ctx.now, actor=actor, reason="lease_expired", evidence=evidence)
    return True


def _refuse_stale(
    ws: WorkingSet, row: EntryRow, ctx: OpContext, token: int, report: Mapping[str, object]
) -> StaleToken:
    """Keep a stale holder's report as a note in the history; return the error to raise."""
    evidence = {"report": report, "token": token, "current_token": row.fencing_token}
    ws.record(row, row.state, at=ctx.now, actor=ctx.owner, reason="stale_report", evidence=evidence)
    return StaleToken(row.id, token, row.fencing_token, row.state)


def _owned_running(
    ws: WorkingSet,
    ctx: OpContext,
    entry_id: str,
    token: int,
    report: Mapping[str, object],
    target: EntryState,
    why: str,
    *,
    with_request: bool = False,
) -> EntryRow:
    """The running entry whose lease `token` still names (and, `with_request`, that still holds
    its deferred request). A lapsed lease turns it unknown first, so a late report never
    revives it.

    Raises:
        EntryNotFound: no such entry.
        StaleToken: `token` no longer names its lease (`report` is kept as a note).
        IllegalTransition: it is not running (to `target`, `why`).
    """
    row = _get(ws, entry_id)
    _expire_if_lapsed(ws, row, ctx, actor=ctx.owner)
    if token != row.fencing_token:
        raise _refuse_stale(ws, row, ctx, token, report)
    if row.state != _S.RUNNING or (with_request and row.request is None):
        raise IllegalTransition(row.id, row.state, target, why)
    return row


def _set_aside(
    ws: WorkingSet,
    row: EntryRow,
    ctx: OpContext,
    *,
    reason: str,
    retry_after_s: float | None,
    evidence: dict[str, object] | None = None,
) -> None:
    """Running → rejected: this attempt certainly did nothing; its lease ends (token bumped).
    `reason` is also the entry's error."""
    row.state = _S.REJECTED
    row.fencing_token += 1
    row.lease_expires_at = None
    row.error, row.retry_after_s = reason, retry_after_s
    ws.touch(row, ctx.now)
    ws.record(row, _S.RUNNING, at=ctx.now, actor=ctx.owner, reason=reason, evidence=evidence)


@dataclass(frozen=True, slots=True)
class Claim:
    """Idempotency check and write-ahead in one step."""

    req: ClaimRequest

    def declare(self, needs: Needs) -> None:
        _declare_key(needs, self.req)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> ClaimResult:
        req = self.req
        row = _current_row(ws, req, ctx)
        if row is None:
            row = _new_row(req, ctx, _S.RUNNING)
            _start_attempt(row, req, ctx)
            ws.insert(row)
            ws.record(row, None, at=ctx.now, actor=ctx.owner, reason="claimed")
            return ClaimResult("new", row.view())
        if row.fingerprint != req.fingerprint:
            return ClaimResult("mismatch", row.view())
        state = _S(row.state)
        if state in TERMINAL:
            return ClaimResult("replay", row.view())
        if state in NEEDS_RECONCILIATION:
            return ClaimResult("needs_reconciliation", row.view())
        # An operator retry leaves the entry accepted with no owner, waiting for this send;
        # accepted work with an owner is the proxy's own deferred work, already on its way.
        if state is _S.REJECTED or (state is _S.ACCEPTED and row.owner is None):
            if state is _S.REJECTED:  # a task cancelled or given up is over: its id goes
                row.task_id, row.request = None, None
            _start_attempt(row, req, ctx)
            ws.touch(row, ctx.now)
            reason = "claimed_after_rejection" if state is _S.REJECTED else "claimed_retry"
            ws.record(row, state, at=ctx.now, actor=ctx.owner, reason=reason)
            return ClaimResult("new", row.view())
        return ClaimResult("in_progress", row.view())


@dataclass(frozen=True, slots=True)
class Finish:
    """The owner's report of a confirmed outcome, conditional on its fencing token."""

    entry_id: str
    token: int
    state: Literal["succeeded", "failed"]
    outcome: Outcome
    error: str | None

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView:
        row = _get(ws, self.entry_id)
        target = _S(self.state)
        _expire_if_lapsed(ws, row, ctx, actor=ctx.owner)  # a late finish never revives it
        if self.token != row.fencing_token:
            report = {"op": "finish", "state": self.state}
            report |= describe_report(self.outcome, self.error, ctx.max_outcome_bytes)
            raise _refuse_stale(ws, row, ctx, self.token, report)
        if row.state != _S.RUNNING:
            raise IllegalTransition(row.id, row.state, target, "only a running entry is finished")
        row.state = target
        row.outcome, row.outcome_hash, row.outcome_retained = stored_outcome(
            self.outcome, ctx.max_outcome_bytes
        )
        row.error = self.error
        row.finished_at = ctx.now
        row.lease_expires_at = None
        ws.touch(row, ctx.now)
        ws.record(row, _S.RUNNING, at=ctx.now, actor=ctx.owner, reason="finished")
        return row.view()


@dataclass(frozen=True, slots=True)
class MarkUnknown:
    """The owner gives up on knowing the outcome (timeout or lost connection after sending)."""

    entry_id: str
    token: int
    reason: str

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView:
        row = _get(ws, self.entry_id)
        if self.token != row.fencing_token:
            report = {"op": "mark_unknown", "reason": self.reason}
            raise _refuse_stale(ws, row, ctx, self.token, report)
        if row.state != _S.RUNNING:
            raise IllegalTransition(
                row.id, row.state, _S.UNKNOWN, "only a running entry turns unknown"
            )
        row.state = _S.UNKNOWN
        row.fencing_token += 1
        row.lease_expires_at = None
        row.error = self.reason
        ws.touch(row, ctx.now)
        ws.record(row, _S.RUNNING, at=ctx.now, actor=ctx.owner, reason=self.reason)
        return row.view()


@dataclass(frozen=True, slots=True)
class ReleaseUnsent:
    """The owner knows the call was certainly not executed (refused before it was sent, or
    answered "not processed"): running → rejected, so the same key may run again later."""

    entry_id: str
    token: int
    reason: str
    retry_after_s: float | None

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView:
        report = {"op": "release_unsent", "reason": self.reason}
        why = "only a running entry is released"
        row = _owned_running(ws, ctx, self.entry_id, self.token, report, _S.REJECTED, why)
        _set_aside(
            ws,
            row,
            ctx,
            reason=self.reason,
            retry_after_s=self.retry_after_s,
            evidence={"retry_after_s": self.retry_after_s},
        )
        return row.view()


@dataclass(frozen=True, slots=True)
class Renew:
    """Extend a running lease by `lease_s` from now; False if the lease is no longer ours."""

    entry_id: str
    token: int

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> bool:
        row = ws.rows.get(self.entry_id)
        if row is None or row.fencing_token != self.token or row.state != _S.RUNNING:
            return False
        if _expire_if_lapsed(ws, row, ctx, actor=ctx.owner):
            return False  # too late: an expired lease is never extended
        row.lease_expires_at = ctx.now + _lease_end(ctx)
        ws.touch(row, ctx.now)
        return True


@dataclass(frozen=True, slots=True)
class RecordRejection:
    """A refusal as a durable fact. Returns None when the key already names a live entry.

    `entry_id` is the id a new entry takes (the refusal's answer may name it before the write);
    a key that already names an entry keeps that entry's own id."""

    req: ClaimRequest
    reason: str
    scope: str
    retry_after_s: float
    entry_id: str | None = None

    def declare(self, needs: Needs) -> None:
        _declare_key(needs, self.req)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView | None:
        req = self.req
        evidence = {"reason": self.reason, "scope": self.scope, "retry_after_s": self.retry_after_s}
        row = _current_row(ws, req, ctx)
        if row is None:
            row = _new_row(req, ctx, _S.REJECTED, self.entry_id)
            row.error, row.retry_after_s = self.reason, self.retry_after_s
            ws.insert(row)
            ws.record(row, None, at=ctx.now, actor=ctx.owner, reason="rejected", evidence=evidence)
            return row.view()
        if row.state != _S.REJECTED or row.fingerprint != req.fingerprint:
            return None  # never clobber a live or finished entry (nor another call's key)
        row.error, row.retry_after_s = self.reason, self.retry_after_s
        ws.touch(row, ctx.now)
        ws.record(
            row,
            _S.REJECTED,
            at=ctx.now,
            actor=ctx.owner,
            reason="rejected_again",
            evidence=evidence,
        )
        return row.view()
