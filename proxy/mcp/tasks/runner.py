"""Running a deferred `tools/call`: the request the ledger kept, sent once its slot and claim
(write-ahead) are held, one attempt per claim.

The outcome follows the live pipeline's rules: the upstream's answer (a result, an `isError`
result, a JSON-RPC error) is kept as the task's result; a side effect that may have acted and
whose answer was lost (timeout, lost connection, a 5xx that proves nothing) is `unknown`; a call
that certainly did not run (not reached, 429, the upstream's `not_executed_statuses`, a session
the upstream forgot) goes back in line. A read-only call that was lost is put back in line too:
repeating it is harmless. A call whose tool asks its user for input (`resultType:
"input_required"`) did not act: on the 2026-07-28 extension line the task waits for its caller's
answers (`input_required`, the upstream's `inputRequests` shown by `tasks/get`; `tasks/update`
puts it back in line); on the 2025-11-25 line (no way to answer) it fails, saying so.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

from aiohttp import web

from ledger.deferred import Candidate
from policies import answers
from policies.admission import AdmissionRequest
from policies.classify import classify_tool
from policies.model import UpstreamSpec
from policies.retry import not_executed_statuses
from proxy.errors import (
    UpstreamError,
    UpstreamLost,
    UpstreamNotReached,
    UpstreamPressure,
    UpstreamRefused,
)
from proxy.mcp.catalog import param_headers, tool_annotations
from proxy.mcp.pipeline.attempts import ForwardPlan, forward_with_retries
from proxy.mcp.pipeline.outcomes import encode_outcome, outcome_state
from proxy.mcp.tasks.channels import DeferredChannels, NoRelay
from proxy.mcp.transport.sessions import MCP_TRANSPORT
from proxy.mcp.wire.jsonrpc import JsonObject
from proxy.mcp.wire.tasks import CLIENT_CAPABILITIES_META, TASKS_EXTENSION
from proxy.runtime.deferred import DEFERRED
from proxy.runtime.deferred_job import DeferredJob
from proxy.state import CONFIG, SCHEDULER

__all__ = ["McpRunner", "register_mcp_runner"]


def register_mcp_runner(app: web.Application) -> None:
    """Deferred MCP calls are run by `McpRunner` (call after `setup_mcp`)."""
    app[DEFERRED].register("mcp", McpRunner(app))


def _outgoing(message: JsonObject, entry_id: str, attempt: int) -> JsonObject:
    """The stored request as the proxy sends it: an id of its own (the session is the proxy's)
    and, in its `_meta` envelope, no tasks extension (the proxy wants the result itself)."""
    out = copy.deepcopy(message)
    out["id"] = f"interlock-deferred-{entry_id}-{attempt}"
    params = out.setdefault("params", {})
    meta = params.get("_meta")
    meta = dict(meta) if isinstance(meta, dict) else {}
    capabilities = meta.get(CLIENT_CAPABILITIES_META)
    if isinstance(capabilities, dict) and isinstance(capabilities.get("extensions"), dict):
        extensions = {k: v for k, v in capabilities["extensions"].items() if k != TASKS_EXTENSION}
        meta[CLIENT_CAPABILITIES_META] = {**capabilities, "extensions": extensions}
    params["_meta"] = meta
    return out


class McpRunner:
    """Runs deferred calls of MCP upstreams."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._channels = DeferredChannels(app[MCP_TRANSPORT])

    def admission(self, candidate: Candidate, spec: UpstreamSpec) -> AdmissionRequest:
        policy = classify_tool(
            self._app[CONFIG],
            spec.name,
            candidate.tool,
            tool_annotations(self._app, spec.name, candidate.tool),
        )
        return AdmissionRequest(
            tenant=candidate.tenant,
            work_class=policy.work_class or "background",
            upstream=spec.name,
            run_id=candidate.run_id,
            cost_class=policy.cost_class,
            tool=candidate.tool,
            side_effect=policy.side_effect,
        )

    async def run(self, job: DeferredJob) -> None:
        app, spec, envelope = self._app, job.spec, job.envelope
        config = app[CONFIG]
        policy = classify_tool(
            config, spec.name, job.entry.tool, tool_annotations(app, spec.name, job.entry.tool)
        )
        side_effect = policy.side_effect
        message = _outgoing(envelope["message"], job.entry.id, job.entry.attempt)
        timeout_s = policy.timeout_s or spec.timeout_s or config.defaults.timeout_s
        try:
            channel = await self._channels.channel(
                spec,
                envelope,
                forward_authorization=not config.tenant_api_keys,
                param_headers=param_headers(app, spec.name),
            )
        except UpstreamNotReached as exc:
            await job.not_executed(f"not executed: {exc}", None)
            return

        async def send(request: JsonObject, attempt_s: float) -> JsonObject:
            return await channel.exchange(
                request, original=None, relay=NoRelay(), timeout_s=attempt_s
            )

        plan = ForwardPlan(
            app=app,
            upstream=spec,
            request=message,
            send_upstream=send,
            slot=job.slot,
            admission=job.admission,
            side_effect=side_effect,
            timeout_s=timeout_s,
            deadline=time.monotonic() + timeout_s + 1.0,
            on_wait=None,
            span=job.span,
            admitted_at=time.monotonic(),
            max_attempts=1,  # a deferred call that did not run goes back in line instead
        )
        try:
            response = await forward_with_retries(plan)
        except UpstreamError as exc:
            await self._failed(job, exc, side_effect=side_effect)
            return
        await self._answered(job, response)

    async def _failed(self, job: DeferredJob, exc: UpstreamError, *, side_effect: bool) -> None:
        spec = job.spec
        not_executed = not_executed_statuses(spec)
        if isinstance(exc, UpstreamNotReached):
            await job.not_executed(f"not executed: {exc}", None)
        elif isinstance(exc, UpstreamPressure):
            if side_effect and exc.status not in not_executed:
                await job.unknown(f"upstream HTTP {exc.status}")
                return
            remaining = self._app[SCHEDULER].cooldown_remaining(spec.name)
            await job.not_executed(f"not executed: {exc}", remaining or None)
        elif isinstance(exc, UpstreamRefused):
            if exc.status == 404:  # the upstream forgot the proxy's session: not processed
                self._channels.forget(spec, job.envelope)
                await job.not_executed("not executed: the upstream's session was gone", None)
            elif side_effect and exc.status >= 500 and exc.status not in not_executed:
                await job.unknown(f"upstream HTTP {exc.status}")
            else:
                await job.not_executed(f"not executed: {exc}", None)
        elif isinstance(exc, UpstreamLost) and side_effect:
            await job.unknown(f"sent, no answer: {exc}")
        else:  # lost, read-only: repeating it is harmless
            await job.not_executed(f"lost, read-only: {exc}", None)

    async def _answered(self, job: DeferredJob, response: JsonObject) -> None:
        result = response.get("result")
        if isinstance(result, dict) and result.get("resultType") == "input_required":
            question = encode_outcome(response)
            cap = self._app[CONFIG].deferred.max_result_bytes
            if job.envelope.get("line") == "extension" and len(question) <= cap:
                await job.await_input(question)
                return
            answer = answers.upstream_failed(
                "input_required", "the tool asked for input, which a deferred call cannot give"
            )
            error: dict[str, Any] = {"code": answer.code, "message": answer.message}
            error["data"] = answer.data
            outcome = encode_outcome({"error": error})
            await job.finish(outcome, failed=True, error=json.dumps(error)[:2000])
            return
        state = outcome_state(response)
        error_value = response.get("error")
        await job.finish(
            encode_outcome(response),
            failed=state == "failed",
            error=json.dumps(error_value)[:2000] if error_value is not None else None,
        )
