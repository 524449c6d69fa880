"""JSON-RPC batches (handshake-era revisions): split, forward each element, answer each request.

Upstream MCP servers take one message per POST, so the proxy forwards a batch's elements one by
one, in order: notifications and responses are posted as they come, requests run concurrently
(`tools/call` through the pipeline, the others exchanged directly). Every request gets its own
answer - a batch mixing allowed and refused calls gets an error for exactly the refused ones -
as one SSE event each (when the client accepts SSE, so progress can flow) or one JSON array.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from policies.answers import CODE_INVALID_REQUEST, bad_request
from proxy.errors import UpstreamError
from proxy.mcp.catalog import learn_tools
from proxy.mcp.transport.context import Answered, PostContext, answer_response, channel_for
from proxy.mcp.transport.failures import failure_message
from proxy.mcp.transport.handoff import run_tools_call
from proxy.mcp.transport.reply import ClientReply
from proxy.mcp.transport.spans import traced
from proxy.mcp.upstreams.channels import UpstreamChannel
from proxy.mcp.wire.jsonrpc import Body, Message, dumps, wire_bytes
from proxy.runtime.client_gone import ClientGone
from proxy.state import CONFIG

__all__ = ["handle_batch"]

log = logging.getLogger("interlock.mcp")


def _element_answer(message: Message, outcome: bytes | BaseException) -> bytes:
    if isinstance(outcome, bytes):
        return outcome
    if not isinstance(outcome, Exception):
        raise outcome  # cancellation and the like end the whole request
    log.error("batch element %r failed: %r", message.id, outcome)
    error = {"code": -32603, "message": "Interlock failed to answer this element."}
    return dumps({"jsonrpc": "2.0", "id": message.id, "error": error})


async def handle_batch(pc: PostContext, body: Body) -> web.StreamResponse:
    """Forward a batch and answer every request in it (a batch over `max_batch` elements is
    refused whole, before anything is sent)."""
    limit = pc.app[CONFIG].edge.max_batch
    if len(body.messages) + len(body.errors) > limit:
        return answer_response(
            bad_request(
                CODE_INVALID_REQUEST,
                "batch_too_large",
                f"A JSON-RPC batch may hold at most {limit} elements (max_batch).",
            )
        )
    if pc.modern:
        return answer_response(
            bad_request(
                CODE_INVALID_REQUEST,
                "batch_not_supported",
                f"Protocol version {pc.protocol_version} has no JSON-RPC batches.",
            )
        )
    if any(m.method == "initialize" for m in body.messages if m.kind == "request"):
        return answer_response(
            bad_request(
                CODE_INVALID_REQUEST,
                "initialize_in_batch",
                "initialize must be sent on its own, not inside a batch.",
            )
        )
    try:
        channel = await channel_for(pc)
    except Answered as early:
        return early.response
    gone = ClientGone()
    reply = pc.reply(gone)
    calls: list[asyncio.Task[bytes]] = []
    requests: list[Message] = []
    with pc.transport.watcher.watch(pc.request, gone):
        for message in body.messages:
            if message.kind == "request":
                calls.append(asyncio.create_task(_answer(pc, channel, message, reply, gone)))
                requests.append(message)
                continue
            try:
                await channel.post(message.body, None)
            except UpstreamError as exc:
                log.warning("%s: batch element not delivered: %s", pc.spec.name, exc)
        outcomes = await asyncio.gather(*calls, return_exceptions=True)
        # One element's bug must not cost the others their answers (they may have run upstream).
        answers = [_element_answer(m, o) for m, o in zip(requests, outcomes, strict=True)]
    answers += [dumps(error) for error in body.errors]
    if not answers:
        return await reply.accepted()
    return await reply.finish_many(answers)


async def _answer(
    pc: PostContext,
    channel: UpstreamChannel,
    message: Message,
    reply: ClientReply,
    gone: asyncio.Event,
) -> bytes:
    """One request of the batch, answered (an upstream failure becomes its JSON-RPC error)."""
    with traced(
        message,
        pc.spec,
        pc.request.headers,
        session_id=pc.session_id,
        protocol_version=pc.protocol_version,
    ) as outcome:
        try:
            if message.method == "tools/call":
                answer = await run_tools_call(
                    pc.request,
                    spec=pc.spec,
                    channel=channel,
                    message=message,
                    reply=reply,
                    gone=gone,
                    session_id=pc.session_id,
                    protocol_version=pc.protocol_version,
                    modern=False,
                )
            else:
                answer = await channel.exchange(
                    message.body, original=None, relay=reply, timeout_s=pc.timeout_s
                )
        except UpstreamError as exc:
            outcome.error_type = type(exc).__name__
            return dumps(failure_message(message.id, exc, pc.spec))
        outcome.response(answer)
        if message.method == "tools/list" and isinstance(answer.get("result"), dict):
            learn_tools(pc.app, pc.spec.name, answer["result"])
        return wire_bytes(answer)
