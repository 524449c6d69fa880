"""The hand-off of one `tools/call` from the transport to the pipeline.

`run_tools_call` runs the pipeline (`proxy.mcp.pipeline.tools_call.handle_tools_call`) in the
handler's task, with `send_upstream` bound to the request's upstream channel and `notify` bound
to the client's reply.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from policies.model import UpstreamSpec
from proxy.mcp.pipeline.tools_call import McpCallContext, handle_tools_call
from proxy.mcp.transport.reply import ClientReply
from proxy.mcp.transport.sessions import session_info
from proxy.mcp.upstreams.channels import UpstreamChannel
from proxy.mcp.wire.jsonrpc import JsonObject, Message
from proxy.mcp.wire.tasks import TaskLine, declares_extension
from proxy.state import RUNTIME

__all__ = ["run_tools_call"]


def _task_line(
    app: web.Application, message: Message, session_id: str | None, *, modern: bool
) -> TaskLine | None:
    """Whether (and how) this call's client can take a task handle."""
    if modern:
        meta = message.params.get("_meta")
        return "extension" if isinstance(meta, dict) and declares_extension(meta) else None
    info = session_info(app, session_id)
    return "core" if info is not None and info.client_tasks else None


async def run_tools_call(
    request: web.Request,
    *,
    spec: UpstreamSpec,
    channel: UpstreamChannel,
    message: Message,
    reply: ClientReply,
    gone: asyncio.Event,
    session_id: str | None,
    protocol_version: str | None,
    modern: bool,
) -> JsonObject:
    """Run one `tools/call` through the pipeline; return the response message for the client.

    The pipeline runs in the handler's own task, which is listed in `RUNTIME.in_flight` so that
    shutdown drains it. The server never cancels a handler because its client left (aiohttp's
    `handler_cancellation` is off; `DisconnectWatcher` sets `gone` instead); only shutdown does,
    after its grace period, and the pipeline records a call cancelled in flight as `unknown`
    (`until_written`) before the ledger closes. No helper task or shield per call: they cost
    three more loop callbacks per call.

    Raises:
        UpstreamError: the pipeline let an upstream failure through (see `failure_reply`).
    """
    app = request.app
    ctx = McpCallContext(
        app,
        spec,
        headers=request.headers,
        session_id=session_id,
        protocol_version=protocol_version,
        client_gone=gone,
        task_line=_task_line(app, message, session_id, modern=modern),
        traced=True,  # both callers (`post`, `batch`) run it inside `spans.traced`
    )

    async def send_upstream(outgoing: JsonObject, timeout_s: float) -> JsonObject:
        return await channel.exchange(
            outgoing,
            original=message.body,  # a WireMessage unless in a batch
            relay=reply,
            timeout_s=timeout_s,
            cancel=gone if modern else None,
        )

    async def notify(note: JsonObject) -> None:
        await reply.own_message(note)

    with app[RUNTIME].call_in_flight():
        return await handle_tools_call(ctx, message.body, send_upstream, notify)
