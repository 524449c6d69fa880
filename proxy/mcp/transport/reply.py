"""The client side of one MCP POST: answer with JSON, or with an SSE stream opened lazily.

`ClientReply` is what upstream relays write into (it implements `upstreams.relay.Relay`).
Intermediate messages (progress, a server's elicitation request, the proxy's own "queued"
notifications) open a `text/event-stream` response at the first one, if the client accepts SSE; the
final message then ends that stream. With no intermediate message the final one is a plain
`application/json` answer. A client that went away makes writes no-ops and sets the call's
`client_gone` event (its write failed: it is gone).

`DisconnectWatcher` sets `client_gone` while nothing is being written (aiohttp does not cancel
handlers by default, so the proxy notices a dropped connection itself).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence

from aiohttp import web

from proxy.mcp.wire.sse import SSE_HEADERS, format_comment, format_event

__all__ = ["ClientReply", "DisconnectWatcher", "accepts_sse"]

_JSON = "application/json"
_WRITE_ERRORS = (ConnectionError, RuntimeError)  # aiohttp raises these once the peer is gone


def accepts_sse(headers: Mapping[str, str]) -> bool:
    """Whether the client's `Accept` allows `text/event-stream`."""
    accept = headers.get("Accept", "")
    return "text/event-stream" in accept or "*/*" in accept


class ClientReply:
    """One client POST's answer (implements `Relay`)."""

    def __init__(
        self,
        request: web.Request,
        *,
        sse_ok: bool,
        gone: asyncio.Event,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._request = request
        self._sse_ok = sse_ok
        self._gone = gone
        self._headers = dict(headers or {})
        self._stream: web.StreamResponse | None = None
        self._lock = asyncio.Lock()
        self.dropped = 0  # intermediate messages a JSON-only client could not receive

    @property
    def streaming(self) -> bool:
        return self._stream is not None

    def set_header(self, name: str, value: str) -> None:
        """Add a response header (only effective before the response starts)."""
        self._headers[name] = value

    async def message(self, data: bytes) -> None:
        await self._write(format_event(data))

    async def comment(self, raw: bytes) -> None:
        await self._write(raw if raw.endswith(b"\n") else format_comment())

    async def _write(self, chunk: bytes) -> None:
        if not self._sse_ok:
            self.dropped += 1
            return
        async with self._lock:
            if self._gone.is_set():
                return
            try:
                if self._stream is None:
                    stream = web.StreamResponse(
                        status=200, headers={**self._headers, **SSE_HEADERS}
                    )
                    await stream.prepare(self._request)
                    self._stream = stream
                await self._stream.write(chunk)
            except _WRITE_ERRORS:
                self._gone.set()

    async def finish(self, data: bytes, *, status: int = 200) -> web.StreamResponse:
        """End the exchange with its final message."""
        return await self.finish_many([data], status=status, batch=False)

    async def finish_many(
        self, items: Sequence[bytes], *, status: int = 200, batch: bool = True
    ) -> web.StreamResponse:
        """End with several final messages (a batch): one SSE event each, or one JSON array."""
        async with self._lock:
            if self._stream is None:
                body = b"[" + b",".join(items) + b"]" if batch else items[0]
                return web.Response(
                    body=body, status=status, content_type=_JSON, headers=self._headers
                )
            stream = self._stream
            if not self._gone.is_set():
                try:
                    for item in items:
                        await stream.write(format_event(item))
                    await stream.write_eof()
                except _WRITE_ERRORS:
                    self._gone.set()
            return stream

    async def accepted(self) -> web.StreamResponse:
        """End with no message at all (only notifications and responses were posted)."""
        if self._stream is not None:
            with contextlib.suppress(*_WRITE_ERRORS):
                await self._stream.write_eof()
            return self._stream
        return web.Response(status=202, headers=self._headers)


class DisconnectWatcher:
    """Sets an event when a watched request's connection closes (one polling task for all)."""

    def __init__(self, interval_s: float = 0.1) -> None:
        self._interval_s = interval_s
        self._watched: dict[int, tuple[web.BaseRequest, asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, request: web.BaseRequest, gone: asyncio.Event) -> _Watch:
        """Inside `with watcher.watch(request, gone)`, `gone` is set if the client disconnects."""
        return _Watch(self, request, gone)

    def _add(self, request: web.BaseRequest, gone: asyncio.Event) -> int:
        key = id(gone)
        self._watched[key] = (request, gone)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="mcp-disconnect-watcher")
        return key

    async def _run(self) -> None:
        while self._watched:
            await asyncio.sleep(self._interval_s)
            for key, (request, gone) in list(self._watched.items()):
                transport = request.transport
                if transport is None or transport.is_closing():
                    gone.set()
                    self._watched.pop(key, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class _Watch:
    __slots__ = ("_gone", "_key", "_request", "_watcher")

    def __init__(
        self, watcher: DisconnectWatcher, request: web.BaseRequest, gone: asyncio.Event
    ) -> None:
        self._watcher = watcher
        self._request = request
        self._gone = gone
        self._key = 0

    def __enter__(self) -> None:
        self._key = self._watcher._add(self._request, self._gone)

    def __exit__(self, *exc_info: object) -> None:
        self._watcher._watched.pop(self._key, None)
