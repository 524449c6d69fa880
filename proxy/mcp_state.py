"""What the MCP transport keeps per application: upstream connections and what it learned.

- the pooled HTTP sessions and the stdio processes;
- per handshake-era session: its upstream, protocol version and `clientInfo` (sent only once, in
  `initialize`), bounded in number;
- per tool, from `tools/list` answers: its `annotations` (into the shared `ANNOTATIONS` app key,
  which classification reads) and which arguments its schema mirrors into `Mcp-Param-*` headers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from mcp.shared.inbound import find_invalid_x_mcp_header, x_mcp_header_map

from proxy.mcp_http_upstream import HttpUpstreams
from proxy.mcp_reply import DisconnectWatcher
from proxy.mcp_stdio_pool import StdioUpstreams
from proxy.state import ANNOTATIONS

__all__ = [
    "MCP_TRANSPORT",
    "McpTransport",
    "SessionInfo",
    "learn_tools",
    "session_info",
]

_MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A handshake-era session as the proxy saw it open."""

    upstream: str
    protocol_version: str | None
    client_name: str | None = None
    client_version: str | None = None


class SessionRegistry:
    """Session id → `SessionInfo`, the oldest forgotten first beyond `limit`."""

    def __init__(self, limit: int = _MAX_SESSIONS) -> None:
        self._limit = limit
        self._items: OrderedDict[str, SessionInfo] = OrderedDict()

    def remember(self, session_id: str, info: SessionInfo) -> None:
        self._items[session_id] = info
        self._items.move_to_end(session_id)
        while len(self._items) > self._limit:
            self._items.popitem(last=False)

    def get(self, session_id: str | None) -> SessionInfo | None:
        return self._items.get(session_id) if session_id else None

    def forget(self, session_id: str | None) -> None:
        if session_id:
            self._items.pop(session_id, None)


@dataclass
class McpTransport:
    """The MCP transport's per-application state."""

    http: HttpUpstreams = field(default_factory=HttpUpstreams)
    stdio: StdioUpstreams = field(default_factory=StdioUpstreams)
    watcher: DisconnectWatcher = field(default_factory=DisconnectWatcher)
    sessions: SessionRegistry = field(default_factory=SessionRegistry)
    # upstream -> tool -> {argument path: Mcp-Param header token}
    param_headers: dict[str, dict[str, dict[tuple[str, ...], str]]] = field(default_factory=dict)


MCP_TRANSPORT = web.AppKey("mcp_transport", McpTransport)


def session_info(app: web.Application, session_id: str | None) -> SessionInfo | None:
    """What the proxy knows of a handshake-era session (`clientInfo`, version), if anything."""
    return app[MCP_TRANSPORT].sessions.get(session_id)


def learn_tools(app: web.Application, upstream: str, result: Mapping[str, Any]) -> int:
    """Record each listed tool's annotations and header-mirrored arguments; returns how many.

    Pages of a paginated listing add to what earlier pages taught; nothing is forgotten.
    """
    tools = result.get("tools")
    if not isinstance(tools, list):
        return 0
    annotations = app[ANNOTATIONS].setdefault(upstream, {})
    params = app[MCP_TRANSPORT].param_headers.setdefault(upstream, {})
    learned = 0
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            continue
        name = tool["name"]
        value = tool.get("annotations")
        annotations[name] = dict(value) if isinstance(value, dict) else {}
        schema = tool.get("inputSchema")
        if isinstance(schema, dict) and find_invalid_x_mcp_header(schema) is None:
            header_map = x_mcp_header_map(schema)
            if header_map:
                params[name] = header_map
            else:
                params.pop(name, None)
        learned += 1
    return learned
