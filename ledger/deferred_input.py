"""Deferred work whose tool asked its user for input (the 2026-07-28 tasks extension's
`input_required`): `AwaitInput` parks the attempt (running → rejected: nothing ran) keeping the
request and, as the outcome, the upstream's question; `ProvideInput` puts it back in line with the
request that carries the answers (rejected → accepted), to run as its next attempt. A caller's
`CancelDeferred` ends work that waits for input too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ledger.batch import Needs, OpContext, WorkingSet, stored_outcome
from ledger.deferred_ops import INPUT_REQUIRED, _bump, waits_for_input
from ledger.entry_rules import get_row, owned_running, set_aside
from ledger.states import EntryState
from ledger.views import EntryView

__all__ = ["AwaitInput", "InputKind", "InputResult", "ProvideInput"]

_S = EntryState
InputKind = Literal["accepted", "not_waiting"]


@dataclass(frozen=True, slots=True)
class InputResult:
    """ "accepted": the answers are in its request and it is back in line; "not_waiting": it
    was not waiting for input (or waits for a newer question than the one answered)."""

    kind: InputKind
    entry: EntryView


@dataclass(frozen=True, slots=True)
class AwaitInput:
    """The deferred attempt's tool asked its user for input, so nothing was done: running →
    rejected under `INPUT_REQUIRED`, keeping the request (to re-send with the answers) and, as
    the outcome, the upstream's question (up to `max_bytes`)."""

    entry_id: str
    token: int
    question: bytes
    max_bytes: int

    @property
    def payload_bytes(self) -> int:
        return len(self.question)

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> EntryView:
        report = {"op": "await_input"}
        why = "only running deferred work waits for input"
        row = owned_running(
            ws, ctx, self.entry_id, self.token, report, _S.REJECTED, why, with_request=True
        )
        row.outcome, row.outcome_hash, row.outcome_retained = stored_outcome(
            self.question, self.max_bytes
        )
        set_aside(ws, row, ctx, reason=INPUT_REQUIRED, retry_after_s=None)
        return row.view()


@dataclass(frozen=True, slots=True)
class ProvideInput:
    """The caller answered the question of the entry it read at fencing token `token`: its
    request becomes `request` (the one carrying the answers) and it goes back in line
    (rejected → accepted). Anything else (not waiting, or a newer question) is "not_waiting"."""

    entry_id: str
    token: int
    request: bytes
    actor: str

    @property
    def payload_bytes(self) -> int:
        return len(self.request)

    def declare(self, needs: Needs) -> None:
        needs.ids.add(self.entry_id)

    def apply(self, ws: WorkingSet, ctx: OpContext) -> InputResult:
        row = get_row(ws, self.entry_id)
        if not waits_for_input(row) or row.fencing_token != self.token:
            return InputResult("not_waiting", row.view())
        row.state = _S.ACCEPTED
        row.request = self.request
        row.outcome, row.outcome_hash, row.outcome_retained = None, None, True
        row.error, row.retry_after_s = None, None
        ws.touch(row, ctx.now)
        _bump(ws, row, 1)
        ws.record(row, _S.REJECTED, at=ctx.now, actor=self.actor, reason="input_provided")
        return InputResult("accepted", row.view())
