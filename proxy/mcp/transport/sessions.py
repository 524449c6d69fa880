"""What the MCP transport keeps per application: upstream connections and client sessions.

- the pooled HTTP sessions and the stdio processes;
- per handshake-era session: its upstream, protocol version and `clientInfo` (sent only once, in
  `initialize`), bounded in number.

What the proxy learns of each tool lives in `proxy.mcp.catalog`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from aiohttp import web

from proxy.mcp.transport.reply import DisconnectWatcher
from proxy.mcp.transport.resumption import SessionStreams
from proxy.mcp.upstreams.http_pool import HttpUpstreams
from proxy.mcp.upstreams.stdio_pool import StdioUpstreams

__all__ = [
    "MCP_TRANSPORT",
    "McpTransport",
    "SessionInfo",
    "session_info",
    "stream_key",
]

_MAX_SESSIONS = 10_000


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A handshake-era session as the proxy saw it open."""

    upstream: str
    protocol_version: str | None
    client_name: str | None = None
    client_version: str | None = None
    client_tasks: bool = False
    """The client declared the `tasks` capability (2025-11-25): it can take a task handle."""


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
    streams: SessionStreams = field(default_factory=SessionStreams)
    """What the proxy wrote on each session's event streams, for `Last-Event-ID` resumption."""

    def forget(self, upstream: str, session_id: str | None) -> None:
        """A session ended (DELETE, or the upstream says it is gone): drop what it kept."""
        self.sessions.forget(session_id)
        if session_id:
            self.streams.forget(stream_key(upstream, session_id))


def stream_key(upstream: str, session_id: str) -> str:
    """Sessions are the upstream's (HTTP) or the proxy's (stdio): keyed per upstream."""
    return f"{upstream}\x00{session_id}"


MCP_TRANSPORT = web.AppKey("mcp_transport", McpTransport)


def session_info(app: web.Application, session_id: str | None) -> SessionInfo | None:
    """What the proxy knows of a handshake-era session (`clientInfo`, version), if anything."""
    return app[MCP_TRANSPORT].sessions.get(session_id)
