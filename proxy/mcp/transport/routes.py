"""The MCP endpoint: `POST/GET/DELETE /mcp/{upstream}` for every configured MCP upstream.

`setup_mcp(app)` adds the routes and a cleanup context that owns the transport's resources (the
pooled upstream connections, the stdio processes, the disconnect watcher). Before anything
is forwarded the POST body is checked here: a known MCP upstream (else 404), a JSON content type
(else 415), a body within `config.max_body_bytes` (else 413), valid JSON (else 400 / -32700) that
is JSON-RPC (else 400 / -32600). Nothing is forwarded for a rejected request, and only configured
upstreams are ever contacted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from policies.answers import CODE_INVALID_REQUEST, Answer, bad_request
from policies.model import UpstreamSpec
from proxy.edge import guarded
from proxy.errors import UpstreamError
from proxy.mcp.transport.batch import handle_batch
from proxy.mcp.transport.context import PostContext, answer_response
from proxy.mcp.transport.event_streams import (
    LAST_EVENT_ID_HEADER,
    recorded_stream,
    replay,
    unsolicited_stream,
)
from proxy.mcp.transport.post import handle_single
from proxy.mcp.transport.reply import DisconnectWatcher, accepts_sse
from proxy.mcp.transport.sessions import MCP_TRANSPORT, McpTransport
from proxy.mcp.upstreams.stdio_pool import StdioUpstreams, default_max_line_bytes
from proxy.mcp.upstreams.streamable_http import relay_http
from proxy.mcp.wire.headers import (
    MCP_PROTOCOL_VERSION_HEADER,
    MCP_SESSION_ID_HEADER,
    is_modern,
    upstream_request_headers,
)
from proxy.mcp.wire.jsonrpc import InvalidBody, parse_body
from proxy.runtime.client_gone import ClientGone
from proxy.state import CONFIG

__all__ = ["setup_mcp"]


def setup_mcp(
    app: web.Application, *, stdio_idle_s: float | None = None, disconnect_poll_s: float = 0.1
) -> None:
    """Add the MCP routes and the transport's cleanup context to `app` (`CONFIG` must be set).

    `stdio_idle_s` (tests): overrides every stdio upstream's `session_idle_s`, how long a process
    with no call in flight and no open GET stream lives. `disconnect_poll_s`: how often waiting
    calls check whether their client left.
    """
    config = app[CONFIG]
    app[MCP_TRANSPORT] = McpTransport(
        stdio=StdioUpstreams(
            idle_s=stdio_idle_s,
            max_line_bytes=default_max_line_bytes(config.max_body_bytes, config.max_response_bytes),
        ),
        watcher=DisconnectWatcher(disconnect_poll_s),
    )
    app.router.add_post("/mcp/{upstream}", guarded(_post))
    app.router.add_get("/mcp/{upstream}", guarded(_get), allow_head=False)
    app.router.add_delete("/mcp/{upstream}", guarded(_delete))
    app.cleanup_ctx.append(_transport_ctx)


async def _transport_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    transport = app[MCP_TRANSPORT]
    await transport.stdio.close()
    await transport.watcher.close()
    await transport.http.close()


class _BodyTooLarge(Exception):
    pass


def _error(answer: Answer) -> web.Response:
    return answer_response(answer)


def _upstream(request: web.Request) -> UpstreamSpec | web.Response:
    name = request.match_info["upstream"]
    spec = request.app[CONFIG].upstreams.get(name)
    if spec is None or not spec.is_mcp:
        return _error(
            bad_request(
                CODE_INVALID_REQUEST,
                "unknown_upstream",
                f"No MCP upstream named {name!r} is configured.",
                http_status=404,
            )
        )
    return spec


async def _read_capped(request: web.Request, cap: int) -> bytes:
    if request.content_length is not None:
        if request.content_length > cap:
            raise _BodyTooLarge
        try:
            return await request.content.readexactly(request.content_length)
        except asyncio.IncompleteReadError as exc:
            return exc.partial  # the client stopped sending: it fails to parse as JSON
    data = bytearray()
    async for chunk in request.content.iter_any():
        data += chunk
        if len(data) > cap:
            raise _BodyTooLarge
    return bytes(data)


async def _post(request: web.Request) -> web.StreamResponse:
    spec = _upstream(request)
    if isinstance(spec, web.Response):
        return spec
    if request.content_type != "application/json":
        return _error(
            bad_request(
                CODE_INVALID_REQUEST,
                "unsupported_media_type",
                "MCP messages must be sent as Content-Type: application/json.",
                http_status=415,
            )
        )
    cap = request.app[CONFIG].max_body_bytes
    try:
        raw = await _read_capped(request, cap)
    except _BodyTooLarge:
        return _error(
            bad_request(
                CODE_INVALID_REQUEST,
                "body_too_large",
                f"The request body is larger than the limit of {cap} bytes.",
                http_status=413,
            )
        )
    try:
        body = parse_body(raw)
    except InvalidBody as exc:
        return _error(exc.answer)
    version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER)
    pc = PostContext(
        request=request,
        spec=spec,
        raw=raw,
        protocol_version=version,
        session_id=request.headers.get(MCP_SESSION_ID_HEADER),
        modern=is_modern(version),
    )
    if body.batch:
        return await handle_batch(pc, body)
    return await handle_single(pc, body.single)


def _transport(request: web.Request) -> McpTransport:
    return request.app[MCP_TRANSPORT]


def _not_reached(exc: UpstreamError) -> web.Response:
    return web.json_response(
        {"error": {"type": "upstream_unreachable", "message": str(exc)}}, status=502
    )


async def _relay_http(request: web.Request, spec: UpstreamSpec, method: str) -> web.StreamResponse:
    """GET (the server→client stream) and DELETE (end of session), relayed unchanged."""
    headers = upstream_request_headers(
        request.headers, spec.headers, forward_authorization=not request.app[CONFIG].tenant_api_keys
    )
    gone = ClientGone()
    transport = _transport(request)
    with transport.watcher.watch(request, gone):
        try:
            response = await relay_http(
                request,
                transport.http.pool(spec),
                spec,
                method=method,
                headers=headers,
                gone=gone,
            )
        except UpstreamError as exc:
            return _not_reached(exc)
    if (method == "DELETE" and response.status < 300) or response.status == 404:
        transport.forget(spec.name, request.headers.get(MCP_SESSION_ID_HEADER))
    return response


def _stdio_session_error(request: web.Request, spec: UpstreamSpec) -> web.Response | None:
    if is_modern(request.headers.get(MCP_PROTOCOL_VERSION_HEADER)):
        return web.Response(status=405, headers={"Allow": "POST"})
    if not request.headers.get(MCP_SESSION_ID_HEADER):
        return _error(
            bad_request(
                CODE_INVALID_REQUEST, "missing_session_id", "Mcp-Session-Id header required."
            )
        )
    return None


async def _get(request: web.Request) -> web.StreamResponse:
    spec = _upstream(request)
    if isinstance(spec, web.Response):
        return spec
    resumed = recorded_stream(request, spec)
    if resumed is not None:
        return await replay(request, *resumed)
    if spec.kind == "mcp_http":
        return await _relay_http(request, spec, "GET")
    if (refusal := _stdio_session_error(request, spec)) is not None:
        return refusal
    if not accepts_sse(request.headers):
        return web.Response(status=406, text="Accept must include text/event-stream")
    process = _transport(request).stdio.session(spec, request.headers[MCP_SESSION_ID_HEADER])
    if process is None:
        return _error(
            bad_request(
                CODE_INVALID_REQUEST, "session_not_found", "No such session.", http_status=404
            )
        )
    if request.headers.get(LAST_EVENT_ID_HEADER):
        return _error(
            bad_request(
                CODE_INVALID_REQUEST,
                "unknown_last_event_id",
                "This session has no event stream with that Last-Event-ID (any more).",
            )
        )
    if process.get_stream_open:
        return web.Response(status=409, text="This session already has a GET stream open")
    return await unsolicited_stream(request, process)


async def _delete(request: web.Request) -> web.StreamResponse:
    spec = _upstream(request)
    if isinstance(spec, web.Response):
        return spec
    if spec.kind == "mcp_http":
        return await _relay_http(request, spec, "DELETE")
    if (refusal := _stdio_session_error(request, spec)) is not None:
        return refusal
    session_id = request.headers[MCP_SESSION_ID_HEADER]
    transport = _transport(request)
    if transport.stdio.session(spec, session_id) is None:
        return _error(
            bad_request(
                CODE_INVALID_REQUEST, "session_not_found", "No such session.", http_status=404
            )
        )
    await transport.stdio.end_session(session_id)
    transport.forget(spec.name, session_id)
    return web.Response(status=200)
