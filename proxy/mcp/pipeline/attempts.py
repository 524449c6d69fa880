"""Forward one admitted `tools/call` upstream: attempts, timeouts, cooldowns and safe retries.

Each attempt is a CLIENT span. An upstream 429/503/529 starts a cooldown shared by every caller of
that upstream; the next attempt re-acquires an admission slot (which waits out the cooldown within
the deadline, or refuses). Retries follow `policies.retry`: a side-effecting call is retried only
when it certainly did not execute.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

import tenacity
from aiohttp import web
from opentelemetry.trace import Span, SpanKind

from policies.admission import AdmissionRequest
from policies.model import UpstreamSpec
from policies.retry import not_executed_statuses, retrying
from proxy.errors import (
    UpstreamError,
    UpstreamNotReached,
    UpstreamPressure,
)
from proxy.runtime.retries import run_attempts
from proxy.runtime.scheduler import Slot
from proxy.runtime.upstream_pressure import describe_failure, start_cooldown
from proxy.state import RETRY_BUDGETS, SCHEDULER
from proxy.telemetry import metrics, tracing

__all__ = ["ForwardPlan", "forward_with_retries"]

JsonObject = dict[str, Any]
_DEFAULT_COOLDOWN_S = 1.0


@dataclass
class ForwardPlan:
    """Everything one forward needs; `slot` is replaced when a retry re-acquires admission."""

    app: web.Application
    upstream: UpstreamSpec
    request: JsonObject
    send_upstream: Callable[[JsonObject, float], Awaitable[JsonObject]]
    slot: Slot
    admission: AdmissionRequest
    side_effect: bool
    timeout_s: float
    deadline: float
    on_wait: Callable[[str], Awaitable[None]] | None
    span: Span
    admitted_at: float = 0.0
    """When the current slot was granted (monotonic): admission-to-answer is measured from it."""
    max_attempts: int | None = None
    """A rule's cap on this call's attempts (None: the upstream's retry settings)."""
    before_retry: Callable[[], Awaitable[None]] | None = None
    """Run before each attempt after the first, once it holds its admission slot (side
    effects: record the failed attempt and claim the next one in the ledger)."""
    attempts: int = 0


def _attempt_attributes(plan: ForwardPlan) -> dict[str, Any]:
    url = urlsplit(plan.upstream.url or "")
    return {
        "interlock.attempt": plan.attempts,
        "interlock.upstream": plan.upstream.name,
        "server.address": url.hostname,
        "server.port": url.port,
        "network.transport": "pipe" if plan.upstream.kind == "mcp_stdio" else "tcp",
    }


def _carry_trace(plan: ForwardPlan) -> None:
    """Write the trace context into the request's `params._meta`, on a copy of that path (the
    client's message stays as it arrived, its arguments shared, not deep-copied), and only when
    there is a trace: a forwarded request never grows an empty `_meta` the client did not send."""
    carrier: JsonObject = {}
    tracing.inject_meta(carrier)
    if carrier:
        params = plan.request["params"]
        meta = params.get("_meta")
        meta = {**meta, **carrier} if isinstance(meta, dict) else carrier
        plan.request = {**plan.request, "params": {**params, "_meta": meta}}


async def _attempt(plan: ForwardPlan) -> JsonObject:
    plan.attempts += 1
    if plan.attempts > 1:
        metrics.retry(plan.upstream.name)
        # Every attempt holds an admission slot of its own (and waits out a cooldown).
        plan.slot.release()
        plan.slot = await plan.app[SCHEDULER].admit(
            replace(plan.admission, arrived_at=time.monotonic()), on_wait=plan.on_wait
        )
        plan.admitted_at = time.monotonic()
        if plan.before_retry is not None:
            await plan.before_retry()
    remaining = plan.deadline - time.monotonic()
    if remaining <= 0:
        raise UpstreamNotReached("the call's deadline passed before the attempt")
    timeout = min(plan.timeout_s, remaining)
    attributes = _attempt_attributes(plan) if tracing.current_span().is_recording() else None
    with tracing.child_span(
        "interlock.upstream.attempt", attributes=attributes, kind=SpanKind.CLIENT
    ) as span:
        _carry_trace(plan)
        try:
            response = await plan.send_upstream(plan.request, timeout)
        except UpstreamError as exc:
            span.set_attribute("error.type", type(exc).__name__)
            if isinstance(exc, UpstreamPressure):
                start_cooldown(plan.app, plan.upstream.name, exc, plan.span)
            raise
    # MCP answers arrive whole (JSON, or the final SSE event): admission to the answer.
    metrics.first_byte(plan.upstream.name, time.monotonic() - plan.admitted_at)
    return response


async def forward_with_retries(plan: ForwardPlan) -> JsonObject:
    """Send `plan.request`, retrying as policy allows; returns the upstream's final response.

    Raises:
        UpstreamError: the last attempt's failure when no (further) retry is allowed.
        AdmissionRefused: a retry could not get an admission slot again (e.g. cooldown too long).
    """
    budget = plan.app[RETRY_BUDGETS].for_upstream(plan.upstream.name)

    def loop() -> tenacity.AsyncRetrying:
        return retrying(
            plan.upstream.retry,
            side_effect=plan.side_effect,
            deadline=plan.deadline,
            clock=time.monotonic,
            describe=describe_failure,
            budget=budget,
            max_attempts=plan.max_attempts,
            not_executed=not_executed_statuses(plan.upstream),
            counted=True,
        )

    try:
        return await run_attempts(lambda: _attempt(plan), budget, loop)
    finally:
        plan.span.set_attribute("interlock.attempt", plan.attempts)
