"""Running an HTTP job: the request the ledger kept, sent once its slot and claim are held.

The job is sent as the live call would have been (the caller's end-to-end headers, the
configured upstream headers of now — never stored —, the body bytes) and its whole answer is
read and recorded (`deferred.max_result_bytes`; beyond it only the body's sha256). The outcome
follows the live pipeline's rules: an answer is kept as the result (4xx as `failed`); a
side effect that may have acted without an answer (timeout, lost connection, a 5xx that proves
nothing) is `unknown`; a request that certainly did not run (not reached, 429, the upstream's
`not_executed_statuses`) goes back in line. A read-only job that was lost is simply put back in
line: repeating it is harmless.
"""

from __future__ import annotations

import base64
import time

from aiohttp import web
from multidict import CIMultiDict
from opentelemetry.trace import SpanKind

from ledger.deferred import Candidate
from policies.admission import AdmissionRequest
from policies.classify import classify_http
from policies.model import UpstreamSpec
from policies.retry import not_executed_statuses
from proxy.errors import UpstreamError, UpstreamNotReached, UpstreamPressure
from proxy.http.headers import request_headers
from proxy.http.outcomes import KeptBody, not_processed, outcome_of
from proxy.http.paths import UnsafePath, upstream_target
from proxy.http.upstream import HTTP_POOLS, open_upstream, read_chunk
from proxy.runtime.deferred import DEFERRED
from proxy.runtime.deferred_job import DeferredJob
from proxy.runtime.http1 import Response
from proxy.runtime.upstream_pressure import start_cooldown
from proxy.state import CONFIG, SCHEDULER
from proxy.telemetry import metrics, tracing

__all__ = ["HttpRunner", "register_http_runner"]

_MAX_CONNECT_S = 10.0


def register_http_runner(app: web.Application) -> None:
    """HTTP jobs are run by `HttpRunner`."""
    app[DEFERRED].register("http", HttpRunner(app))


class HttpRunner:
    """Runs deferred calls of HTTP upstreams."""

    def __init__(self, app: web.Application) -> None:
        self._app = app

    def admission(self, candidate: Candidate, spec: UpstreamSpec) -> AdmissionRequest:
        method, _, path = candidate.tool.partition(" ")
        policy = classify_http(self._app[CONFIG], spec.name, method, path)
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
        config = self._app[CONFIG]
        env = job.envelope
        spec = job.spec
        try:
            target = upstream_target(spec.url or "", env["tail"], env.get("query", ""))
        except UnsafePath as exc:  # it was checked when accepted; the upstream's URL changed
            await job.not_executed(f"not sent: {exc}", None)
            return
        policy = classify_http(config, spec.name, env["method"], target.path)
        side_effect = policy.side_effect
        headers = request_headers(
            [(name, value) for name, value in env["headers"]],
            spec.headers,
            identity_encoding=policy.costly,
            drop_credentials=bool(config.tenant_api_keys),
        )
        body = base64.b64decode(env["body"])
        attempt_s = policy.timeout_s or spec.timeout_s or config.defaults.timeout_s
        attributes = {
            tracing.Attr.HTTP_METHOD: env["method"],
            tracing.Attr.SERVER_ADDRESS: target.url.host,
            tracing.Attr.SERVER_PORT: target.url.port,
            tracing.Attr.ATTEMPT: job.entry.attempt,
        }
        started = time.monotonic()
        with tracing.child_span(
            "interlock.upstream.attempt", attributes=attributes, kind=SpanKind.CLIENT
        ) as span:
            tracing.inject_headers(headers)
            try:
                response = await open_upstream(
                    self._app[HTTP_POOLS][spec.name],
                    env["method"],
                    target.url,
                    headers,
                    body or None,
                    connect_s=min(attempt_s, _MAX_CONNECT_S),
                    read_s=attempt_s,
                )
            except UpstreamPressure as exc:
                span.set_attribute(tracing.Attr.HTTP_STATUS, exc.status)
                start_cooldown(self._app, spec.name, exc, job.span)
                if side_effect and exc.status not in not_executed_statuses(spec):
                    await job.unknown(f"upstream answered HTTP {exc.status}")
                    return
                remaining = self._app[SCHEDULER].cooldown_remaining(spec.name)
                await job.not_executed(f"not executed: {exc}", remaining or None)
                return
            except UpstreamNotReached as exc:
                await job.not_executed(f"not executed: {exc}", None)
                return
            except UpstreamError as exc:
                await self._lost(job, side_effect, f"sent, no answer: {exc}")
                return
            span.set_attribute(tracing.Attr.HTTP_STATUS, response.status)
        metrics.first_byte(spec.name, time.monotonic() - started)
        await self._answered(job, response, side_effect=side_effect)

    async def _answered(self, job: DeferredJob, response: Response, *, side_effect: bool) -> None:
        spec = job.spec
        status = response.status
        cap = self._app[CONFIG].deferred.max_result_bytes
        kept = KeptBody(cap)
        try:
            while chunk := await read_chunk(response):
                kept.add(chunk)
        except UpstreamError as exc:
            await self._lost(job, side_effect, f"answer cut off: {exc}")
            return
        finally:
            response.release()
        job.span.set_attribute(tracing.Attr.HTTP_STATUS, status)
        if not_processed(status, spec):
            await job.not_executed(f"not executed: upstream answered HTTP {status}", None)
            return
        if side_effect and status >= 500:
            await job.unknown(f"upstream answered HTTP {status}")
            return
        headers: CIMultiDict[str] = CIMultiDict(response.headers)
        await job.finish(outcome_of(status, headers.items(), kept, cap), failed=status >= 400)

    async def _lost(self, job: DeferredJob, side_effect: bool, reason: str) -> None:
        if side_effect:
            await job.unknown(reason)
        else:  # read-only: repeating it is harmless
            await job.not_executed(reason, None)
