"""The `tools/call` pipeline: classify → admit → write-ahead → forward → record → answer.

The MCP transport (`proxy.mcp.transport.handoff`) hands every `tools/call` request here with two
callables: `send_upstream` forwards one JSON-RPC request and returns the upstream's final response
message (relaying the upstream's own notifications and requests to the client meanwhile), and
`notify` writes one message of the proxy's own (e.g. a progress notification) to the client's
stream. Side-effecting calls continue in `proxy.mcp.pipeline.side_effects`."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from opentelemetry.trace import Span

from policies import answers
from policies.admission import AdmissionRequest
from policies.attributes import BadAttribute, read_attributes
from policies.keys import decide_key
from proxy.errors import (
    UpstreamAnswerTooLarge,
    UpstreamLost,
    UpstreamNotReached,
    UpstreamPressure,
)
from proxy.mcp.catalog import learn_annotations, tool_annotations
from proxy.mcp.pipeline.attempts import ForwardPlan, forward_with_retries
from proxy.mcp.pipeline.context import (
    JsonObject,
    McpCallContext,
    Notify,
    OnWait,
    SendUpstream,
    ToolCall,
)
from proxy.mcp.pipeline.deferral import defer_or_start, wants_task
from proxy.mcp.pipeline.side_effects import run_side_effect
from proxy.mcp.pipeline.upstream_tasks import record_upstream_task
from proxy.mcp.wire.tasks import created_task_id
from proxy.runtime.rejections import REJECTIONS
from proxy.runtime.scheduler import AdmissionRefused, Slot
from proxy.runtime.upstream_pressure import retry_cap
from proxy.state import CONFIG, SCHEDULER, TOOL_CLASSIFIER
from proxy.telemetry import metrics, tracing

__all__ = ["McpCallContext", "Notify", "SendUpstream", "handle_tools_call"]

_LEARNING_SHARE = 0.5
"""The part of a call's deadline it may wait for the proxy's own listing of its tool."""


def _invalid_params(request: JsonObject, reason: str, message: str) -> JsonObject:
    answer = answers.bad_request(answers.CODE_INVALID_PARAMS, reason, message)
    return answer.jsonrpc_error(request.get("id"))


async def handle_tools_call(
    ctx: McpCallContext, request: JsonObject, send_upstream: SendUpstream, notify: Notify
) -> JsonObject:
    """Answer one `tools/call` request (returns the JSON-RPC response message for the client).

    Raises:
        UpstreamRefused: the upstream answered a non-2xx HTTP status the transport relays as is.
    """
    config = ctx.app[CONFIG]
    params = request.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("name"), str):
        return _invalid_params(request, "invalid_params", "tools/call needs params.name")
    raw_meta = params.get("_meta")
    meta = raw_meta if isinstance(raw_meta, dict) else {}
    try:
        attrs = read_attributes(config, ctx.headers, meta)
    except BadAttribute as exc:
        return _invalid_params(request, exc.reason, str(exc))
    tool: str = params["name"]
    arguments = params.get("arguments")  # absent is not the same call as {}
    classify = ctx.app[TOOL_CLASSIFIER]
    started = time.monotonic()  # the deadline covers the whole call, learning its tool too
    policy = classify(ctx.upstream.name, tool, tool_annotations(ctx.app, ctx.upstream.name, tool))
    if policy.source == "default" and tool_annotations(ctx.app, ctx.upstream.name, tool) is None:
        # Never listed (and no rule decides): learn the tool's annotations before defaulting,
        # for at most half the call's deadline (the rest is the call's own).
        await learn_annotations(ctx.app, ctx.upstream, wait_s=attrs.deadline_s * _LEARNING_SHARE)
        annotations = tool_annotations(ctx.app, ctx.upstream.name, tool)
        policy = classify(ctx.upstream.name, tool, annotations)
    key = None
    if policy.side_effect:  # only a side effect is ledgered, so only it needs a key
        try:
            key = decide_key(
                policy.key,
                explicit=attrs.idempotency_key,
                tenant=attrs.tenant,
                upstream=ctx.upstream.name,
                operation=tool,
                arguments=arguments,
                run_id=attrs.run_id,
                window_s=policy.dedup_window_s,
            )
        except (TypeError, ValueError) as exc:  # NaN, keys equal after NFC: no canonical form
            reason = f"arguments have no canonical form: {exc}"
            return _invalid_params(request, "invalid_arguments", reason)

    def span_attrs() -> dict[str, Any]:
        return {
            "mcp.method.name": "tools/call",
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool,
            "jsonrpc.request.id": str(request.get("id")),
            "mcp.session.id": tracing.hash_key(ctx.session_id),
            "mcp.protocol.version": ctx.protocol_version,
            "interlock.upstream": ctx.upstream.name,
            "interlock.tenant": attrs.tenant,
            "interlock.class": policy.work_class or attrs.work_class,
            "interlock.side_effect": policy.side_effect,
            "interlock.idempotency.key_hash": tracing.hash_key(
                key.key if key else attrs.idempotency_key
            ),
            "interlock.idempotency.key_source": key.source if key else None,
        }

    with _server_span(tool, span_attrs, ctx, meta) as span:
        deadline = started + attrs.deadline_s
        call = ToolCall(ctx, request, tool, arguments, meta, attrs, policy, key, deadline, span)
        return await _admit_and_run(call, send_upstream, notify)


def _server_span(
    tool: str, attributes: Callable[[], dict[str, Any]], ctx: McpCallContext, meta: JsonObject
) -> AbstractContextManager[Span]:
    """The transport's SERVER span of this request (one per call), or our own if there is none.

    `attributes` are built only for a span that records them (tracing on and sampled). A plain
    function returning the context manager, not a generator: it runs on every call.
    """
    current = tracing.current_span()
    if current.is_recording():
        tracing.set_attributes(current, attributes())
        return contextlib.nullcontext(current)
    if ctx.traced or (not tracing.tracing_on() and current.get_span_context().is_valid):
        return contextlib.nullcontext(current)  # the transport's span, not recorded: it passes on
    name = tracing.mcp_span_name("tools/call", tool)
    return tracing.call_span(name, attributes=attributes, headers=ctx.headers, meta=meta)


class _WaitProgress:
    """The proxy's own `notifications/progress` for a call that really waits (queued, cooldown).

    Nothing is sent for a call that never waits: the client then sees only the server's own
    progress. Values stay far below the server's (0.001, 0.002, …) so that the sequence on the
    token keeps increasing once the server reports its own.
    """

    __slots__ = ("_notify", "_token", "sent")

    def __init__(self, token: Any, notify: Notify) -> None:
        self._token = token
        self._notify = notify
        self.sent = 0

    async def __call__(self, state: str) -> None:
        self.sent += 1
        message = {"progressToken": self._token, "progress": self.sent / 1000, "message": state}
        await self._notify(
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": message}
        )


def _progress(call: ToolCall, notify: Notify) -> _WaitProgress | None:
    token = call.meta.get("progressToken")
    return None if token is None else _WaitProgress(token, notify)


def _admission_request(call: ToolCall) -> AdmissionRequest:
    return AdmissionRequest(
        tenant=call.attrs.tenant,
        work_class=call.work_class,
        upstream=call.ctx.upstream.name,
        run_id=call.attrs.run_id,
        cost_class=call.policy.cost_class,
        tool=call.tool,
        side_effect=call.policy.side_effect,
        deadline=call.deadline,
        arrived_at=time.monotonic(),
    )


async def _admit(call: ToolCall, request: AdmissionRequest, on_wait: OnWait | None) -> Slot:
    """Ask the scheduler for a slot. Raises AdmissionRefused."""
    with tracing.child_span("interlock.queue") as queue_span:
        slot = await call.ctx.app[SCHEDULER].admit(request, on_wait=on_wait)
        queue_span.set_attribute("interlock.queue.wait_s", slot.queue_wait_s)
    decision = "queued" if slot.decision == "queued_then_admitted" else "admitted"
    metrics.admission(decision, call.ctx.upstream.name)
    metrics.queue_wait(call.ctx.upstream.name, request.work_class, slot.queue_wait_s)
    call.span.set_attribute("interlock.admission.decision", decision)
    call.span.set_attribute("interlock.queue.wait_s", slot.queue_wait_s)
    if slot.would_reject is not None:
        refusal = slot.would_reject
        call.span.set_attribute("interlock.would_reject", refusal.reason)
        call.span.set_attribute("interlock.admission.decision", "observed")
        metrics.would_reject(refusal.reason, refusal.scope, call.ctx.upstream.name)
    return slot


def _refused(call: ToolCall, refused: AdmissionRefused, *, record: bool) -> JsonObject:
    """The refusal's answer, at once: a side-effecting call's `rejected` record is written behind
    it (nothing was executed, so nothing waits on that write)."""
    refusal = refused.refusal
    upstream = call.ctx.upstream.name
    span = call.span
    span.set_attribute("interlock.admission.decision", "rejected")
    span.set_attribute("interlock.admission.reason", refusal.reason)
    span.set_attribute("interlock.admission.scope", refusal.scope)
    if refusal.reason == "cooldown":
        span.set_attribute("interlock.cooldown_s", refusal.retry_after_s)
    metrics.refusal(refusal.reason, refusal.scope, upstream)
    metrics.admission("rejected", upstream, refusal.reason)
    entry_id = None
    if record and call.policy.side_effect:
        entry_id = call.ctx.app[REJECTIONS].record(call.claim_request(), refusal)
        if entry_id is not None:
            span.set_attribute("interlock.ledger.entry_id", entry_id)
    answer = answers.refused(
        refusal.reason,
        refusal.scope,
        refusal.retry_after_s,
        idempotency_key=call.idempotency_key,
        entry_id=entry_id,
        upstream_down=refusal.reason == "cooldown" and refusal.retry_after_s > 0,
    )
    return call.answer(answer)


def _upstream_answer(call: ToolCall, exc: UpstreamNotReached | UpstreamPressure) -> JsonObject:
    """The answer after the upstream refused or could not be reached (nothing executed)."""
    upstream = call.ctx.upstream.name
    remaining = call.ctx.app[SCHEDULER].cooldown_remaining(upstream)
    reason = "upstream" if isinstance(exc, UpstreamPressure) else "upstream_unreachable"
    metrics.refusal(reason, f"upstream:{upstream}", upstream)
    call.span.set_attribute("interlock.admission.reason", reason)
    return call.answer(
        answers.refused(
            reason,
            f"upstream:{upstream}",
            max(remaining, 1.0),
            idempotency_key=call.idempotency_key,
            upstream_down=True,
        )
    )


async def _admit_and_run(call: ToolCall, send_upstream: SendUpstream, notify: Notify) -> JsonObject:
    on_wait = _progress(call, notify)
    admission = _admission_request(call)
    slot: Slot | None = None
    if wants_task(call):  # a task handle now, unless it can start now (and did not ask)
        deferred = await defer_or_start(call, admission)
        if isinstance(deferred, dict):
            return deferred
        slot = deferred
    try:
        if slot is None:
            slot = await _admit(call, admission, on_wait)
    except AdmissionRefused as refused:
        return _refused(call, refused, record=True)
    plan = _plan(call, send_upstream, slot, admission, on_wait)
    try:
        if on_wait is not None and on_wait.sent:  # it was told it waits: now it runs
            await on_wait("running")
        if call.policy.side_effect:
            return await run_side_effect(call, plan)
        response = await forward_with_retries(plan)
        if (task_id := created_task_id(response)) is not None:  # the upstream answered a task
            await record_upstream_task(call, response, task_id)
        return response
    except AdmissionRefused as refused:  # a retry could not be admitted again
        return _refused(call, refused, record=False)
    except (UpstreamNotReached, UpstreamPressure) as exc:
        return _upstream_answer(call, exc)
    except UpstreamAnswerTooLarge as exc:  # read-only: it ran, its answer cannot be held
        return call.answer(answers.upstream_failed("response_too_large", str(exc)))
    except UpstreamLost as exc:  # read-only: nothing to reconcile, safe to repeat
        return call.answer(answers.upstream_failed("upstream_lost", str(exc)))
    finally:
        plan.slot.release()


def _plan(
    call: ToolCall,
    send_upstream: SendUpstream,
    slot: Slot,
    admission: AdmissionRequest,
    on_wait: OnWait | None,
) -> ForwardPlan:
    # The client's message goes up as it arrived (its bytes, when nothing changes it): only a
    # trace to carry changes params._meta, on a copy of that path (`attempts._carry_trace`).
    return ForwardPlan(
        app=call.ctx.app,
        upstream=call.ctx.upstream,
        request=call.request,
        send_upstream=send_upstream,
        slot=slot,
        admission=admission,
        side_effect=call.policy.side_effect,
        timeout_s=call.policy.timeout_s or call.ctx.app[CONFIG].defaults.timeout_s,
        deadline=call.deadline,
        on_wait=on_wait,
        span=call.span,
        admitted_at=time.monotonic(),
        max_attempts=retry_cap(call.policy),
    )
