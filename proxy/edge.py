"""The edge: checks every request to `/mcp`, `/http`, `/jobs` and `/admin` before a route sees it.

A browser page must not drive the proxy: a request whose `Origin` is not allowed is refused 403,
one whose `Host` does not name us (DNS rebinding) 421. With `tenants.api_keys`, a request to
`/mcp` or `/http` without a configured key is 401 and one whose `X-Interlock-Tenant` names
another tenant 403, before anything is forwarded — the defence the MCP specification asks of
every server, done here because the proxy does not forward `Origin` or `Host` upstream (so the
upstream's own check cannot fire). `/healthz`, `/readyz` and `/metrics` are not guarded: probes
and scrapers name the pod's address, and they change nothing. The decisions are
`policies.edge`'s; this module only reads the headers and answers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from policies.answers import CODE_INVALID_REQUEST, Answer, bad_request
from policies.edge import host_allowed, origin_allowed
from policies.identity import CallerRefused, key_tenant
from proxy.state import CONFIG

__all__ = ["GUARDED_PREFIXES", "edge_guard"]

GUARDED_PREFIXES = ("/mcp/", "/http/", "/jobs/", "/admin")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _refusal(request: web.Request, answer: Answer) -> web.Response:
    mcp = request.path.startswith("/mcp/")
    body = answer.jsonrpc_error(None) if mcp else answer.http_body()
    return web.json_response(body, status=answer.http_status)


def _own_host(request: web.Request) -> str | None:
    """The Host a same-origin `Origin` may equal: only on `/mcp` (an MCP server accepts its own
    origin), and only when `Host` is checked. On `/http`, `/jobs` and `/admin` a page served at our
    origin (a relayed upstream answer) must not drive the model API or the operator API; with
    `allowed_hosts: ["*"]` a DNS-rebinding page's Origin always equals its Host."""
    if not request.path.startswith("/mcp") or "*" in request.app[CONFIG].edge.allowed_hosts:
        return None
    return request.headers.get("Host")


@web.middleware
async def edge_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse foreign browser origins (403) and foreign Host names (421) on the guarded routes."""
    if not request.path.startswith(GUARDED_PREFIXES):
        return await handler(request)
    config = request.app[CONFIG]
    if not host_allowed(request.headers.get("Host"), config.edge, config.listen_host):
        return _refusal(
            request,
            bad_request(
                CODE_INVALID_REQUEST,
                "host_not_allowed",
                "The Host header does not name this proxy (add it to allowed_hosts).",
                http_status=421,
            ),
        )
    if not origin_allowed(request.headers.get("Origin"), config.edge, _own_host(request)):
        return _refusal(
            request,
            bad_request(
                CODE_INVALID_REQUEST,
                "origin_not_allowed",
                "Requests from this browser origin are not allowed (see allowed_origins).",
                http_status=403,
            ),
        )
    if config.tenant_api_keys and not request.path.startswith("/admin"):
        try:
            key_tenant(config, {k.lower(): v for k, v in request.headers.items()})
        except CallerRefused as refused:
            response = _refusal(
                request,
                bad_request(
                    CODE_INVALID_REQUEST, refused.reason, str(refused), http_status=refused.status
                ),
            )
            if refused.status == 401:
                response.headers["WWW-Authenticate"] = 'Bearer realm="interlock"'
            return response
    return await handler(request)
