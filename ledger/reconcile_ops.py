"""Operations that decide an entry's fate without its owner: the operator's resolve, the
sweeper that turns expired leases into `unknown`, and retention's purge (see
`ledger.operations` for the model)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from ledger.batch import EntryRow, Needs, OpContext, WorkingSet
from ledger.entry_rules import expire_if_lapsed, get_row
from ledger.errors import IllegalTransition
from ledger.operations import DEFAULT_MAX_ATTEMPTS
from ledger.states import NEEDS_RECONCILIATION, TERMINAL, EntryState, check_transition
from ledger.views import EntryView

__all__ = ["Purge", "Resolve", "Sweep"]

_S = EntryState


@dataclass(frozen=True, slots=True)
class Resolve:
    """An operator's reconciliation: succeeded, failed, or retry (a new attempt, same key).

    The operator's retry budget is `max_attempts` attempts: the first and `max_attempts - 1`
    operator retries. A retry past it blocks the entry instead (from unknown or failed); a blocked
    entry is retried only with a larger `max_attempts`. The proxy's own hand-overs of attempts
    that certainly did not run (rejected → running) are not counted.
    """

    entry_id: str
    as_: Literal["succeeded", "failed", "retry"]
    note: str | None
    actor: str
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView:
        row = get_row(ws, self.entry_id)
        before = _S(row.state)
        evidence: dict[str, object] = {"note": self.note, "attempt": row.attempt}
        if self.as_ == "retry":
            target = self._retry_target(row, before)
            evidence |= {
                "max_attempts": self.max_attempts,
                "operator_retries": row.operator_retries,
                "previous_error": row.error,
                "previous_outcome_sha256": row.outcome_hash,
            }
        else:
            target = _S(self.as_)
            if before not in NEEDS_RECONCILIATION:
                raise IllegalTransition(
                    row.id,
                    before,
                    target,
                    "only unknown or blocked entries are resolved as succeeded or failed",
                )
            check_transition(row.id, before, target)
        row.state = target
        row.note = self.note
        row.fencing_token += 1
        row.lease_expires_at = None
        if target is _S.ACCEPTED:
            row.owner = None  # waits for the caller's next send (see Claim)
            row.operator_retries += 1
        if target in TERMINAL:
            row.finished_at = ctx.now
        ws.touch(row, ctx.now)
        ws.record(
            row,
            before,
            at=ctx.now,
            actor=self.actor,
            reason=f"resolved_{self.as_}",
            evidence=evidence,
        )
        return row.view()

    def _retry_target(self, row: EntryRow, before: EntryState) -> EntryState:
        if before not in (_S.UNKNOWN, _S.FAILED, _S.BLOCKED):
            raise IllegalTransition(
                row.id, before, _S.ACCEPTED, "only unknown, failed or blocked entries are retried"
            )
        used = 1 + row.operator_retries
        if used < self.max_attempts:
            return _S.ACCEPTED
        if before is _S.BLOCKED:
            raise IllegalTransition(
                row.id,
                before,
                _S.ACCEPTED,
                f"retry budget spent ({used} of {self.max_attempts} attempts); "
                "resolve as succeeded or failed, or allow more attempts",
            )
        return _S.BLOCKED


@dataclass(frozen=True, slots=True)
class Sweep:
    """Turn running entries whose lease expired into unknown, bumping their fencing token."""

    limit: int = 500

    def declare(self, needs: Needs) -> None:
        needs.sweep_limit = max(needs.sweep_limit, self.limit)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> int:
        swept = 0
        for entry_id in ws.expired[: self.limit]:
            # skipped when an earlier operation of this batch renewed or finished it
            if expire_if_lapsed(ws, ws.rows[entry_id], ctx, actor=f"sweeper:{ctx.owner}"):
                swept += 1
        return swept


@dataclass(frozen=True, slots=True)
class Purge:
    """Delete up to `limit` closed entries (succeeded, failed, rejected) unchanged for
    `older_than` by the database's clock; returns how many. Rows another operation of the same
    batch uses are left for a later purge."""

    older_than: timedelta
    limit: int

    def declare(self, needs: Needs) -> None:
        needs.purge = (self.older_than, self.limit)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> int:
        doomed = {i for i in ws.purgeable if i not in ws.rows} - ws.deleted
        ws.deleted |= doomed
        return len(doomed)
