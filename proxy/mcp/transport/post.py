"""One client POST carrying a single JSON-RPC message, forwarded to its MCP upstream.

- `tools/call` requests go through the pipeline (`run_tools_call`), whatever the transport.
- Anything else to an HTTP upstream is relayed raw (`relay_http`): the client gets the upstream's
  status, headers and bytes as they stream; `tools/list` answers are tapped to learn annotations,
  `initialize` answers to remember the session.
- Anything else to a stdio upstream: `initialize` spawns a process for a new session (the proxy
  mints its `Mcp-Session-Id`), other requests are exchanged with the session's process (or the
  shared one in the modern era), notifications and responses are written and acknowledged (202).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from policies.answers import refused
from policies.model import UpstreamSpec
from proxy.errors import UpstreamError
from proxy.mcp.catalog import learn_tools
from proxy.mcp.tasks.methods import TASK_METHODS, handle_task_request
from proxy.mcp.transport.context import (
    Answered,
    PostContext,
    channel_for,
)
from proxy.mcp.transport.failures import failure_reply
from proxy.mcp.transport.handoff import run_tools_call
from proxy.mcp.transport.reply import ClientReply
from proxy.mcp.transport.sessions import SessionInfo
from proxy.mcp.transport.spans import CallOutcome, traced
from proxy.mcp.upstreams.stdio_pool import SessionCapReached
from proxy.mcp.upstreams.streamable_http import relay_http
from proxy.mcp.wire.headers import MCP_SESSION_ID_HEADER, upstream_request_headers
from proxy.mcp.wire.jsonrpc import Message, WireMessage, dumps, wire_bytes
from proxy.mcp.wire.tasks import declares_core_tasks
from proxy.runtime.client_gone import ClientGone
from proxy.state import CONFIG
from proxy.telemetry.tracing import inject_headers

__all__ = ["handle_single"]

log = logging.getLogger("interlock.mcp")
_SESSION_RETRY_S = 5.0  # a stdio session slot frees when a client ends or idles out


async def handle_single(pc: PostContext, message: Message) -> web.StreamResponse:
    """Forward a single-message POST and return the client's response."""
    if message.kind == "response":
        return await _forward(pc, message, CallOutcome())
    with traced(
        message,
        pc.spec,
        pc.request.headers,
        session_id=pc.session_id,
        protocol_version=pc.protocol_version,
    ) as outcome:
        if message.kind == "request" and message.method == "tools/call":
            return await _tools_call(pc, message, outcome)
        if message.kind == "request" and message.method in TASK_METHODS:
            answered = await handle_task_request(pc, message)
            if answered is not None:  # else: the upstream's own task
                return answered
        return await _forward(pc, message, outcome)


async def _forward(pc: PostContext, message: Message, outcome: CallOutcome) -> web.StreamResponse:
    if pc.spec.kind == "mcp_http":
        return await _http_passthrough(pc, message, outcome)
    return await _stdio_passthrough(pc, message, outcome)


async def _tools_call(
    pc: PostContext, message: Message, outcome: CallOutcome
) -> web.StreamResponse:
    gone = ClientGone()
    reply = pc.reply(gone, resumable=True)
    try:
        channel = await channel_for(pc)
        with pc.transport.watcher.watch(pc.request, gone):
            answer = await run_tools_call(
                pc.request,
                spec=pc.spec,
                channel=channel,
                message=message,
                reply=reply,
                gone=gone,
                session_id=pc.session_id,
                protocol_version=pc.protocol_version,
                modern=pc.modern,
            )
    except Answered as early:
        outcome.error_type = str(early.response.status)
        return early.response
    except UpstreamError as exc:
        outcome.error_type = type(exc).__name__
        return await failure_reply(reply, message.id, exc, pc.spec)
    outcome.response(answer)
    return await reply.finish_message(answer)


# --- HTTP upstreams: raw relay ---


def _taps(
    pc: PostContext, message: Message, outcome: CallOutcome
) -> tuple[Callable[[WireMessage], None] | None, Callable[[int, Mapping[str, str]], None] | None]:
    """What to read from the upstream's answer while relaying it (only what the proxy needs)."""
    if message.method == "tools/list":

        def learn(response: WireMessage) -> None:
            outcome.response(response)
            if isinstance(response.get("result"), dict):
                learn_tools(pc.app, pc.spec.name, response["result"])

        return learn, None
    if message.method == "initialize":
        params = message.params

        def opened(status: int, headers: Mapping[str, str]) -> None:
            session_id = headers.get(MCP_SESSION_ID_HEADER)
            if status < 300 and session_id:
                pc.transport.sessions.remember(session_id, _session_info(pc.spec, params))

        return outcome.response, opened
    return None, None


def _session_info(spec: UpstreamSpec, params: Mapping[str, Any]) -> SessionInfo:
    info = params.get("clientInfo")
    client: Mapping[str, Any] = info if isinstance(info, dict) else {}
    version = params.get("protocolVersion")
    return SessionInfo(
        upstream=spec.name,
        protocol_version=version if isinstance(version, str) else None,
        client_name=client.get("name"),
        client_version=client.get("version"),
        client_tasks=declares_core_tasks(params),
    )


async def _http_passthrough(
    pc: PostContext, message: Message, outcome: CallOutcome
) -> web.StreamResponse:
    headers = upstream_request_headers(
        pc.request.headers,
        pc.spec.headers,
        forward_authorization=not pc.app[CONFIG].tenant_api_keys,
    )
    inject_headers(headers)
    tap, on_start = _taps(pc, message, outcome)
    gone = ClientGone()
    with pc.transport.watcher.watch(pc.request, gone):
        try:
            response = await relay_http(
                pc.request,
                pc.transport.http.pool(pc.spec),
                pc.spec,
                method="POST",
                headers=headers,
                body=pc.raw,
                tap=tap,
                on_start=on_start,
                gone=gone,
            )
        except UpstreamError as exc:
            outcome.error_type = type(exc).__name__
            if message.kind != "request":
                return web.Response(status=502)
            return await failure_reply(pc.reply(gone), message.id, exc, pc.spec)
    if response.status == 404:
        pc.transport.forget(pc.spec.name, pc.session_id)
    if response.status >= 400 and outcome.error_type is None:
        outcome.error_type = str(response.status)
    return response


# --- stdio upstreams ---


async def _stdio_passthrough(
    pc: PostContext, message: Message, outcome: CallOutcome
) -> web.StreamResponse:
    gone = ClientGone()
    reply = pc.reply(gone, resumable=message.kind == "request")
    try:
        if message.kind == "request" and message.method == "initialize" and not pc.modern:
            return await _stdio_initialize(pc, message, reply, outcome)
        if pc.modern and message.kind != "request":
            # The 2026-07-28 wire has no client notifications; the shared process must not see
            # one client's cancellation of an id that another client also uses.
            return web.Response(status=202)
        channel = await channel_for(pc)
        if message.kind != "request":
            await channel.post(message.body, pc.raw)
            return web.Response(status=202)
        with pc.transport.watcher.watch(pc.request, gone):
            answer = await channel.exchange(
                message.body,
                original=message.body,
                relay=reply,
                timeout_s=pc.timeout_s,
                cancel=gone if pc.modern else None,
            )
    except Answered as early:
        outcome.error_type = str(early.response.status)
        return early.response
    except UpstreamError as exc:
        outcome.error_type = type(exc).__name__
        if message.kind != "request":
            return web.Response(status=502)
        return await failure_reply(reply, message.id, exc, pc.spec)
    outcome.response(answer)
    if message.method == "tools/list" and isinstance(answer.get("result"), dict):
        learn_tools(pc.app, pc.spec.name, answer["result"])
    return await reply.finish_message(answer)


async def _stdio_initialize(
    pc: PostContext, message: Message, reply: ClientReply, outcome: CallOutcome
) -> web.StreamResponse:
    """Start a session: a new process, its `initialize` answer, and a session id minted here."""
    stdio = pc.transport.stdio
    try:
        process = await stdio.spawn_session_process(pc.spec)
    except SessionCapReached as full:
        # Refused like any admission: a JSON-RPC error carrying when to come back.
        refusal = refused("overloaded", f"upstream:{pc.spec.name}", _SESSION_RETRY_S)
        outcome.error_type = "overloaded"
        log.warning("%s", full)
        return await reply.finish(dumps(refusal.jsonrpc_error(message.id)))
    try:
        answer = await process.exchange(
            message.body, raw=pc.raw, relay=reply, timeout_s=pc.timeout_s
        )
    except BaseException:
        await process.close()
        raise
    if "result" not in answer:
        await process.close()
        outcome.response(answer)
        return await reply.finish(wire_bytes(answer))
    session_id = stdio.register_session(process)
    pc.transport.sessions.remember(session_id, _session_info(pc.spec, message.params))
    reply.set_header("Mcp-Session-Id", session_id)
    return await reply.finish(wire_bytes(answer))
