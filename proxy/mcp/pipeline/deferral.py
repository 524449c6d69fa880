"""MCP deferred work: a `tools/call` answered with a task handle at once and run later.

A call becomes a task when its client can take one (`McpCallContext.task_line`) and either asked
for one (2025-11-25 `params.task`: the answer to such a request is always a task) or its band
defers (`classes.<name>.defer`) and it cannot start now. The whole request is written to the
ledger (`accepted`, with an unguessable task id, within the bounds of accepted work) before the
handle is answered; the dispatcher runs it when admission allows (`proxy.mcp.tasks.runner`), and
`tasks/*` read it back (`proxy.mcp.tasks.methods`). Works whether or not the upstream knows of
tasks: the upstream receives a plain `tools/call`.
"""

from __future__ import annotations

import json

from ledger import ClaimRequest, EntryView, LedgerUnavailable
from policies import answers
from policies.admission import AdmissionRequest
from policies.deferral import (
    OutcomeKind,
    band_defers,
    full_refusal,
    poll_interval_ms,
    task_state,
    too_large,
    ttl_ms,
)
from policies.keys import decide_key
from policies.model import Config, KeyRecipe
from proxy.mcp.catalog import tool_task_support
from proxy.mcp.pipeline.context import JsonObject, ToolCall
from proxy.mcp.pipeline.outcomes import decode_replay
from proxy.mcp.wire.tasks import (
    TaskLine,
    TaskView,
    core_create_result,
    extension_create_result,
)
from proxy.runtime.deferred import DEFERRED
from proxy.runtime.deferred_job import deferral_refusal, encode_envelope
from proxy.runtime.scheduler import Slot
from proxy.state import CONFIG, LEDGER, SCHEDULER
from proxy.telemetry import metrics, tracing

__all__ = ["asked_for_task", "defer_or_start", "task_view", "wants_task"]

_FORWARDED_HEADERS = ("mcp-protocol-version", "mcp-method", "mcp-name")
_PARAM_HEADER_PREFIX = "mcp-param-"


def asked_for_task(call: ToolCall) -> bool:
    """A 2025-11-25 task-augmented request (`params.task`) from a client that declared tasks."""
    return call.ctx.task_line == "core" and isinstance(call.request["params"].get("task"), dict)


def wants_task(call: ToolCall) -> bool:
    """Whether this call becomes a task of the proxy's if it cannot start now (or always, if it
    asked). A call that asks a tool running tasks itself goes to it: its task is relayed."""
    if call.ctx.task_line is None:
        return False
    if asked_for_task(call):
        return tool_task_support(call.ctx.app, call.ctx.upstream.name, call.tool) is None
    return band_defers(call.ctx.app[CONFIG], call.work_class)


def task_view(config: Config, entry: EntryView, line: TaskLine) -> TaskView:
    """The task of a deferred entry, as the wire shows it to a client of `line`."""
    outcome: OutcomeKind | None = None
    if entry.outcome is not None:
        outcome = "error" if json.loads(entry.outcome).get("error") is not None else "result"
    state = task_state(str(entry.state), entry.error, outcome, modern=line == "extension")
    return TaskView(
        task_id=entry.task_id or "",
        status=state.status,
        message=state.message,
        created_at=entry.created_at,
        updated_at=entry.updated_at,
        ttl_ms=ttl_ms(config),
        poll_interval_ms=poll_interval_ms(config),
    )


async def defer_or_start(call: ToolCall, admission: AdmissionRequest) -> JsonObject | Slot:
    """A slot when the call may start now and did not ask for a task; otherwise the answer
    to it as deferred work: the task handle, or why it was not accepted."""
    if not asked_for_task(call):
        slot = call.ctx.app[SCHEDULER].try_admit(admission)
        if slot is not None:
            metrics.admission("admitted", call.ctx.upstream.name)
            metrics.queue_wait(call.ctx.upstream.name, admission.work_class, 0.0)
            call.span.set_attribute(tracing.Attr.ADMISSION_DECISION, "admitted")
            return slot
    return await _defer(call)


def _envelope(call: ToolCall) -> bytes:
    params = {k: v for k, v in call.request["params"].items() if k != "task"}
    message = {**call.request, "params": params}
    headers = {
        name: value
        for name, value in call.ctx.headers.items()
        if name.lower() in _FORWARDED_HEADERS or name.lower().startswith(_PARAM_HEADER_PREFIX)
    }
    return encode_envelope(
        "mcp",
        {
            "message": message,
            "protocol_version": call.ctx.protocol_version,
            "modern": call.ctx.modern,
            "line": call.ctx.task_line,
            "headers": headers,
            "trace": tracing.trace_carrier(),
        },
    )


def _claim_request(call: ToolCall) -> ClaimRequest:
    """A side effect's own claim; a read-only call keeps only the caller's explicit key (a
    repeat of it is harmless: never deduplicated by a derived key)."""
    if call.key is not None:
        return call.claim_request()
    key = decide_key(
        KeyRecipe(mode="explicit"),
        explicit=call.attrs.idempotency_key,
        tenant=call.attrs.tenant,
        upstream=call.ctx.upstream.name,
        operation=call.tool,
        arguments=call.arguments,
        run_id=call.attrs.run_id,
    )
    return call.claim_request(key)


async def _defer(call: ToolCall) -> JsonObject:
    app = call.ctx.app
    config = app[CONFIG]
    line = call.ctx.task_line
    assert line is not None
    envelope = _envelope(call)
    if (oversized := too_large(config, len(envelope))) is not None:
        return call.answer(oversized)
    try:
        request = _claim_request(call)
    except (TypeError, ValueError) as exc:  # no canonical form
        bad = answers.bad_request(
            answers.CODE_INVALID_PARAMS, "invalid_arguments", f"arguments: {exc}"
        )
        return call.answer(bad)
    store = app[LEDGER].store
    if store is None:
        return call.answer(answers.ledger_unavailable(app[LEDGER].error or "not open"))
    try:
        result = await store.deferred.defer(
            request,
            envelope,
            max_per_tenant=config.deferred.max_accepted_per_tenant,
            max_per_upstream=config.deferred.max_accepted_per_upstream,
        )
    except LedgerUnavailable as exc:
        return call.answer(answers.ledger_unavailable(str(exc), request.idempotency_key))
    call.span.set_attribute("interlock.deferred.outcome", result.kind)
    key = request.idempotency_key
    if result.kind == "full":
        refusal = full_refusal(config, result.scope or f"upstream:{request.upstream}", None)
        metrics.refusal(refusal.reason, refusal.scope, request.upstream)
        refused = answers.refused(
            refusal.reason, refusal.scope, refusal.retry_after_s, idempotency_key=key
        )
        return call.answer(refused)
    entry = result.entry
    assert entry is not None
    call.span.set_attribute(tracing.Attr.LEDGER_ENTRY_ID, entry.id)
    if result.kind == "replay":
        if entry.outcome is None:
            return call.answer(answers.outcome_not_retained(key, entry.id, str(entry.state)))
        return decode_replay(entry, call.request_id, modern=call.ctx.modern)
    if result.kind not in ("accepted", "existing"):
        return call.answer(deferral_refusal(result.kind, entry, key))
    call.span.set_attribute(tracing.Attr.ADMISSION_DECISION, "deferred")
    metrics.admission("deferred", request.upstream)
    app[DEFERRED].wake()
    view = task_view(config, entry, line)
    created = core_create_result(view) if line == "core" else extension_create_result(view)
    return {"jsonrpc": "2.0", "id": call.request_id, "result": created}
