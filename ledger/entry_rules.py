"""The rules every ledger write applies to one entry's row: finding it, creating it, beginning
and ending its lease, noticing a lapsed lease, refusing a stale holder, setting an attempt aside.

Shared by the operations (`ledger.operations`, `ledger.deferred_ops`, `ledger.deferred_input`,
`ledger.reconcile_ops`); pure decisions over a batch's working set, like them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta

from ledger.batch import (
    EntryRow,
    Needs,
    OpContext,
    WorkingSet,
    cap_text,
    internal_key,
    new_entry_id,
)
from ledger.errors import EntryNotFound, IllegalTransition, StaleToken
from ledger.states import EntryState
from ledger.views import ClaimRequest

__all__ = [
    "WINDOWED",
    "begin_lease",
    "current_row",
    "declare_key",
    "expire_if_lapsed",
    "get_row",
    "lease_end",
    "new_row",
    "owned_running",
    "refuse_stale",
    "set_aside",
    "start_attempt",
]

_S = EntryState


def get_row(ws: WorkingSet, entry_id: str) -> EntryRow:
    row = ws.rows.get(entry_id)
    if row is None:
        raise EntryNotFound(entry_id)
    return row


def declare_key(needs: Needs, req: ClaimRequest) -> None:
    """The entry `req`'s idempotency key names, if it has one (a keyless call starts a new one)."""
    if req.idempotency_key is not None:
        needs.keys.add((req.tenant, req.upstream, req.idempotency_key))


def lease_end(ctx: OpContext) -> timedelta:
    return timedelta(seconds=ctx.lease_s)


def new_row(
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


WINDOWED = frozenset({_S.SUCCEEDED, _S.FAILED, _S.REJECTED})
"""States whose entry stops answering for its key once the claim's dedup window has passed."""


def current_row(ws: WorkingSet, req: ClaimRequest, ctx: OpContext) -> EntryRow | None:
    """The entry answering for the request's key, if any. A closed entry whose last transition
    is older than the request's dedup window gives the key up (it stays in the history)."""
    if req.idempotency_key is None:
        return None
    row = ws.find(req.tenant, req.upstream, req.idempotency_key)
    window = req.dedup_window_s
    if row is None or window is None or row.state not in WINDOWED:
        return row
    if row.updated_at >= ctx.now - timedelta(seconds=window):
        return row
    ws.release_key(row)
    evidence = {"dedup_window_s": window, "last_transition": row.updated_at.isoformat()}
    ws.record(row, row.state, at=ctx.now, actor=ctx.owner, reason="key_released", evidence=evidence)
    return None


def start_attempt(row: EntryRow, req: ClaimRequest, ctx: OpContext) -> None:
    """Make `row` running under a fresh lease owned by `ctx.owner`, for `req`'s caller."""
    begin_lease(row, ctx)
    row.work_class, row.run_id, row.trace_id = req.work_class, req.run_id, req.trace_id


def begin_lease(row: EntryRow, ctx: OpContext) -> None:
    """Make `row` running as a new attempt under a fresh lease owned by `ctx.owner`."""
    row.state = _S.RUNNING
    row.attempt += 1
    row.fencing_token += 1
    row.owner = ctx.owner
    row.lease_expires_at = ctx.now + lease_end(ctx)
    row.started_at = ctx.now
    row.finished_at = None
    row.outcome, row.outcome_hash, row.outcome_retained = None, None, True
    row.error = None
    row.retry_after_s = None


def expire_if_lapsed(ws: WorkingSet, row: EntryRow, ctx: OpContext, *, actor: str) -> bool:
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


def refuse_stale(
    ws: WorkingSet, row: EntryRow, ctx: OpContext, token: int, report: Mapping[str, object]
) -> StaleToken:
    """Keep a stale holder's report as a note in the history; return the error to raise."""
    evidence = {"report": report, "token": token, "current_token": row.fencing_token}
    ws.record(row, row.state, at=ctx.now, actor=ctx.owner, reason="stale_report", evidence=evidence)
    return StaleToken(row.id, token, row.fencing_token, row.state)


def owned_running(
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
    row = get_row(ws, entry_id)
    expire_if_lapsed(ws, row, ctx, actor=ctx.owner)
    if token != row.fencing_token:
        raise refuse_stale(ws, row, ctx, token, report)
    if row.state != _S.RUNNING or (with_request and row.request is None):
        raise IllegalTransition(row.id, row.state, target, why)
    return row


def set_aside(
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
