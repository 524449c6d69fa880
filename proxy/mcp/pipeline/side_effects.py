"""The side-effecting half of the `tools/call` pipeline: claim (write-ahead) → forward → record.

Invariants kept here:
- the `running` entry is committed before a byte goes upstream; no ledger, no call (fail closed);
- a call that may have executed and whose answer never came (timeout, lost connection, client gone,
  proxy shutting down) becomes `unknown`, is answered as such, and is never re-sent by us;
- a call that certainly did not execute (connect refused, a status that proves it — 429, the
  upstream's `not_executed_statuses` —, admission refused on a retry) is released back to
  `rejected`, so the same key may be sent again; any other 5xx (a 503 from a gateway whose backend
  acted) makes it `unknown`.
"""

from __future__ import annotations

import asyncio
import functools
import json
from contextlib import AbstractContextManager

from opentelemetry.trace import Span

from ledger import ClaimResult, LedgerError, LedgerStore, LedgerUnavailable, StaleToken
from policies import answers
from policies.retry import not_executed_statuses
from proxy.errors import (
    UpstreamAnswerTooLarge,
    UpstreamError,
    UpstreamLost,
    UpstreamNotReached,
    UpstreamPressure,
    UpstreamRefused,
    UpstreamTimeout,
)
from proxy.mcp.pipeline.attempts import ForwardPlan, forward_with_retries
from proxy.mcp.pipeline.context import JsonObject, ToolCall
from proxy.mcp.pipeline.outcomes import decode_replay, encode_outcome, outcome_state
from proxy.mcp.wire.tasks import created_task_id
from proxy.runtime.client_gone import cancelled_when
from proxy.runtime.leases import (
    AttemptNotClaimed,
    Lease,
    claim_refusal,
    keep_lease,
    next_attempt,
    record_finish,
)
from proxy.runtime.ledger_writes import until_written
from proxy.runtime.scheduler import AdmissionRefused
from proxy.state import CONFIG, LEDGER, SCHEDULER
from proxy.telemetry import metrics, tracing

__all__ = ["run_side_effect"]


async def run_side_effect(call: ToolCall, plan: ForwardPlan) -> JsonObject:
    """Claim the key, forward while holding the lease, record the outcome, answer."""
    store = call.ctx.app[LEDGER].store
    if store is None:
        return _fail_closed(call, call.ctx.app[LEDGER].error or "ledger not open")
    try:
        claim = await _claim(call, store)
    except LedgerUnavailable as exc:
        return _fail_closed(call, str(exc))
    early = _answer_claim(call, claim)
    if early is not None:
        return early
    lease = Lease(claim.entry.id, claim.entry.fencing_token)
    plan.before_retry = functools.partial(_next_attempt, call, store, lease)
    entry_id = lease.entry_id
    try:
        async with keep_lease(store, lease, call.ctx.app[CONFIG].ledger.lease_s):
            response = await _forward_until_client_leaves(call, plan)
    except AttemptNotClaimed as lost:
        return _answer_lost_attempt(call, lost)
    except AdmissionRefused as refused:
        r = refused.refusal
        await _release(call, store, lease, f"retry refused: {r.reason}", r.retry_after_s)
        raise
    except UpstreamPressure as exc:
        if exc.status not in not_executed_statuses(call.ctx.upstream):  # no proof nothing ran
            await _mark_unknown(call, store, lease, f"upstream HTTP {exc.status}")
            return call.answer(answers.outcome_unknown(call.idempotency_key, entry_id, str(exc)))
        await _release(call, store, lease, f"not executed: {exc}", _retry_after(call, exc))
        raise
    except UpstreamNotReached as exc:
        await _release(call, store, lease, f"not executed: {exc}", _retry_after(call, exc))
        raise
    except UpstreamRefused as exc:
        not_executed = not_executed_statuses(call.ctx.upstream)
        if exc.status >= 500 and exc.status not in not_executed:  # it may have acted first
            await _mark_unknown(call, store, lease, f"upstream HTTP {exc.status}")
            return call.answer(answers.outcome_unknown(call.idempotency_key, entry_id, str(exc)))
        await _release(call, store, lease, f"not executed: {exc}", None)
        raise
    except UpstreamLost as exc:
        detail = (
            "timed out"
            if isinstance(exc, UpstreamTimeout)
            else str(exc)
            if isinstance(exc, UpstreamAnswerTooLarge)
            else "connection lost"
        )
        await _mark_unknown(call, store, lease, f"{detail}: {exc}")
        return call.answer(answers.outcome_unknown(call.idempotency_key, entry_id, detail))
    except BaseException:
        # Cancellation (client gone, shutdown) or a bug after write-ahead: the call may have been
        # sent, so the entry must say `unknown`, never stay `running` or become anything else.
        await _mark_unknown(call, store, lease, "interrupted after write-ahead")
        raise
    return await _record(call, store, lease, response)


async def _next_attempt(call: ToolCall, store: LedgerStore, lease: Lease) -> None:
    with tracing.child_span("interlock.ledger.claim") as span:
        claim = await next_attempt(store, lease, call.claim_request())
        span.set_attribute("interlock.attempt", claim.entry.attempt)
    call.span.set_attribute("interlock.attempt", claim.entry.attempt)


def _answer_lost_attempt(call: ToolCall, lost: AttemptNotClaimed) -> JsonObject:
    """The previous attempt was released (it did not run); the next could not be claimed."""
    if lost.claim is not None:
        answer = _answer_claim(call, lost.claim)
        if answer is not None:
            return answer
    return _fail_closed(call, str(lost))


def _finish_span(state: str) -> AbstractContextManager[Span]:
    return tracing.child_span(
        "interlock.ledger.finish", attributes={"interlock.ledger.state": state}
    )


def _retry_after(call: ToolCall, exc: UpstreamError) -> float | None:
    del exc
    remaining = call.ctx.app[SCHEDULER].cooldown_remaining(call.ctx.upstream.name)
    return remaining if remaining > 0 else None


async def _claim(call: ToolCall, store: LedgerStore) -> ClaimResult:
    with tracing.child_span("interlock.ledger.claim") as span:
        result = await store.claim(call.claim_request())
        span.set_attribute("interlock.idempotency.outcome", result.kind)
    outcome = "replayed" if result.kind == "replay" else result.kind
    metrics.idempotency_outcome(outcome, call.ctx.upstream.name)
    call.span.set_attribute("interlock.idempotency.outcome", outcome)
    call.span.set_attribute("interlock.ledger.entry_id", result.entry.id)
    call.span.set_attribute("interlock.ledger.state", str(result.entry.state))
    call.span.set_attribute("interlock.attempt", result.entry.attempt)
    return result


def _answer_claim(call: ToolCall, result: ClaimResult) -> JsonObject | None:
    """The answer for a claim that must not be forwarded, or None for a new running entry."""
    if result.kind == "replay":
        entry = result.entry
        if entry.outcome is None:  # too large, or resolved by an operator: never a success
            answer = answers.outcome_not_retained(call.idempotency_key, entry.id, str(entry.state))
            return call.answer(answer)
        return decode_replay(entry, call.request_id, modern=call.ctx.modern)
    refusal = claim_refusal(result, call.idempotency_key)
    return None if refusal is None else call.answer(refusal)


async def _forward_until_client_leaves(call: ToolCall, plan: ForwardPlan) -> JsonObject:
    """Forward; in the 2026-07-28 era a client that goes away cancels the call (it becomes
    `unknown`). In the handshake era a disconnect is not a cancellation (that is what
    `notifications/cancelled` is for): the call runs on and its outcome is recorded.

    The forward runs in this task, which the client's leaving cancels (`cancelled_when`): no
    helper tasks per call."""
    if not call.ctx.modern:
        return await forward_with_retries(plan)
    try:
        with cancelled_when(call.ctx.client_gone) as trip:
            return await forward_with_retries(plan)
    except asyncio.CancelledError:
        if trip is not None and trip.absorb():
            raise UpstreamLost("the client disconnected while the call was in flight") from None
        raise


async def _mark_unknown(call: ToolCall, store: LedgerStore, lease: Lease, reason: str) -> None:
    call.span.set_attribute("interlock.ledger.state", "unknown")
    try:
        with tracing.child_span(
            "interlock.ledger.finish", attributes={"interlock.ledger.state": "unknown"}
        ):
            await until_written(store.mark_unknown(lease.entry_id, lease.token, reason=reason))
    except LedgerError as exc:
        # The lease will run out and the sweeper marks the entry unknown: the record stays honest.
        call.span.set_attribute("interlock.ledger.error", str(exc))


async def _release(
    call: ToolCall, store: LedgerStore, lease: Lease, reason: str, retry_after_s: float | None
) -> None:
    call.span.set_attribute("interlock.ledger.state", "rejected")
    try:
        with tracing.child_span(
            "interlock.ledger.finish", attributes={"interlock.ledger.state": "rejected"}
        ):
            await until_written(
                store.release_unsent(
                    lease.entry_id, lease.token, reason=reason, retry_after_s=retry_after_s
                )
            )
    except LedgerError as exc:
        call.span.set_attribute("interlock.ledger.error", str(exc))


async def _record(
    call: ToolCall, store: LedgerStore, lease: Lease, response: JsonObject
) -> JsonObject:
    result = response.get("result")
    if isinstance(result, dict) and result.get("resultType") == "input_required":
        # The tool asked the user something and has not acted yet: the client re-sends this
        # same call with the answers, and that send must run (as the next attempt), not replay.
        await _release(call, store, lease, "input_required: the tool asked for input", None)
        return response
    state = outcome_state(response)
    error = response.get("error")
    try:
        with tracing.child_span(
            "interlock.ledger.finish", attributes={"interlock.ledger.state": state}
        ):
            # the upstream answered: its outcome is recorded even if shutdown cancels us now
            await until_written(
                record_finish(
                    store,
                    lease,
                    state="failed" if state == "failed" else "succeeded",
                    outcome=encode_outcome(response),
                    error=json.dumps(error)[:2000] if error is not None else None,
                )
            )
        call.span.set_attribute("interlock.ledger.state", state)
        if (task_id := created_task_id(response)) is not None:  # the upstream's own task
            await store.deferred.note_upstream_task(lease.entry_id, call.ctx.upstream.name, task_id)
    except StaleToken as exc:
        # Our lease ran out and the entry was marked unknown meanwhile; the upstream's answer is
        # the truth for this caller, and the ledger kept it as evidence for reconciliation.
        call.span.set_attribute("interlock.ledger.state", exc.state)
    except LedgerError as exc:
        call.span.set_attribute("interlock.ledger.error", str(exc))
    return response


def _fail_closed(call: ToolCall, detail: str) -> JsonObject:
    call.span.set_attribute("interlock.ledger.state", "unavailable")
    return call.answer(answers.ledger_unavailable(detail, call.idempotency_key))
