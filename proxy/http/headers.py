"""Which HTTP headers cross the proxy, each way (pure: hop-by-hop filters, injected headers)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from multidict import CIMultiDict

__all__ = ["HOP_BY_HOP", "request_headers", "response_headers"]

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Headers of the caller that describe the connection to the proxy, not the request itself; a
# browser's `Origin` was judged at the edge (`allowed_origins`): upstream, the proxy is the client.
_REQUEST_ONLY_HERE = frozenset({"host", "content-length", "expect", "origin"})
_CONTROL_PREFIX = "x-interlock-"
_CALLER_CREDENTIALS = frozenset({"authorization", "x-api-key", "cookie"})


def _connection_tokens(headers: Iterable[tuple[str, str]]) -> set[str]:
    tokens: set[str] = set()
    for name, value in headers:
        if name.lower() == "connection":
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return tokens


def request_headers(
    incoming: Iterable[tuple[str, str]],
    injected: Mapping[str, str],
    *,
    identity_encoding: bool = False,
    drop_credentials: bool = False,
) -> CIMultiDict[str]:
    """Headers for the upstream request: the caller's end-to-end headers plus the configured ones.

    Hop-by-hop headers (and any the caller's `Connection` names), `Host`, `Origin`, `Content-
    Length` and the proxy's own `X-Interlock-*` control headers are dropped; configured headers
    replace the caller's of the same name. `identity_encoding` asks the upstream for an
    uncompressed body (used when the proxy must read token usage from it). `drop_credentials`
    removes the caller's `Authorization` / `x-api-key` and `Cookie` (when callers' API keys name
    tenants, those keys are the proxy's, never the upstream's).
    """
    pairs = list(incoming)
    drop = HOP_BY_HOP | _REQUEST_ONLY_HERE | _connection_tokens(pairs)
    if drop_credentials:
        drop |= _CALLER_CREDENTIALS
    injected_names = {name.lower() for name in injected}
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in pairs:
        lower = name.lower()
        if lower in drop or lower in injected_names or lower.startswith(_CONTROL_PREFIX):
            continue
        out.add(name, value)
    for name, value in injected.items():
        out[name] = value
    if identity_encoding:
        out["Accept-Encoding"] = "identity"
    return out


def response_headers(incoming: Iterable[tuple[str, str]]) -> CIMultiDict[str]:
    """The upstream's response headers minus hop-by-hop ones (the body bytes are unchanged)."""
    pairs = list(incoming)
    drop = HOP_BY_HOP | _connection_tokens(pairs)
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in pairs:
        if name.lower() not in drop:
            out.add(name, value)
    return out
