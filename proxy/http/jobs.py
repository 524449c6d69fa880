"""HTTP deferred work: `Prefer: respond-async` (RFC 7240) and the job routes.

A request that asks to respond async and cannot start now is accepted as deferred work: the
whole request (method, path, the caller's end-to-end headers, body) is written to the ledger with
an unguessable job id, and the caller gets `202 Accepted` with `Location: /jobs/{id}` and
`Retry-After` at once. The dispatcher runs it when admission allows. `GET /jobs/{id}` answers
`202` with the job's state while it waits or runs, and once it is done the upstream's answer as
it was recorded (status, headers worth keeping, body bytes) — what the call would have answered
live. `DELETE /jobs/{id}` cancels a job that has not started (it then never runs). Jobs are read
and cancelled only by the tenant that created them: another tenant's job is not found.

A request that can start now runs live, as if it had not asked (the preference is a hint).
"""

from __future__ import annotations

import base64
import hashlib
import math
from typing import Any

from aiohttp import web

from ledger import ClaimRequest, EntryView, LedgerError, LedgerStore, LedgerUnavailable
from ledger.deferred_ops import CANCELLED
from policies import answers
from policies.attributes import BadAttribute, read_attributes
from policies.deferral import full_refusal, task_state, too_large, without_respond_async
from policies.keys import KeyDecision, decide_key
from policies.model import KeyRecipe
from proxy.edge import guarded
from proxy.http.context import HttpCall
from proxy.http.downstream import answer_response
from proxy.http.headers import request_headers
from proxy.http.outcomes import stored_response
from proxy.runtime.deferred import DEFERRED
from proxy.runtime.deferred_job import deferral_refusal, encode_envelope
from proxy.state import CONFIG, LEDGER, SCHEDULER
from proxy.telemetry import metrics, tracing

__all__ = ["JOB_STATE_HEADER", "defer_or_start", "job_json", "setup_jobs"]

JOB_STATE_HEADER = "Interlock-Job-State"
_PENDING = frozenset({"accepted", "running"})


def setup_jobs(app: web.Application) -> None:
    """Add `GET` and `DELETE /jobs/{id}`."""
    app.router.add_get("/jobs/{task_id}", guarded(get_job), allow_head=False)
    app.router.add_delete("/jobs/{task_id}", guarded(delete_job))


# ------------------------------------------------------------------------ accepting a job


async def defer_or_start(call: HttpCall) -> web.StreamResponse | None:
    """For a call that prefers to respond async: a slot now (returns None, `call.slot` set: it
    runs live), else the answer to it as deferred work (202, or why it was not accepted)."""
    slot = call.app[SCHEDULER].try_admit(call.admission())
    if slot is not None:
        call.slot = slot
        metrics.admission("admitted", call.upstream.name)
        call.span.set_attribute(tracing.Attr.ADMISSION_DECISION, "admitted")
        return None
    return await _defer(call)


def _envelope(call: HttpCall) -> bytes:
    config = call.app[CONFIG]
    body = call.body if isinstance(call.body, bytes) else b""
    pairs = request_headers(
        call.request.headers.items(), {}, drop_credentials=bool(config.tenant_api_keys)
    )
    headers = []
    for name, value in pairs.items():
        if name.lower() == "prefer":
            value = without_respond_async(value)
            if not value:
                continue
        headers.append([name, value])
    return encode_envelope(
        "http",
        {
            "method": call.request.method,
            "tail": call.request.match_info.get("path", ""),
            "query": call.request.rel_url.raw_query_string,
            "headers": headers,
            "body": base64.b64encode(body).decode(),
            "trace": tracing.trace_carrier(),
        },
    )


def _key(call: HttpCall, body: bytes) -> KeyDecision:
    """A side effect's decided key; for a read-only call only the caller's explicit key (its
    repeat is harmless, so it is never deduplicated by a derived key)."""
    if call.key is not None:
        return call.key
    arguments = {
        "body_sha256": hashlib.sha256(body).hexdigest(),
        "query": call.request.rel_url.raw_query_string,
    }
    return decide_key(
        KeyRecipe(mode="explicit"),
        explicit=call.attrs.idempotency_key,
        tenant=call.attrs.tenant,
        upstream=call.upstream.name,
        operation=call.tool,
        arguments=arguments,
        run_id=call.attrs.run_id,
    )


async def _defer(call: HttpCall) -> web.StreamResponse:
    config = call.app[CONFIG]
    envelope = _envelope(call)
    if (oversized := too_large(config, len(envelope))) is not None:
        return await call.answer(oversized)
    key = _key(call, call.body if isinstance(call.body, bytes) else b"")
    store = call.app[LEDGER].store
    if store is None:
        detail = call.app[LEDGER].error or "not open"
        return await call.answer(answers.ledger_unavailable(detail, key.key))
    request = ClaimRequest(
        tenant=call.attrs.tenant,
        upstream=call.upstream.name,
        tool=call.tool,
        idempotency_key=key.key,
        key_source=key.source,
        fingerprint=key.fingerprint,
        work_class=call.work_class,
        run_id=call.attrs.run_id,
        trace_id=tracing.current_trace_id(),
        dedup_window_s=key.dedup_window_s,
    )
    try:
        result = await store.deferred.defer(
            request,
            envelope,
            max_per_tenant=config.deferred.max_accepted_per_tenant,
            max_per_upstream=config.deferred.max_accepted_per_upstream,
        )
    except LedgerUnavailable as exc:
        return await call.answer(answers.ledger_unavailable(str(exc), key.key))
    call.span.set_attribute("interlock.deferred.outcome", result.kind)
    if result.kind == "full":
        refusal = full_refusal(config, result.scope or f"upstream:{call.upstream.name}", None)
        metrics.refusal(refusal.reason, refusal.scope, call.upstream.name)
        return await call.answer(
            answers.refused(
                refusal.reason, refusal.scope, refusal.retry_after_s, idempotency_key=key.key
            )
        )
    entry = result.entry
    assert entry is not None
    call.span.set_attribute(tracing.Attr.LEDGER_ENTRY_ID, entry.id)
    if result.kind == "replay":
        if entry.outcome is None:
            return await call.answer(
                answers.outcome_not_retained(key.key, entry.id, str(entry.state))
            )
        return stored_response(entry.outcome, replayed=True)
    if result.kind in ("accepted", "existing"):
        call.span.set_attribute(tracing.Attr.ADMISSION_DECISION, "deferred")
        metrics.admission("deferred", call.upstream.name)
        call.app[DEFERRED].wake()
        return _accepted(call.app, entry)
    return await call.answer(deferral_refusal(result.kind, entry, key.key))


def _accepted(app: web.Application, entry: EntryView) -> web.Response:
    config = app[CONFIG]
    assert entry.task_id is not None
    return web.json_response(
        {"job": job_json(app, entry)},
        status=202,
        headers={
            "Location": f"/jobs/{entry.task_id}",
            "Retry-After": str(max(1, math.ceil(config.deferred.poll_interval_s))),
            "Preference-Applied": "respond-async",
        },
    )


# ---------------------------------------------------------------------------- job routes


def job_json(app: web.Application, entry: EntryView) -> dict[str, Any]:
    """What a job's status says: its ledger state, its task status and why, and when."""
    state = task_state(str(entry.state), entry.error, None, modern=True)
    return {
        "id": entry.task_id,
        "state": str(entry.state),
        "status": state.status,
        "message": state.message,
        "upstream": entry.upstream,
        "operation": entry.tool,
        "attempt": entry.attempt,
        "created_at": entry.created_at.isoformat(),
        "updated_at": entry.updated_at.isoformat(),
        "poll_interval_s": app[CONFIG].deferred.poll_interval_s,
    }


async def _find(request: web.Request) -> tuple[LedgerStore, EntryView, str] | web.Response:
    """The job this caller names, or the answer when there is none for it."""
    config = request.app[CONFIG]
    task_id = request.match_info["task_id"]
    try:
        tenant = read_attributes(config, request.headers).tenant
    except BadAttribute as exc:
        return answer_response(
            answers.bad_request(
                answers.CODE_INVALID_PARAMS, exc.reason, str(exc), http_status=exc.status
            )
        )
    handle = request.app[LEDGER]
    if handle.store is None:
        return answer_response(answers.ledger_unavailable(handle.error or "not open"))
    try:
        entry = await handle.store.deferred.task(task_id, tenant)
    except LedgerError as exc:
        return answer_response(answers.ledger_unavailable(str(exc)))
    spec = config.upstreams.get(entry.upstream) if entry is not None else None
    if entry is None or spec is None or spec.kind != "http":
        return answer_response(answers.task_not_found(None))
    return handle.store, entry, tenant


async def get_job(request: web.Request) -> web.StreamResponse:
    """`GET /jobs/{id}`: 202 with the state while it waits or runs; then its answer."""
    found = await _find(request)
    if isinstance(found, web.Response):
        return found
    _, entry, _ = found
    state = str(entry.state)
    if state in _PENDING:
        return _accepted(request.app, entry)
    headers = {JOB_STATE_HEADER: state}
    if state in ("succeeded", "failed"):
        if entry.outcome is None:
            answer = answers.outcome_not_retained(entry.idempotency_key, entry.id, state)
            return answer_response(answer, headers)
        response = stored_response(entry.outcome, replayed=False)
        response.headers.update(headers)
        return response
    if state == "unknown":
        detail = entry.error or "lost"
        return answer_response(
            answers.outcome_unknown(entry.idempotency_key, entry.id, detail), headers
        )
    if state == "blocked":
        answer = answers.needs_reconciliation(entry.idempotency_key, entry.id, state)
        return answer_response(answer, headers)
    return answer_response(answers.task_ended_unrun(entry.task_id or "", entry.error), headers)


async def delete_job(request: web.Request) -> web.StreamResponse:
    """`DELETE /jobs/{id}`: cancel a job that has not started (it never runs)."""
    found = await _find(request)
    if isinstance(found, web.Response):
        return found
    store, entry, tenant = found
    try:
        result = await store.deferred.cancel(entry.id, actor=f"tenant:{tenant}", reason=CANCELLED)
    except LedgerError as exc:
        return answer_response(answers.ledger_unavailable(str(exc)))
    if result.kind == "cancelled":
        return web.json_response({"job": job_json(request.app, result.entry)})
    task_id = entry.task_id or ""
    state = str(result.entry.state)
    return answer_response(
        answers.task_not_cancellable(task_id, state, finished=result.kind == "finished")
    )
