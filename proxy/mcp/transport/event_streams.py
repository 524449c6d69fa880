"""The GET side of `/mcp/{upstream}` that the proxy serves itself.

- `unsolicited_stream`: a stdio session's GET stream, carrying what its process says outside any
  request (one per session, as an MCP server allows).
- `recorded_stream` / `replay`: a `GET` with `Last-Event-ID` naming an event the proxy wrote
  (`proxy.mcp.transport.resumption`): the rest of that stream, then what follows live, until it
  ends with its response.

A client that leaves is noticed at once (the disconnect watcher), never only at the next write.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from aiohttp import web

from policies.model import UpstreamSpec
from proxy.mcp.transport.resumption import StreamRecord
from proxy.mcp.transport.sessions import MCP_TRANSPORT, stream_key
from proxy.mcp.upstreams.stdio import StdioProcess
from proxy.mcp.wire.headers import MCP_SESSION_ID_HEADER
from proxy.mcp.wire.sse import SSE_HEADERS, format_comment, format_event
from proxy.runtime.client_gone import ClientGone, cancelled_when

__all__ = ["LAST_EVENT_ID_HEADER", "recorded_stream", "replay", "unsolicited_stream"]

_KEEPALIVE_S = 15.0
LAST_EVENT_ID_HEADER = "Last-Event-ID"


async def unsolicited_stream(request: web.Request, process: StdioProcess) -> web.StreamResponse:
    """A stdio session's GET stream: what the process says outside any request, until it ends.

    The client leaving is noticed at once (the disconnect watcher), not at the next keep-alive,
    so that a client reconnecting is not refused 409 for a stream that is already gone.
    """
    process.get_stream_open = True
    gone = ClientGone()
    try:
        stream = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await stream.prepare(request)
        with (
            request.app[MCP_TRANSPORT].watcher.watch(request, gone),
            contextlib.suppress(ConnectionError, RuntimeError),
        ):
            while process.alive and not gone.is_set():
                message = await _unless_gone(process.next_unsolicited(_KEEPALIVE_S), gone)
                if gone.is_set():
                    break
                await stream.write(format_event(message) if message else format_comment())
            else:
                await stream.write_eof()
        return stream
    finally:
        process.get_stream_open = False


async def _unless_gone(waiting: Awaitable[bytes | None], gone: ClientGone) -> bytes | None:
    """`await waiting`, or None as soon as `gone` is set."""
    try:
        with cancelled_when(gone) as trip:
            return await waiting
    except asyncio.CancelledError:
        if trip is not None and trip.absorb():
            return None
        raise


def recorded_stream(request: web.Request, spec: UpstreamSpec) -> tuple[StreamRecord, int] | None:
    """The stream a `Last-Event-ID` resumes, if the proxy wrote it (else None)."""
    last_event_id = request.headers.get(LAST_EVENT_ID_HEADER)
    session_id = request.headers.get(MCP_SESSION_ID_HEADER)
    if not last_event_id or not session_id:
        return None
    return request.app[MCP_TRANSPORT].streams.find(stream_key(spec.name, session_id), last_event_id)


async def replay(request: web.Request, record: StreamRecord, index: int) -> web.StreamResponse:
    """Resume a stream the proxy wrote: the events after `index`, then the rest as it comes."""
    stream = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await stream.prepare(request)
    gone = ClientGone()
    with (
        request.app[MCP_TRANSPORT].watcher.watch(request, gone),
        contextlib.suppress(ConnectionError, RuntimeError),
    ):
        while not gone.is_set():
            frames = record.since(index)
            if frames is None:
                # This reader fell further behind than the record keeps: the events it missed
                # are gone. Ending the stream makes the client resume from its last id, which
                # is refused as unknown, rather than silently skipping events.
                break
            index += len(frames)
            for _, frame in frames:
                await stream.write(frame)
            if record.done and index >= record.end:
                await stream.write_eof()
                break
            before = record.end
            await _unless_gone(record.wait_changed(_KEEPALIVE_S), gone)
            if record.end == before and not record.done and not gone.is_set():
                await stream.write(format_comment())
    return stream
