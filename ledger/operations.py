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

from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from ledger.batch import (
    Needs,
    OpContext,
    WorkingSet,
    describe_report,
    stored_outcome,
)
from ledger.entry_rules import (
    current_row,
    declare_key,
    expire_if_lapsed,
    get_row,
    lease_end,
    new_row,
    owned_running,
    refuse_stale,
    set_aside,
    start_attempt,
)
from ledger.errors import IllegalTransition
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
    "payload_of",
]

T_co = TypeVar("T_co", covariant=True)
DEFAULT_MAX_ATTEMPTS = 3
"""Retry budget of an entry: an operator retry past this many attempts blocks the entry."""

_S = EntryState


def payload_of(outcome: Outcome) -> int:
    """The bytes an outcome carries into a write (a digest or nothing carries none)."""
    return len(outcome) if isinstance(outcome, bytes) else 0


class Operation(Protocol[T_co]):
    """One write, batched with others into a single transaction.

    An operation that carries something sizeable (arguments, an outcome, a request) says how
    many bytes in a `payload_bytes` property: the writer keeps each batch's total bounded."""

    def declare(self, needs: Needs) -> None:
        """Add the rows this operation must see to `needs`."""

    def apply(self, ws: WorkingSet, ctx: OpContext) -> T_co:
        """Decide against the loaded rows; raise a `LedgerError` to refuse."""


@dataclass(frozen=True, slots=True)
class Claim:
    """Idempotency check and write-ahead in one step."""

    req: ClaimRequest

    @property
    def payload_bytes(self) -> int:
        """What this write carries into its batch (see `ledger.writer`)."""
        return len(self.req.arguments or "")

    def declare(self, needs: Needs) -> None:
        declare_key(needs, self.req)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> ClaimResult:
        req = self.req
        row = current_row(ws, req, ctx)
        if row is None:
            row = new_row(req, ctx, _S.RUNNING)
            start_attempt(row, req, ctx)
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
            start_attempt(row, req, ctx)
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

    @property
    def payload_bytes(self) -> int:
        return payload_of(self.outcome)

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView:
        row = get_row(ws, self.entry_id)
        target = _S(self.state)
        expire_if_lapsed(ws, row, ctx, actor=ctx.owner)  # a late finish never revives it
        if self.token != row.fencing_token:
            report = {"op": "finish", "state": self.state}
            report |= describe_report(self.outcome, self.error, ctx.max_outcome_bytes)
            raise refuse_stale(ws, row, ctx, self.token, report)
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
        row = get_row(ws, self.entry_id)
        if self.token != row.fencing_token:
            report = {"op": "mark_unknown", "reason": self.reason}
            raise refuse_stale(ws, row, ctx, self.token, report)
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
        row = owned_running(ws, ctx, self.entry_id, self.token, report, _S.REJECTED, why)
        set_aside(
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
        if expire_if_lapsed(ws, row, ctx, actor=ctx.owner):
            return False  # too late: an expired lease is never extended
        row.lease_expires_at = ctx.now + lease_end(ctx)
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

    @property
    def payload_bytes(self) -> int:
        return len(self.req.arguments or "")

    def declare(self, needs: Needs) -> None:
        declare_key(needs, self.req)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView | None:
        req = self.req
        evidence = {"reason": self.reason, "scope": self.scope, "retry_after_s": self.retry_after_s}
        row = current_row(ws, req, ctx)
        if row is None:
            row = new_row(req, ctx, _S.REJECTED, self.entry_id)
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
