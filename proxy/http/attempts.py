"""One proxied HTTP call's attempts: admission per attempt, sending, and relaying the answer.

`forward` runs the attempts (tenacity via `policies.retry`): each attempt holds an admission slot
of its own, so a retry waits out an upstream's cooldown or is refused like any new call; an
upstream 429/503/529 starts that cooldown for every caller of the upstream, and the cooldown is
what honours the upstream's Retry-After (the retry loop itself only adds jittered backoff).
An attempt lasts until the response head *and* the first body chunk arrived, so a retry is only
ever made before the caller has seen a byte of the upstream's answer. `relay` then copies the
rest as it arrives, reading token usage on the way for model calls.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import tenacity
from opentelemetry.trace import SpanKind

from policies.admission import Refusal
from policies.retry import not_executed_statuses, retrying
from proxy.errors import UpstreamError, UpstreamNotReached, UpstreamPressure
from proxy.http.context import HttpCall
from proxy.http.downstream import sse_error_event
from proxy.http.headers import request_headers, response_headers
from proxy.http.outcomes import KeptBody
from proxy.http.upstream import HTTP_POOLS, Opened, open_upstream, read_chunk
from proxy.http.usage import StreamUsage, usage_from_json
from proxy.runtime.retries import run_attempts
from proxy.runtime.scheduler import AdmissionRefused, Slot
from proxy.runtime.upstream_pressure import describe_failure, retry_cap, start_cooldown
from proxy.state import CONFIG, RETRY_BUDGETS, SCHEDULER
from proxy.telemetry import metrics, tracing

__all__ = [
    "CLIENT_GONE",
    "admit",
    "cooldown_remaining",
    "forward",
    "relay",
]

CLIENT_GONE = (ConnectionError, RuntimeError)
"""What writing to a caller that went away raises."""

_DEFAULT_COOLDOWN_S = 1.0
_MAX_CONNECT_S = 10.0
_USAGE_BODY_CAP = 8 * 1024 * 1024
_ERROR_BODY_CAP = 64 * 1024


# ------------------------------------------------------------------------------ admission


async def admit(call: HttpCall) -> Slot:
    """An admission slot for the next attempt (raises AdmissionRefused)."""
    scheduler = call.app[SCHEDULER]
    with tracing.child_span("interlock.queue") as span:
        try:
            slot = await scheduler.admit(call.admission(), on_wait=call.downstream.comment)
        except AdmissionRefused as exc:
            refusal = exc.refusal
            span.set_attributes(_refusal_attributes(refusal))
            call.span.set_attributes(_refusal_attributes(refusal))
            metrics.refusal(refusal.reason, refusal.scope, call.upstream.name)
            metrics.admission("rejected", call.upstream.name, refusal.reason)
            raise
        decision = "queued" if slot.decision == "queued_then_admitted" else "admitted"
        metrics.admission(decision, call.upstream.name)
        metrics.queue_wait(call.upstream.name, call.work_class, slot.queue_wait_s)
        if slot.would_reject is not None:
            refusal = slot.would_reject
            metrics.would_reject(refusal.reason, refusal.scope, call.upstream.name)
        if call.span.is_recording():
            attributes: dict[str, Any] = {
                "interlock.admission.decision": "observed" if slot.would_reject else decision,
                "interlock.queue.wait_s": slot.queue_wait_s,
            }
            if slot.would_reject is not None:
                attributes["interlock.would_reject"] = slot.would_reject.reason
            span.set_attributes(attributes)
            call.span.set_attributes(attributes)
    return slot


def _refusal_attributes(refusal: Refusal) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "interlock.admission.decision": "rejected",
        "interlock.admission.reason": refusal.reason,
        "interlock.admission.scope": refusal.scope,
    }
    if refusal.reason == "cooldown":
        attributes["interlock.cooldown_s"] = refusal.retry_after_s
    return attributes


# -------------------------------------------------------------------------------- forward


async def forward(call: HttpCall) -> Opened:
    """Send the request, retrying as policy allows, until a response head and first chunk arrive.

    Raises:
        UpstreamError: the last attempt's failure when no (further) retry is allowed.
        AdmissionRefused: a retry could not be admitted again (e.g. the cooldown is too long).
    """
    budget = call.app[RETRY_BUDGETS].for_upstream(call.upstream.name)

    def loop() -> tenacity.AsyncRetrying:
        attempts = retry_cap(call.policy)
        return retrying(
            call.upstream.retry,
            side_effect=call.policy.side_effect,
            deadline=call.deadline,
            clock=time.monotonic,
            describe=describe_failure,
            budget=budget,
            max_attempts=attempts if call.retryable_body else 1,
            not_executed=not_executed_statuses(call.upstream),
            counted=True,
        )

    try:
        return await run_attempts(lambda: _attempt(call), budget, loop)
    finally:
        call.span.set_attribute("interlock.attempt", call.attempts)


async def _attempt(call: HttpCall) -> Opened:
    call.attempts += 1
    if call.attempts > 1:
        metrics.retry(call.upstream.name)
        call.release_slot()  # every attempt holds a slot of its own, and waits out a cooldown
        call.slot = await admit(call)
        if call.before_retry is not None:
            await call.before_retry()
    remaining = call.deadline - time.monotonic()
    if remaining <= 0:
        raise UpstreamNotReached("the call's deadline passed before the attempt")
    attempt_s = min(call.policy.timeout_s or call.app[CONFIG].defaults.timeout_s, remaining)
    attributes = (
        {
            "interlock.attempt": call.attempts,
            "interlock.upstream": call.upstream.name,
            "http.request.method": call.request.method,
            "server.address": call.target.host,
            "server.port": call.target.port,
        }
        if tracing.current_span().is_recording()
        else None  # no span records them
    )
    started = time.monotonic()
    with tracing.child_span(
        "interlock.upstream.attempt", attributes=attributes, kind=SpanKind.CLIENT
    ) as span:
        headers = request_headers(
            call.request.headers.items(),
            call.upstream.headers,
            identity_encoding=call.policy.costly,
            drop_credentials=bool(call.app[CONFIG].tenant_api_keys),
        )
        tracing.inject_headers(headers)
        try:
            response = await open_upstream(
                call.app[HTTP_POOLS][call.upstream.name],
                call.request.method,
                call.target,
                headers,
                call.body,
                connect_s=min(attempt_s, _MAX_CONNECT_S),
                read_s=attempt_s,
            )
        except UpstreamError as exc:
            span.set_attribute("error.type", type(exc).__name__)
            if isinstance(exc, UpstreamPressure):
                span.set_attribute("http.response.status_code", exc.status)
                start_cooldown(call.app, call.upstream.name, exc, call.span)
            raise
        span.set_attribute("http.response.status_code", response.status)
        try:
            first = await read_chunk(response)
        except BaseException as exc:
            response.close()
            span.set_attribute("error.type", type(exc).__name__)
            raise
    metrics.first_byte(call.upstream.name, time.monotonic() - started)
    return Opened(response, first)


def cooldown_remaining(call: HttpCall) -> float:
    return call.app[SCHEDULER].cooldown_remaining(call.upstream.name)


# ---------------------------------------------------------------------------------- relay


async def relay(call: HttpCall, opened: Opened, *, keep: KeptBody | None = None) -> None:
    """Copy the upstream's answer to the caller as it arrives.

    With `keep` (a side-effecting call) the body is read to the end even if the caller left, so
    the ledger records what really happened; `keep` holds it within its cap and hashes it all.

    Raises:
        UpstreamLost, UpstreamTimeout: the upstream's body was cut off or stalled.
    """
    response = opened.response
    sse = opened.response.event_stream
    stream_usage = StreamUsage() if call.policy.costly and sse else None
    usage_body = call.policy.costly and not sse
    if call.downstream.sse_opened_early and not (sse and response.status < 300):
        return await _relay_as_error_event(call, opened, keep=keep)
    if not call.downstream.committed:
        await call.downstream.start(response.status, response_headers(response.headers.items()))
    parts: list[bytes] = []
    size = 0
    client_here = True
    chunk = opened.first
    while chunk:
        if stream_usage is not None:
            stream_usage.feed(chunk)
        if keep is not None:
            keep.add(chunk)
        if usage_body and size <= _USAGE_BODY_CAP:
            parts.append(chunk)
            size += len(chunk)
        last = response.at_eof()  # then the end marker goes out with this chunk
        if client_here:
            try:
                await (call.downstream.end(chunk) if last else call.downstream.write(chunk))
            except CLIENT_GONE:
                client_here = False
                if keep is None:
                    break
        if last:
            break
        chunk = await read_chunk(response)
    if stream_usage is not None:
        call.usage = stream_usage.result()
    elif usage_body and response.status < 300 and size <= _USAGE_BODY_CAP:
        call.usage = usage_from_json(b"".join(parts))
    return None


async def _relay_as_error_event(call: HttpCall, opened: Opened, *, keep: KeptBody | None) -> None:
    """The caller already has an SSE stream open (it waited) and the upstream did not stream:
    its answer goes to the caller as one SSE `error` event, an upstream error as that error,
    anything else (a success in JSON) as `not_streamed` with the status and the body.

    With `keep` (a side effect) the whole body is read into it, so the ledger keeps the real
    answer and a repeat of the key replays it; otherwise only what the event shows is read.
    """
    parts: list[bytes] = [opened.first]
    size = len(opened.first)
    if keep is not None:
        keep.add(opened.first)
    while (keep is not None or size < _ERROR_BODY_CAP) and (
        chunk := await read_chunk(opened.response)
    ):
        if keep is not None:
            keep.add(chunk)
        if size < _ERROR_BODY_CAP:
            parts.append(chunk)
        size += len(chunk)
    whole = b"".join(parts)
    status = opened.response.status
    try:
        answer = json.loads(whole) if size <= _ERROR_BODY_CAP else None
    except (ValueError, UnicodeDecodeError):
        answer = None
    if status >= 400 and isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        event = {"error": {**answer["error"], "status": status}}
    else:
        event = {"error": _not_streamed(call, status, answer)}
    call.span.set_attribute("http.response.status_code", status)
    with contextlib.suppress(*CLIENT_GONE):
        await call.downstream.write(sse_error_event(event))


def _not_streamed(call: HttpCall, status: int, answer: Any) -> dict[str, Any]:
    """The event for an answer that is no stream: what the upstream said, and how to get it
    again (a side effect's answer is recorded under its idempotency key)."""
    message = f"the upstream answered HTTP {status} without streaming"
    error: dict[str, Any] = {"type": "not_streamed", "message": message, "status": status}
    if answer is not None:
        error["body"] = answer
    if call.policy.side_effect and call.key is not None and call.key.key is not None:
        error["message"] += "; the answer is recorded: repeat the call with the same key to get it"
        error["idempotency_key"] = call.key.key
    return error
