"""Which HTTP headers cross the proxy, each way, for MCP (pure allow-lists, no I/O).

Client → upstream: only the MCP transport headers, `Authorization` (unless the proxy itself
consumes it or the upstream's configured headers set their own), and `User-Agent`. Never `Host`,
`Origin` (a 2.x server bound to loopback rejects foreign ones), cookies, hop-by-hop headers, the
proxy's own `X-Interlock-*` / `Idempotency-Key`, or `Accept-Encoding` (the proxy asks upstreams for
identity encoding so it can read and re-stream the bytes). The configured upstream headers win.

Upstream → client: content type, MCP session and version headers, and the few headers a client
acts on (`Retry-After`, `WWW-Authenticate`, `Allow`, `Cache-Control`).

Modern-era (2026-07-28) requests mirror the body in headers (`Mcp-Method`, `Mcp-Name`,
`Mcp-Param-*`); `modern_routing_headers` recomputes them when the pipeline changed the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from multidict import CIMultiDict

from proxy.mcp.wire.param_headers import NAME_BEARING, PARAM_PREFIX, encode, mirrored

__all__ = [
    "HANDSHAKE_PROTOCOL_VERSIONS",
    "MCP_METHOD_HEADER",
    "MCP_NAME_HEADER",
    "MCP_PARAM_HEADER_PREFIX",
    "MCP_PROTOCOL_VERSION_HEADER",
    "MCP_SESSION_ID_HEADER",
    "client_response_headers",
    "is_modern",
    "modern_routing_headers",
    "routing_changed",
    "upstream_request_headers",
]

MCP_SESSION_ID_HEADER = "mcp-session-id"
# The MCP specification's transport names (the SDK's `mcp.shared.inbound` has the same; importing
# it loads the whole SDK, ~55 MB, so the proxy keeps its own copy: `proxy.mcp.wire.param_headers`).
# tests/unit/test_jsonrpc.py checks they agree with the SDK.
MCP_PROTOCOL_VERSION_HEADER = "mcp-protocol-version"
MCP_METHOD_HEADER = "mcp-method"
MCP_NAME_HEADER = "mcp-name"
MCP_PARAM_HEADER_PREFIX = PARAM_PREFIX
HANDSHAKE_PROTOCOL_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
"""The protocol versions of the handshake (session) era; any other version is stateless-era."""
_PARAM_PREFIX = MCP_PARAM_HEADER_PREFIX.lower()

_TO_UPSTREAM = frozenset(
    {
        "accept",
        "content-type",
        MCP_SESSION_ID_HEADER,
        MCP_PROTOCOL_VERSION_HEADER,
        MCP_METHOD_HEADER,
        MCP_NAME_HEADER,
        "last-event-id",
        "user-agent",
    }
)
_TO_CLIENT = frozenset(
    {
        "content-type",
        MCP_SESSION_ID_HEADER,
        MCP_PROTOCOL_VERSION_HEADER,
        "cache-control",
        "retry-after",
        "www-authenticate",
        "allow",
    }
)


def is_modern(protocol_version: str | None) -> bool:
    """True for a stateless-era version header (anything that is not a handshake-era version).

    Mirrors the SDK server's routing: unknown versions go to the modern entry, which rejects them
    with a structured error.
    """
    return protocol_version is not None and protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS


def upstream_request_headers(
    client_headers: Mapping[str, str],
    configured: Mapping[str, str],
    *,
    forward_authorization: bool = True,
) -> dict[str, str]:
    """The headers to send upstream for a client request (lower-case names)."""
    out: dict[str, str] = {}
    for name, value in client_headers.items():
        lower = name.lower()
        if (
            lower in _TO_UPSTREAM
            or lower.startswith(_PARAM_PREFIX)
            or (lower == "authorization" and forward_authorization)
        ):
            out[lower] = value
    out["accept-encoding"] = "identity"
    for name, value in configured.items():
        out[name.lower()] = value
    return out


def client_response_headers(
    upstream_headers: Mapping[str, str], *, keep_encoding: bool = False
) -> CIMultiDict[str]:
    """The upstream response headers the client gets (no length: the proxy re-streams).

    Case-insensitive: the proxy sets some of them again (an event stream's `Content-Type`), and
    an upstream may spell them in any case (`content-type`); a plain dict would send both."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream_headers.items():
        lower = name.lower()
        if lower in _TO_CLIENT or (keep_encoding and lower == "content-encoding"):
            out[name] = value
    return out


def modern_routing_headers(
    headers: Mapping[str, str],
    original: Mapping[str, Any],
    message: Mapping[str, Any],
    param_header_map: Mapping[tuple[str, ...], str] | None,
) -> dict[str, str]:
    """Make `Mcp-Method`, `Mcp-Name` and `Mcp-Param-*` agree with `message` (a modern request).

    `original` is the request as the client sent it: when the arguments are unchanged the client's
    `Mcp-Param-*` headers stay; when they changed they are rebuilt from the tool's schema
    (`param_header_map`, learned from `tools/list`), or dropped if the schema is unknown.
    """
    out = dict(headers)
    method = message.get("method")
    params = _params(message)
    if isinstance(method, str):
        out[MCP_METHOD_HEADER] = method
    name_key = NAME_BEARING.get(method) if isinstance(method, str) else None
    if name_key is not None and isinstance(params.get(name_key), str):
        out[MCP_NAME_HEADER] = encode(params[name_key])
    before = _params(original)
    arguments = params.get("arguments")
    if arguments != before.get("arguments"):
        for name in [n for n in out if n.lower().startswith(_PARAM_PREFIX)]:
            del out[name]
        if param_header_map and isinstance(arguments, dict):
            out.update({k.lower(): v for k, v in mirrored(param_header_map, arguments).items()})
    return out


def routing_changed(original: Mapping[str, Any], message: Mapping[str, Any]) -> bool:
    """Whether what the routing headers are made of (the method and the params, `_meta` aside:
    no header carries it) differs between the client's request and the forwarded one. The
    pipeline changes only `_meta` (the trace context it passes on) and shares the rest, so the
    comparisons stop at shared values."""
    if original.get("method") != message.get("method"):
        return True
    before, after = _params(original), _params(message)
    if len(before.keys() - {"_meta"}) != len(after.keys() - {"_meta"}):
        return True
    return any(k != "_meta" and (k not in after or after[k] != v) for k, v in before.items())


def _params(message: Mapping[str, Any]) -> Mapping[str, Any]:
    params = message.get("params")
    return params if isinstance(params, dict) else {}
