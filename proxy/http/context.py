"""One proxied HTTP request as the pipeline sees it: what it is, who sent it, how it is answered."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from opentelemetry.trace import Span
from yarl import URL

from ledger import ClaimRequest
from policies.admission import AdmissionRequest
from policies.answers import Answer
from policies.attributes import RequestAttributes
from policies.classify import Classification
from policies.keys import KeyDecision
from policies.model import UpstreamSpec, WorkClass
from proxy.http.downstream import Downstream
from proxy.http.upstream import Opened
from proxy.http.usage import Usage
from proxy.runtime.scheduler import Slot
from proxy.telemetry import tracing

__all__ = ["HttpCall"]


@dataclass
class HttpCall:
    """One proxied HTTP request and what the pipeline learned about it so far."""

    app: web.Application
    request: web.Request
    upstream: UpstreamSpec
    target: URL
    tool: str
    """"METHOD /path" as policy rules and the ledger name it."""
    attrs: RequestAttributes
    policy: Classification
    body: bytes | aiohttp.StreamReader | None
    payload: Any
    deadline: float
    span: Span
    downstream: Downstream
    key: KeyDecision | None = None
    slot: Slot | None = None
    attempts: int = 0
    usage: Usage | None = None
    before_retry: Callable[[], Awaitable[None]] | None = None
    """Run before each attempt after the first, once it holds its admission slot (side
    effects: record the failed attempt and claim the next one in the ledger)."""
    respond_async: bool = False
    """The caller sent `Prefer: respond-async`: if it cannot start now, it becomes a job."""

    @property
    def work_class(self) -> WorkClass:
        return self.policy.work_class or self.attrs.work_class

    @property
    def retryable_body(self) -> bool:
        """A streamed request body is consumed by the first attempt: no retry is possible."""
        return not isinstance(self.body, aiohttp.StreamReader)

    def admission(self) -> AdmissionRequest:
        """This call (or its next attempt) as the scheduler sees it, arriving now."""
        return AdmissionRequest(
            tenant=self.attrs.tenant,
            work_class=self.work_class,
            upstream=self.upstream.name,
            run_id=self.attrs.run_id,
            cost_class=self.policy.cost_class,
            tool=self.tool,
            side_effect=self.policy.side_effect,
            deadline=self.deadline,
            arrived_at=time.monotonic(),
        )

    def claim_request(self) -> ClaimRequest:
        assert self.key is not None
        return ClaimRequest(
            tenant=self.attrs.tenant,
            upstream=self.upstream.name,
            tool=self.tool,
            idempotency_key=self.key.key,
            key_source=self.key.source,
            fingerprint=self.key.fingerprint,
            arguments=None,  # request bodies may carry secrets; the fingerprint identifies them
            work_class=self.work_class,
            run_id=self.attrs.run_id,
            trace_id=tracing.current_trace_id(),
            dedup_window_s=self.key.dedup_window_s,
        )

    def release_slot(self) -> None:
        if self.slot is not None:
            self.slot.release()
            self.slot = None

    async def answer(
        self, answer: Answer, headers: dict[str, str] | None = None
    ) -> web.StreamResponse:
        self.note_failure(answer)
        return await self.downstream.answer(answer, headers)

    async def fail(self, answer: Answer, opened: Opened) -> web.StreamResponse:
        """End an answer that already started (the upstream broke off mid-body)."""
        self.note_failure(answer)
        return await self.downstream.fail(answer, event_stream=opened.response.event_stream)

    def note_failure(self, answer: Answer) -> None:
        """Trace one of our own answers: `error.type` always, ERROR status when it is a 5xx."""
        reason = str(answer.data.get("reason", answer.code))
        self.span.set_attribute("http.response.status_code", answer.http_status)
        if answer.http_status >= 500:
            tracing.mark_error(self.span, reason, reason)
        else:
            self.span.set_attribute("error.type", reason)
