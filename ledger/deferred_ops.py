"""Deferred work's write operations (see `ledger.operations` for the model they follow).

Deferred work is admitted and durable before it runs: `Defer` records the whole request in an
`accepted` entry with an unguessable task id; `ClaimDeferred` is its write-ahead (accepted →
running under a fresh lease, as any call's claim), taken by exactly one replica: the row is read
with `FOR UPDATE SKIP LOCKED` on PostgreSQL, so a row another replica is claiming is skipped, and
the decision is made on the row as committed. `Requeue` puts an attempt that certainly did not run
back in line (running → rejected → accepted); `FinishDeferred` records the result and forgets the
request; `CancelDeferred` refuses work that has not started (accepted → rejected), or work that
waits for input. Work waiting for input is `ledger.deferred_input`'s.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from typing import Literal

from ledger.batch import EntryRow, Needs, OpContext, WorkingSet
from ledger.deferred_rows import AcceptedCounts, ClaimableRows
from ledger.entry_rules import (
    begin_lease,
    current_row,
    declare_key,
    get_row,
    new_row,
    owned_running,
    set_aside,
)
from ledger.operations import Finish, payload_of
from ledger.states import NEEDS_RECONCILIATION, TERMINAL, EntryState
from ledger.views import ClaimRequest, EntryView, Outcome

__all__ = [
    "CANCELLED",
    "INPUT_REQUIRED",
    "CancelDeferred",
    "CancelKind",
    "CancelResult",
    "ClaimDeferred",
    "Defer",
    "DeferKind",
    "DeferResult",
    "FinishDeferred",
    "NoteUpstreamTask",
    "Requeue",
    "new_task_id",
    "waits_for_input",
]

_S = EntryState
CANCELLED = "cancelled"
"""The `error` of deferred work its caller cancelled before it started."""
INPUT_REQUIRED = "input_required"
"""The `error` of deferred work parked until its caller answers the tool's question."""

DeferKind = Literal[
    "accepted", "existing", "replay", "mismatch", "needs_reconciliation", "in_progress", "full"
]
CancelKind = Literal["cancelled", "started", "finished"]


def new_task_id() -> str:
    """A task handle: 192 random bits, URL-safe (it names a `/jobs/{id}` path too)."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True, slots=True)
class DeferResult:
    """What became of a request to defer work.

    "accepted": the entry is accepted with the request, under `entry.task_id`. "existing": the
    key already names deferred work that has not started (its task). "full": the accepted work of
    `scope` ("tenant:<t>" or "upstream:<u>") is at its bound; nothing was written. The other kinds
    are a claim's (`ledger.views.ClaimKind`): the key's entry answers for it.
    """

    kind: DeferKind
    entry: EntryView | None
    scope: str | None = None


@dataclass(frozen=True, slots=True)
class CancelResult:
    """ "cancelled": it had not started and never will; "started" or "finished": too late."""

    kind: CancelKind
    entry: EntryView


def waits_for_input(row: EntryRow | EntryView) -> bool:
    """Parked by `AwaitInput` and not answered (nor cancelled) since (a row, or a caller's view)."""
    return row.state == _S.REJECTED and row.error == INPUT_REQUIRED and row.request is not None


def _count(ws: WorkingSet, name: str, key: str) -> int:
    counts: dict[str, int] = ws.facts.setdefault(name, {})
    return counts.get(key, 0)


def _bump(ws: WorkingSet, row: EntryRow, delta: int) -> None:
    for name, key in (("accepted_by_tenant", row.tenant), ("accepted_by_upstream", row.upstream)):
        counts: dict[str, int] = ws.facts.setdefault(name, {})
        counts[key] = counts.get(key, 0) + delta


@dataclass(frozen=True, slots=True)
class Defer:
    """Record `request` as accepted work under a new task id, within the bounds of accepted work
    per tenant and per upstream (counted in the same transaction)."""

    req: ClaimRequest
    request: bytes
    max_per_tenant: int
    max_per_upstream: int

    @property
    def payload_bytes(self) -> int:
        return len(self.request) + len(self.req.arguments or "")

    def declare(self, needs: Needs) -> None:
        declare_key(needs, self.req)
        AcceptedCounts.of(needs).add(self.req.tenant, self.req.upstream)

    def _full(self, ws: WorkingSet) -> str | None:
        if _count(ws, "accepted_by_tenant", self.req.tenant) >= self.max_per_tenant:
            return f"tenant:{self.req.tenant}"
        if _count(ws, "accepted_by_upstream", self.req.upstream) >= self.max_per_upstream:
            return f"upstream:{self.req.upstream}"
        return None

    def apply(self, ws: WorkingSet, ctx: OpContext) -> DeferResult:
        row = current_row(ws, self.req, ctx)
        if row is not None:
            settled = self._settled(row)
            if settled is not None:
                return settled
        if (scope := self._full(ws)) is not None:
            return DeferResult("full", None, scope)
        if row is None:
            row = new_row(self.req, ctx, _S.ACCEPTED)
            self._attach(row, ctx, new_task=True)
            ws.insert(row)
            ws.record(row, None, at=ctx.now, actor=ctx.owner, reason="deferred")
        else:
            before = _S(row.state)  # rejected, or accepted by an operator's retry
            self._attach(row, ctx, new_task=before is _S.REJECTED or row.task_id is None)
            row.state = _S.ACCEPTED
            ws.touch(row, ctx.now)
            reason = "deferred_after_rejection" if before is _S.REJECTED else "deferred_retry"
            ws.record(row, before, at=ctx.now, actor=ctx.owner, reason=reason)
        _bump(ws, row, 1)
        return DeferResult("accepted", row.view())

    def _settled(self, row: EntryRow) -> DeferResult | None:
        """The answer when the key's entry decides it (None: it may be deferred now)."""
        if row.fingerprint != self.req.fingerprint:
            return DeferResult("mismatch", row.view())
        state = _S(row.state)
        if state in TERMINAL:
            return DeferResult("replay", row.view())
        if state in NEEDS_RECONCILIATION:
            return DeferResult("needs_reconciliation", row.view())
        if state is _S.ACCEPTED and row.request is not None:
            return DeferResult("existing", row.view())
        if state is _S.RUNNING or (state is _S.ACCEPTED and row.owner is not None):
            return DeferResult("in_progress", row.view())
        return None

    def _attach(self, row: EntryRow, ctx: OpContext, *, new_task: bool) -> None:
        row.owner = ctx.owner  # accepted work with an owner is deferred work, not a retry's wait
        row.request = self.request
        if new_task:
            row.task_id = new_task_id()
        row.work_class, row.run_id, row.trace_id = (
            self.req.work_class,
            self.req.run_id,
            self.req.trace_id,
        )


@dataclass(frozen=True, slots=True)
class ClaimDeferred:
    """Write-ahead of deferred work: accepted → running under a fresh lease owned by this
    replica. Returns None when the entry is not (or no longer) waiting: claimed by another
    replica, cancelled, or finished."""

    entry_id: str

    def declare(self, needs: Needs) -> None:
        ClaimableRows.of(needs).add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView | None:
        row = ws.rows.get(self.entry_id)
        if row is None or row.state != _S.ACCEPTED or row.request is None:
            return None
        begin_lease(row, ctx)  # its work class, run and trace are the ones `Defer` kept
        ws.touch(row, ctx.now)
        ws.record(row, _S.ACCEPTED, at=ctx.now, actor=ctx.owner, reason="claimed_deferred")
        return row.view()


@dataclass(frozen=True, slots=True)
class Requeue:
    """A deferred attempt that certainly did not run goes back in line: running → rejected (this
    attempt) → accepted (the work), same task, same request. With `give_up` it stays rejected
    (the attempts are spent, or the request cannot be sent) and its request is forgotten."""

    entry_id: str
    token: int
    reason: str
    retry_after_s: float | None
    give_up: bool = False

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView:
        report = {"op": "requeue", "reason": self.reason}
        why = "only running deferred work is put back in line"
        row = owned_running(
            ws, ctx, self.entry_id, self.token, report, _S.ACCEPTED, why, with_request=True
        )
        set_aside(
            ws,
            row,
            ctx,
            reason=self.reason,
            retry_after_s=self.retry_after_s,
            evidence={"retry_after_s": self.retry_after_s},
        )
        if self.give_up:
            row.request = None
            row.finished_at = ctx.now
            return row.view()
        row.state = _S.ACCEPTED
        ws.record(row, _S.REJECTED, at=ctx.now, actor=ctx.owner, reason="deferred_again")
        return row.view()


@dataclass(frozen=True, slots=True)
class FinishDeferred:
    """`Finish` for deferred work: results are kept up to `max_bytes` (its own cap, not
    `max_outcome_bytes`: nobody has seen this answer yet), and the request is forgotten."""

    entry_id: str
    token: int
    state: Literal["succeeded", "failed"]
    outcome: Outcome
    error: str | None
    max_bytes: int

    @property
    def payload_bytes(self) -> int:
        return payload_of(self.outcome)

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView:
        finish = Finish(self.entry_id, self.token, self.state, self.outcome, self.error)
        finish.apply(ws, replace(ctx, max_outcome_bytes=self.max_bytes))
        row = ws.rows[self.entry_id]
        row.request = None
        return row.view()


@dataclass(frozen=True, slots=True)
class CancelDeferred:
    """Deferred work that has not started never will: accepted → rejected, its request
    forgotten. Work that started (or finished) is left as it is."""

    entry_id: str
    actor: str
    reason: str = CANCELLED

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> CancelResult:
        row = get_row(ws, self.entry_id)
        state = _S(row.state)
        if waits_for_input(row):
            row.request = None
            row.fencing_token += 1
            row.error = self.reason
            row.finished_at = ctx.now
            ws.touch(row, ctx.now)
            ws.record(row, _S.REJECTED, at=ctx.now, actor=self.actor, reason=self.reason)
            return CancelResult("cancelled", row.view())
        if state is not _S.ACCEPTED or row.request is None:
            over = state in TERMINAL or state is _S.REJECTED
            return CancelResult("finished" if over else "started", row.view())
        row.state = _S.REJECTED
        row.request = None
        row.fencing_token += 1
        row.error = self.reason
        row.retry_after_s = None
        row.finished_at = ctx.now
        ws.touch(row, ctx.now)
        _bump(ws, row, -1)
        ws.record(row, _S.ACCEPTED, at=ctx.now, actor=self.actor, reason=self.reason)
        return CancelResult("cancelled", row.view())


@dataclass(frozen=True, slots=True)
class NoteUpstreamTask:
    """The upstream answered the call with a task of its own: the entry keeps its id (its
    outcome is the handle the caller got), so later `tasks/*` for it are known to be the
    upstream's and to belong to this entry's tenant."""

    entry_id: str
    task_id: str

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView:
        row = get_row(ws, self.entry_id)
        row.task_id = self.task_id
        ws.touch(row, ctx.now)
        evidence = {"task_id": self.task_id}
        ws.record(
            row, row.state, at=ctx.now, actor=ctx.owner, reason="upstream_task", evidence=evidence
        )
        return row.view()
