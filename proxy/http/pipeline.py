"""The HTTP pipeline: classify → budget → admit → claim (side effects) → forward → record → reply.

One `HttpCall` per proxied request. Read-only and inference calls go `_run_plain`; side-effecting
ones go `_run_side_effect`, which writes the `running` entry ahead of the first upstream byte and
records what became of it. Both use `proxy.http.attempts` for the attempts (retries, each with an
admission slot) and for relaying the answer.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import time
from dataclasses import replace
from typing import Any, Literal

from aiohttp import web

from ledger import EntryView, LedgerError, LedgerStore, LedgerUnavailable, Outcome, StaleToken
from policies import answers
from policies.admission import Refusal
from policies.answers import CODE_INVALID_REQUEST, Answer
from policies.keys import KeyDecision, decide_key
from policies.retry import not_executed_statuses
from policies.token_budget import TokenBudget
from proxy.errors import (
    UpstreamError,
    UpstreamLost,
    UpstreamNotReached,
    UpstreamPressure,
    UpstreamTimeout,
)
from proxy.http.attempts import CLIENT_GONE, admit, cooldown_remaining, forward, relay
from proxy.http.context import HttpCall
from proxy.http.jobs import defer_or_start
from proxy.http.outcomes import KeptBody, not_processed, outcome_of, replay_response
from proxy.runtime.leases import (
    AttemptNotClaimed,
    Lease,
    claim_refusal,
    keep_lease,
    next_attempt,
    record_finish,
)
from proxy.runtime.ledger_writes import until_written
from proxy.runtime.rejections import REJECTIONS
from proxy.runtime.scheduler import AdmissionRefused
from proxy.state import CONFIG, LEDGER
from proxy.telemetry import metrics, tracing

__all__ = ["TOKEN_BUDGET", "HttpCall", "run_http_call"]


TOKEN_BUDGET = web.AppKey("token_budget", TokenBudget)


# -------------------------------------------------------------------------------- pipeline


async def run_http_call(call: HttpCall) -> web.StreamResponse:
    """Answer one proxied request (the caller's response, already sent or ready to send)."""
    if call.policy.costly and (refused := _over_budget(call)) is not None:
        return await call.answer(refused)
    if call.policy.side_effect:
        try:
            call.key = _decide_key(call)
        except (TypeError, ValueError) as exc:  # NaN, keys equal after NFC: no canonical form
            reason, message = "invalid_arguments", f"the body has no canonical form: {exc}"
            return await call.answer(answers.bad_request(CODE_INVALID_REQUEST, reason, message))
        call.span.set_attribute("interlock.idempotency.key_hash", tracing.hash_key(call.key.key))
    if call.respond_async and (deferred := await defer_or_start(call)) is not None:
        return deferred
    try:
        if call.slot is None:
            call.slot = await admit(call)
    except AdmissionRefused as exc:
        entry_id = None
        if call.policy.side_effect:  # written behind the answer: nothing ran, nothing waits
            entry_id = call.app[REJECTIONS].record(call.claim_request(), exc.refusal)
        return await call.answer(_refusal_answer(call, exc.refusal, entry_id))
    try:
        if call.policy.side_effect:
            return await _run_side_effect(call)
        return await _run_plain(call)
    finally:
        call.release_slot()


async def _run_plain(call: HttpCall) -> web.StreamResponse:
    try:
        opened = await forward(call)
    except AdmissionRefused as exc:
        return await call.answer(_refusal_answer(call, exc.refusal))
    except UpstreamPressure as exc:
        return await _answer_pressure(call, exc)
    except UpstreamError as exc:
        return await call.answer(_failure_answer(exc))
    try:
        await relay(call, opened)
    except UpstreamError as exc:
        opened.response.close()
        return await call.fail(_failure_answer(exc), opened)
    finally:
        opened.response.release()
    _record_usage(call)
    return await _end(call)


async def _run_side_effect(call: HttpCall) -> web.StreamResponse:
    handle = call.app[LEDGER]
    key = call.key.key if call.key else None
    if handle.store is None:
        return await call.answer(answers.ledger_unavailable(handle.error or "not open", key))
    store = handle.store
    try:
        with tracing.child_span("interlock.ledger.claim") as span:
            claim = await store.claim(call.claim_request())
            span.set_attribute("interlock.idempotency.outcome", claim.kind)
    except LedgerUnavailable as exc:
        return await call.answer(answers.ledger_unavailable(str(exc), key))
    entry = claim.entry
    outcome = "replayed" if claim.kind == "replay" else claim.kind
    metrics.idempotency_outcome(outcome, call.upstream.name)
    call.span.set_attributes(
        {
            "interlock.idempotency.outcome": outcome,
            "interlock.ledger.entry_id": entry.id,
            "interlock.ledger.state": str(entry.state),
            "interlock.attempt": entry.attempt,
        }
    )
    if claim.kind == "replay":
        call.release_slot()
        return await _replay(call, entry)
    if (refusal := claim_refusal(claim, key)) is not None:
        return await call.answer(refusal)
    lease = Lease(entry.id, entry.fencing_token)
    call.before_retry = functools.partial(_next_attempt, call, store, lease)
    async with keep_lease(store, lease, call.app[CONFIG].ledger.lease_s):
        return await _forward_and_record(call, store, lease)


async def _next_attempt(call: HttpCall, store: LedgerStore, lease: Lease) -> None:
    with tracing.child_span("interlock.ledger.claim") as span:
        claim = await next_attempt(store, lease, call.claim_request())
        span.set_attribute("interlock.attempt", claim.entry.attempt)
    call.span.set_attribute("interlock.attempt", claim.entry.attempt)


async def _forward_and_record(
    call: HttpCall, store: LedgerStore, lease: Lease
) -> web.StreamResponse:
    key = call.key.key if call.key else None
    entry_id = lease.entry_id
    ledger = _EntryRecorder(call, store, lease)
    try:
        opened = await forward(call)
    except AttemptNotClaimed as lost:
        # The failed attempt was released (it did not run); the next could not be claimed.
        claim = lost.claim
        if claim is not None and claim.kind == "replay":  # another send finished it meanwhile
            return await _replay(call, claim.entry)
        refusal = None if claim is None else claim_refusal(claim, key)
        if refusal is None:  # the ledger could not be asked
            return await call.answer(answers.ledger_unavailable(str(lost), key))
        return await call.answer(refusal)
    except AdmissionRefused as exc:
        await ledger.release(f"retry refused: {exc.refusal.reason}", exc.refusal.retry_after_s)
        return await call.answer(_refusal_answer(call, exc.refusal))
    except UpstreamPressure as exc:
        if exc.status not in not_executed_statuses(call.upstream):
            # e.g. a gateway's 503 after its backend acted: no proof that nothing ran
            detail = f"upstream answered HTTP {exc.status}"
            await ledger.unknown(detail)
            return await call.answer(answers.outcome_unknown(key, entry_id, detail))
        await ledger.release(f"not executed: {exc}", cooldown_remaining(call) or None)
        return await _answer_pressure(call, exc)
    except UpstreamNotReached as exc:
        await ledger.release(f"not executed: {exc}", cooldown_remaining(call) or None)
        return await call.answer(_failure_answer(exc))
    except UpstreamLost as exc:
        detail = "timed out" if isinstance(exc, UpstreamTimeout) else "connection lost"
        await ledger.unknown(f"{detail}: {exc}")
        return await call.answer(answers.outcome_unknown(key, entry_id, detail))
    except BaseException:
        # cancelled (shutdown) or a bug after write-ahead: the call may have been sent
        await ledger.unknown("interrupted after write-ahead")
        raise
    status = opened.response.status
    # the upstream says it did not act: its answer is relayed and the key may be sent again
    not_executed = not_processed(status, call.upstream)
    try:
        if status >= 500 and not not_executed:  # it may have acted before failing
            detail = f"upstream answered HTTP {status}"
            await ledger.unknown(detail)
            return await call.answer(answers.outcome_unknown(key, entry_id, detail))
        kept = KeptBody(cap := call.app[CONFIG].ledger.max_outcome_bytes)
        await relay(call, opened, keep=kept)
    except UpstreamError as exc:
        await ledger.unknown(f"answer cut off: {exc}")
        return await call.fail(answers.outcome_unknown(key, entry_id, "answer cut off"), opened)
    except BaseException:
        await ledger.unknown("interrupted while relaying the answer")
        raise
    finally:
        opened.response.release()
    if not_executed:
        await ledger.release(f"not executed: upstream answered HTTP {status}", None)
    else:
        # A 4xx is the upstream's answer (a declined card stays declined): it is recorded as
        # `failed` and replayed to a retry with the same key, like a success would be.
        outcome = outcome_of(status, opened.response.headers.items(), kept, cap)
        await ledger.finish(outcome, failed=status >= 400)
    return await _end(call)


async def _replay(call: HttpCall, entry: EntryView) -> web.StreamResponse:
    """A finished entry's stored answer; without one (too large, or resolved by an operator) a
    409 `outcome_not_retained` with its state: never a success the caller could misread."""
    if entry.outcome is None:
        key = call.key.key if call.key else None
        return await call.answer(answers.outcome_not_retained(key, entry.id, str(entry.state)))
    return replay_response(entry.outcome)


def _refusal_answer(call: HttpCall, refusal: Refusal, entry_id: str | None = None) -> Answer:
    """429, or 503 when the upstream's cooldown outlasts the caller's deadline. `entry_id`
    names the `rejected` entry being written behind it (only ever a new one)."""
    remaining = call.deadline - time.monotonic()
    down = refusal.reason == "cooldown" and refusal.retry_after_s > remaining
    key = call.key.key if call.key else None
    return answers.refused(
        refusal.reason,
        refusal.scope,
        refusal.retry_after_s,
        idempotency_key=key,
        upstream_down=down,
        entry_id=entry_id,
    )


def _over_budget(call: HttpCall) -> Answer | None:
    budget = call.app[TOKEN_BUDGET]
    verdict = budget.check(call.attrs.tenant)
    if verdict.allowed:
        return None
    scope = f"tenant:{call.attrs.tenant}"
    if call.app[CONFIG].mode == "observe":  # counted and traced, not enforced
        metrics.would_reject("budget", scope, call.upstream.name)
        call.span.set_attribute("interlock.would_reject", "budget")
        return None
    metrics.budget_exhausted(call.attrs.tenant)
    metrics.refusal("budget", scope, call.upstream.name)
    call.span.set_attributes(
        {
            "interlock.admission.decision": "rejected",
            "interlock.admission.reason": "budget",
            "interlock.admission.scope": scope,
        }
    )
    return answers.refused("budget", scope, verdict.retry_after_s)


def _decide_key(call: HttpCall) -> KeyDecision:
    """The call's key and fingerprint. The operation is "METHOD /path"; the arguments are the
    JSON body (a field recipe picks from it), another body by its digest, and the query string
    when there is one."""
    arguments = call.payload
    if arguments is None and isinstance(call.body, bytes) and call.body:
        arguments = {"body_sha256": hashlib.sha256(call.body).hexdigest()}
    query = call.request.rel_url.raw_query_string
    if query:
        arguments = {"query": query, "body": arguments}
    return decide_key(
        call.policy.key,
        explicit=call.attrs.idempotency_key,
        tenant=call.attrs.tenant,
        upstream=call.upstream.name,
        operation=call.tool,
        arguments=arguments,
        run_id=call.attrs.run_id,
        window_s=call.policy.dedup_window_s,
    )


async def _answer_pressure(call: HttpCall, error: UpstreamPressure) -> web.StreamResponse:
    """The upstream pushed back and no retry was left: tell the caller when to come back."""
    remaining = cooldown_remaining(call)
    headers = {k: v for k, v in error.headers.items() if k.lower() == "x-should-retry"}
    if remaining > 0:
        scope = f"upstream:{call.upstream.name}"
        metrics.refusal("cooldown", scope, call.upstream.name)
        return await call.answer(
            _refusal_answer(call, Refusal("cooldown", scope, remaining)), headers
        )
    return await call.answer(
        answers.upstream_failed("upstream_pressure", f"upstream answered HTTP {error.status}"),
        headers,
    )


def _failure_answer(error: UpstreamError) -> Answer:
    if isinstance(error, UpstreamNotReached):
        return answers.upstream_failed("upstream_unreachable", str(error))
    if isinstance(error, UpstreamTimeout):
        return replace(answers.upstream_failed("upstream_timeout", str(error)), http_status=504)
    return answers.upstream_failed("upstream_lost", str(error))


def _record_usage(call: HttpCall) -> None:
    usage = call.usage
    if usage is None:
        return
    call.app[TOKEN_BUDGET].record(call.attrs.tenant, usage.total_tokens)
    attributes: dict[str, Any] = {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
    }
    if usage.model:
        attributes["gen_ai.response.model"] = usage.model
    call.span.set_attributes(attributes)


async def _end(call: HttpCall) -> web.StreamResponse:
    response = call.downstream.response
    assert response is not None
    call.span.set_attribute("http.response.status_code", response.status)
    if response.status >= 500:
        tracing.mark_error(call.span, str(response.status))
    with contextlib.suppress(*CLIENT_GONE):
        await call.downstream.end()
    return response


# --------------------------------------------------------------------------------- ledger


class _EntryRecorder:
    """Writes what became of a running entry; the ledger failing never fails the answer."""

    def __init__(self, call: HttpCall, store: LedgerStore, lease: Lease) -> None:
        self._call, self._store, self._lease = call, store, lease

    async def finish(self, outcome: Outcome, *, failed: bool = False) -> None:
        state: Literal["succeeded", "failed"] = "failed" if failed else "succeeded"
        lease = self._lease
        await self._write(state, record_finish(self._store, lease, state=state, outcome=outcome))

    async def unknown(self, reason: str) -> None:
        lease = self._lease
        await self._write(
            "unknown", self._store.mark_unknown(lease.entry_id, lease.token, reason=reason)
        )

    async def release(self, reason: str, retry_after_s: float | None) -> None:
        await self._write(
            "rejected",
            self._store.release_unsent(
                self._lease.entry_id,
                self._lease.token,
                reason=reason,
                retry_after_s=retry_after_s,
            ),
        )

    async def _write(self, state: str, operation: Any) -> None:
        span = self._call.span
        try:
            with tracing.child_span(
                "interlock.ledger.finish", attributes={tracing.Attr.LEDGER_STATE: state}
            ):
                # a caller that goes away, or shutdown, must not leave the entry `running`
                await until_written(operation)
            span.set_attribute("interlock.ledger.state", state)
        except StaleToken as exc:
            span.set_attribute("interlock.ledger.state", str(exc.state))
        except LedgerError as exc:
            # the lease runs out and the sweeper marks the entry unknown: the record stays honest
            span.set_attribute("interlock.ledger.error", str(exc))
