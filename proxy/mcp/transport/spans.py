"""The SERVER span and duration metric of every proxied MCP request or notification."""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

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


@contextmanager
def traced(
    message: Message,
    spec: UpstreamSpec,
    headers: Mapping[str, str],
    *,
    session_id: str | None,
    protocol_version: str | None,
) -> Iterator[CallOutcome]:
    """The SERVER span and duration metric of one proxied request or notification."""
    method = message.method or "response"
    tool = message.params.get("name") if method == "tools/call" else None
    target = tool if isinstance(tool, str) else spec.name
    outcome = CallOutcome()
    started = time.perf_counter()
    with call_span(
        mcp_span_name(method, target),
        attributes=lambda: _attributes(message, spec, method, target, session_id, protocol_version),
        headers=headers,
        meta=message.meta,
    ) as span:
        try:
            yield outcome
        except BaseException as exc:
            outcome.error_type = type(exc).__qualname__
            raise
        finally:
            if outcome.error_type is not None:
                mark_error(span, outcome.error_type)
            metrics.operation_duration(
                method, spec.name, time.perf_counter() - started, outcome.error_type
            )
