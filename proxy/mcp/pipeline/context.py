"""One incoming `tools/call`: the transport's context and the facts the pipeline works out."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from opentelemetry.trace import Span

from ledger import ClaimRequest
from policies.answers import Answer
from policies.attributes import RequestAttributes
from policies.classify import Classification
from policies.keys import KeyDecision
from policies.model import UpstreamSpec, WorkClass
from policies.redaction import redacted
from proxy.json_codec import compact_text
from proxy.mcp.wire.tasks import TaskLine
from proxy.telemetry import tracing

__all__ = ["JsonObject", "McpCallContext", "Notify", "OnWait", "SendUpstream", "ToolCall"]

JsonObject = dict[str, Any]
SendUpstream = Callable[[JsonObject, float], Awaitable[JsonObject]]
"""send_upstream(request, timeout_s) -> final response. Raises `proxy.errors.UpstreamError`."""
Notify = Callable[[JsonObject], Awaitable[None]]
OnWait = Callable[[str], Awaitable[None]]


@dataclass
class McpCallContext:
    """What the transport knows about one incoming `tools/call`."""

    app: web.Application
    upstream: UpstreamSpec
    headers: Mapping[str, str]
    session_id: str | None = None
    protocol_version: str | None = None
    client_gone: asyncio.Event = field(default_factory=asyncio.Event)
    task_line: TaskLine | None = None
    """How the client takes a task handle, if it can: it declared 2025-11-25 `tasks` for its
    session ("core"), or the 2026-07-28 extension in this request ("extension")."""
    traced: bool = False
    """The transport already opened this request's SERVER span (`proxy.mcp.transport.spans`),
    continuing whatever trace the caller sent in its headers or `_meta`: it is current."""

    @property
    def modern(self) -> bool:
        """True for the stateless 2026-07-28 era (synthesized results need `resultType`)."""
        return (self.protocol_version or "") >= "2026-07-28"


@dataclass
class ToolCall:
    """One `tools/call` after classification: what it is, who sent it, which key it carries."""

    ctx: McpCallContext
    request: JsonObject
    tool: str
    arguments: Any
    meta: JsonObject
    attrs: RequestAttributes
    policy: Classification
    key: KeyDecision | None
    """The idempotency key decision; made for side-effecting calls only (they are ledgered)."""
    deadline: float
    span: Span

    @property
    def request_id(self) -> Any:
        return self.request.get("id")

    @property
    def idempotency_key(self) -> str | None:
        """The key answers name: the decided one, else the one the caller sent (if any)."""
        return self.key.key if self.key is not None else self.attrs.idempotency_key

    @property
    def work_class(self) -> WorkClass:
        return self.policy.work_class or self.attrs.work_class

    def answer(self, answer: Answer) -> JsonObject:
        """Render one of our own answers as the rule says: JSON-RPC error or `isError` result."""
        self.span.set_attribute("interlock.answer.code", answer.code)
        tracing.mark_error(self.span, str(answer.data.get("reason", answer.code)))
        if self.policy.reject_as == "tool_error":
            result = answer.tool_error_result(modern=self.ctx.modern)
            return {"jsonrpc": "2.0", "id": self.request_id, "result": result}
        return answer.jsonrpc_error(self.request_id)

    def claim_request(self, key: KeyDecision | None = None) -> ClaimRequest:
        """The ledger's view of this call under `key` (default: the call's own decided key).

        A side-effecting call claims with its own key; a read-only call is ledgered only in the
        rare cases that pass one (a deferred task, an upstream's task).
        """
        decided = key if key is not None else self.key
        assert decided is not None, "a read-only call is ledgered only with a key passed in"
        arguments = compact_text(redacted(self.arguments, self.policy.redact))
        return ClaimRequest(
            tenant=self.attrs.tenant,
            upstream=self.ctx.upstream.name,
            tool=self.tool,
            idempotency_key=decided.key,
            key_source=decided.source,
            fingerprint=decided.fingerprint,
            arguments=arguments,
            work_class=self.work_class,
            run_id=self.attrs.run_id,
            trace_id=tracing.current_trace_id(),
            dedup_window_s=decided.dedup_window_s,
        )
