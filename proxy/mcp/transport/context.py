"""What one client POST is, once its body is valid (`PostContext`), the upstream channel it uses
(`channel_for`), and the proxy's own early answers to it (`Answered`, `answer_response`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from policies.answers import CODE_INVALID_REQUEST, Answer, bad_request
from policies.model import UpstreamSpec
from proxy.mcp.catalog import param_headers
from proxy.mcp.transport.reply import ClientReply, accepts_sse
from proxy.mcp.transport.sessions import MCP_TRANSPORT, McpTransport, stream_key
from proxy.mcp.upstreams.channels import HttpChannel, StdioChannel, UpstreamChannel
from proxy.mcp.wire.jsonrpc import dumps
from proxy.state import CONFIG

__all__ = ["Answered", "PostContext", "answer_response", "channel_for"]


class Answered(Exception):
    """Raised with the response to send when a request is answered early (e.g. session gone)."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__("answered")
        self.response = response


def answer_response(answer: Answer, request_id: Any = None) -> web.Response:
    """An answer of the proxy's own as an HTTP response carrying a JSON-RPC error."""
    return web.Response(
        status=answer.http_status,
        body=dumps(answer.jsonrpc_error(request_id)),
        content_type="application/json",
    )


@dataclass
class PostContext:
    """What is known about one client POST once its body is valid."""

    request: web.Request
    spec: UpstreamSpec
    raw: bytes
    protocol_version: str | None
    session_id: str | None
    modern: bool

    @property
    def app(self) -> web.Application:
        return self.request.app

    @property
    def transport(self) -> McpTransport:
        return self.request.app[MCP_TRANSPORT]

    @property
    def sse_ok(self) -> bool:
        return accepts_sse(self.request.headers)

    @property
    def timeout_s(self) -> float:
        return self.spec.timeout_s or self.request.app[CONFIG].defaults.timeout_s

    def reply(self, gone: asyncio.Event, *, resumable: bool = False) -> ClientReply:
        """The client's answer; `resumable`: a request whose event stream may be resumed."""
        record = None
        if resumable and self.session_id and not self.modern and self.sse_ok:
            record = self.transport.streams.open(stream_key(self.spec.name, self.session_id))
        return ClientReply(self.request, sse_ok=self.sse_ok, gone=gone, record=record)


def _session_missing() -> Answered:
    return Answered(
        answer_response(
            bad_request(
                CODE_INVALID_REQUEST,
                "missing_session_id",
                "This request needs the Mcp-Session-Id of an initialized session.",
            )
        )
    )


def _session_gone() -> Answered:
    return Answered(
        answer_response(
            bad_request(
                CODE_INVALID_REQUEST,
                "session_not_found",
                "This MCP session does not exist (any more); initialize a new one.",
                http_status=404,
            )
        )
    )


async def channel_for(pc: PostContext) -> UpstreamChannel:
    """The upstream channel of this POST.

    Raises:
        Answered: a stdio session is missing or gone (400 / 404).
        UpstreamNotReached: the shared stdio process could not be started.
    """
    if pc.spec.kind == "mcp_http":
        return HttpChannel(
            pc.transport.http.pool(pc.spec),
            pc.spec,
            pc.request.headers,
            modern=pc.modern,
            forward_authorization=not pc.app[CONFIG].tenant_api_keys,
            param_headers=param_headers(pc.app, pc.spec.name),
            max_response_bytes=pc.app[CONFIG].max_response_bytes,
        )
    if pc.modern:
        return StdioChannel(await pc.transport.stdio.shared_process(pc.spec))
    if not pc.session_id:
        raise _session_missing()
    process = pc.transport.stdio.session(pc.spec, pc.session_id)
    if process is None:
        raise _session_gone()
    return StdioChannel(process)
