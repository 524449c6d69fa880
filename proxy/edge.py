"""The edge: checks every request to `/mcp`, `/http`, `/jobs` and `/admin` before a route sees it.

A browser page must not drive the proxy: a request whose `Origin` is not allowed is refused 403,
one whose `Host` does not name us (DNS rebinding) 421. With `tenants.api_keys`, a request to
`/mcp` or `/http` without a configured key is 401 and one whose `X-Interlock-Tenant` names
another tenant 403, before anything is forwarded — the defence the MCP specification asks of
every server, done here because the proxy does not forward `Origin` or `Host` upstream (so the
upstream's own check cannot fire). `/healthz`, `/readyz` and `/metrics` are not guarded: probes
and scrapers name the pod's address, and they change nothing. The decisions are
`policies.edge`'s; this module only reads the headers and answers.

The check is a wrapper on each guarded route (`guarded`), not an application middleware: aiohttp
runs every middleware, and one of its own once there is any, as one more coroutine around every
request. A request that matches no route is answered 404/405 by aiohttp before any check (it
reaches nothing to protect). The wrapper also watches a body that is still arriving
(`proxy.listener.BodyWatch`).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Awaitable, Callable

from aiohttp import web

from policies.answers import CODE_INVALID_REQUEST, Answer, bad_request
from policies.edge import host_allowed, origin_allowed
from policies.identity import CallerRefused, key_tenant
from proxy.listener import BODY_WATCH
from proxy.state import CONFIG

__all__ = ["GUARDED_PREFIXES", "Handler", "guarded", "is_guarded"]

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


# Every guarded request asks, and clients send the same few Host values: the verdict is kept
# (bounded: a client may send any Host, and then it is merely worked out again).
_host_allowed = functools.lru_cache(maxsize=256)(host_allowed)


def guarded(handler: Handler) -> Handler:
    """`handler` behind the edge (register every route under `GUARDED_PREFIXES` with it)."""

    async def behind_the_edge(request: web.Request) -> web.StreamResponse:
        refused = _refusal_at_the_edge(request)
        if refused is not None:
            return refused
        if not request.body_exists or request.content.is_eof():
            return await handler(request)
        watch = request.app[BODY_WATCH]  # a body still arriving: closed if it stalls
        key = watch.add(request)
        try:
            return await handler(request)
        finally:
            watch.remove(key)

    _GUARDED.add(behind_the_edge)
    return functools.update_wrapper(behind_the_edge, handler)


def is_guarded(handler: Callable[..., object]) -> bool:
    """Whether `handler` is one `guarded` made (for the test that every guarded route is)."""
    return handler in _GUARDED


_GUARDED: weakref.WeakSet[Callable[..., object]] = weakref.WeakSet()


def _refusal_at_the_edge(request: web.Request) -> web.Response | None:
    """Foreign browser origins (403), foreign Host names (421), a missing or unknown API key
    (401) or another tenant's name (403); None when the request may go on."""
    config = request.app[CONFIG]
    if not _host_allowed(request.headers.get("Host"), config.edge, config.listen_host):
        return _refusal(
            request,
            bad_request(
                CODE_INVALID_REQUEST,
                "host_not_allowed",
                "The Host header does not name this proxy (add it to allowed_hosts).",
                http_status=421,
            ),
        )
    origin = request.headers.get("Origin")
    if origin is not None and not origin_allowed(origin, config.edge, _own_host(request)):
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
    return None
