"""The `tools/call` pipeline: classify → admit → write-ahead → forward → record → answer.

The MCP transport (`proxy.mcp_routes`) hands every `tools/call` request here with two callables:
`send_upstream` forwards one JSON-RPC request and returns the upstream's final response message
(relaying the upstream's own notifications and requests to the client meanwhile), and `notify`
writes one message of the proxy's own (e.g. a progress notification) to the client's stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from policies.model import UpstreamSpec
from proxy.state import CONFIG

__all__ = ["McpCallContext", "Notify", "SendUpstream", "handle_tools_call"]

JsonObject = dict[str, Any]
SendUpstream = Callable[[JsonObject, float], Awaitable[JsonObject]]
"""send_upstream(request, timeout_s) -> final response. Raises `proxy.errors.UpstreamError`."""
Notify = Callable[[JsonObject], Awaitable[None]]


@dataclass
class McpCallContext:
    """What the transport knows about one incoming `tools/call`."""

    app: web.Application
    upstream: UpstreamSpec
    headers: Mapping[str, str]
    session_id: str | None = None
    protocol_version: str | None = None
    client_gone: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def modern(self) -> bool:
        """True for the stateless 2026-07-28 era (synthesized results need `resultType`)."""
        return (self.protocol_version or "") >= "2026-07-28"


async def handle_tools_call(
    ctx: McpCallContext, request: JsonObject, send_upstream: SendUpstream, notify: Notify
) -> JsonObject:
    """Answer one `tools/call` request (returns the JSON-RPC response message for the client)."""
    timeout_s = ctx.upstream.timeout_s or ctx.app[CONFIG].defaults.timeout_s
    return await send_upstream(request, timeout_s)
