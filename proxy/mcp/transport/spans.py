"""The SERVER span and duration metric of every proxied MCP request or notification."""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

from opentelemetry.trace import Span

from policies.model import UpstreamSpec
from proxy.mcp.wire.jsonrpc import Message
from proxy.telemetry import metrics
from proxy.telemetry.tracing import (
    Attr,
    call_span,
    hash_key,
    mark_error,
    mcp_span_name,
)

__all__ = ["CallOutcome", "traced"]


@dataclass
class CallOutcome:
    """Filled in by the code inside `traced`: the error type of the call, if it failed."""

    error_type: str | None = None

    def response(self, message: Mapping[str, Any]) -> None:
        """Note a JSON-RPC error response as the call's error."""
        error = message.get("error")
        if isinstance(error, dict):
            data = error.get("data")
            reason = data.get("reason") if isinstance(data, dict) else None
            self.error_type = str(reason or error.get("code"))


@functools.lru_cache(maxsize=256)
def _address(url: str) -> tuple[str | None, int | None]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def _attributes(
    message: Message,
    spec: UpstreamSpec,
    method: str,
    target: str,
    session_id: str | None,
    protocol_version: str | None,
) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        Attr.MCP_METHOD: method,
        Attr.MCP_SESSION_ID: hash_key(session_id),  # a stdio session id is its bearer
        Attr.MCP_PROTOCOL_VERSION: protocol_version,
        Attr.JSONRPC_REQUEST_ID: None if message.id is None else str(message.id),
        Attr.UPSTREAM: spec.name,
        Attr.NETWORK_TRANSPORT: "pipe" if spec.kind == "mcp_stdio" else "tcp",
    }
    if spec.url:
        attributes[Attr.SERVER_ADDRESS], attributes[Attr.SERVER_PORT] = _address(spec.url)
    if method == "tools/call":
        attributes[Attr.GEN_AI_OPERATION] = "execute_tool"
        attributes[Attr.GEN_AI_TOOL] = target
    return attributes


def traced(
    message: Message,
    spec: UpstreamSpec,
    headers: Mapping[str, str],
    *,
    session_id: str | None,
    protocol_version: str | None,
) -> _Traced:
    """The SERVER span and duration metric of one proxied request or notification: `with
    traced(...) as outcome:` (an exception leaving the block is the call's error type)."""
    method = message.method or "response"
    tool = message.params.get("name") if method == "tools/call" else None
    target = tool if isinstance(tool, str) else spec.name
    span = call_span(
        mcp_span_name(method, target),
        attributes=lambda: _attributes(message, spec, method, target, session_id, protocol_version),
        headers=headers,
        meta=message.meta,
    )
    return _Traced(method, spec.name, span)


class _Traced:
    """What `traced` returns: a class, not a generator-based context manager (it wraps every
    proxied call, and a generator's set-up costs more than the timing and the metric it runs)."""

    __slots__ = ("_entered", "_method", "_span", "_started", "_upstream", "outcome")

    def __init__(self, method: str, upstream: str, span: AbstractContextManager[Span]) -> None:
        self._method = method
        self._upstream = upstream
        self._span = span
        self.outcome = CallOutcome()

    def __enter__(self) -> CallOutcome:
        self._entered = self._span.__enter__()  # current until `__exit__`
        self._started = time.perf_counter()
        return self.outcome

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        elapsed = time.perf_counter() - self._started
        outcome = self.outcome
        try:
            if exc_type is not None:
                outcome.error_type = exc_type.__qualname__
            if outcome.error_type is not None:
                mark_error(self._entered, outcome.error_type)
            metrics.operation_duration(self._method, self._upstream, elapsed, outcome.error_type)
        finally:
            self._span.__exit__(exc_type, exc, tb)
