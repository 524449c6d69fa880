"""The client side of one MCP POST: answer with JSON, or with an SSE stream opened lazily.

`ClientReply` is what upstream relays write into (it implements `upstreams.relay.Relay`).
Intermediate messages (progress, a server's elicitation request, the proxy's own "queued"
notifications) open a `text/event-stream` response at the first one, if the client accepts SSE; the
final message then ends that stream. With no intermediate message the final one is a plain
`application/json` answer. A client that went away makes writes no-ops and sets the call's
`client_gone` event (its write failed: it is gone).

Progress stays increasing on every token: once the proxy has sent its own progress (while the
call waited), a server's own notification on that token whose value would not increase is lifted
just above the last value sent — the only change the proxy makes to a relayed message.

`DisconnectWatcher` sets `client_gone` while nothing is being written (aiohttp does not cancel
handlers by default, so the proxy notices a dropped connection itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from proxy.mcp.transport.resumption import StreamRecord
from proxy.mcp.wire.headers import MCP_SESSION_ID_HEADER
from proxy.mcp.wire.jsonrpc import WireMessage, dumps, wire_bytes
from proxy.mcp.wire.sse import SSE_HEADERS, SseParser, format_comment, format_event

__all__ = ["ClientReply", "DisconnectWatcher", "accepts_sse"]

_JSON = "application/json"
_PROGRESS = "notifications/progress"
_LIFT = 0.000001  # how far above the proxy's own last value a server's lower progress is lifted
_WRITE_ERRORS = (ConnectionError, RuntimeError)  # aiohttp raises these once the peer is gone


def accepts_sse(headers: Mapping[str, str]) -> bool:
    """Whether the client's `Accept` allows `text/event-stream`."""
    accept = headers.get("Accept", "")
    return "text/event-stream" in accept or "*/*" in accept


class ClientReply:
    """One client POST's answer (implements `Relay`).

    With a `record` (a handshake-era session whose client accepts SSE), every event written gets
    an id - the upstream's, else one minted here - and is kept in the record, so the client can
    resume the stream with `GET` + `Last-Event-ID` after losing it; events keep being recorded
    after the client left.
    """

    def __init__(
        self,
        request: web.Request,
        *,
        sse_ok: bool,
        gone: asyncio.Event,
        headers: Mapping[str, str] | None = None,
        record: StreamRecord | None = None,
    ) -> None:
        self._request = request
        self._sse_ok = sse_ok
        self._gone = gone
        self._headers = dict(headers or {})
        self._stream: web.StreamResponse | None = None
        self._lock = asyncio.Lock()
        self._record = record if sse_ok else None
        self._released = False  # the client was let go: the rest goes to the record only
        self.dropped = 0  # intermediate messages a JSON-only client could not receive
        self._progress_floor: dict[Any, float] = {}
        """Per progress token, the last value the proxy itself sent (only then are the
        upstream's own progress notifications read, to keep the sequence increasing)."""

    @property
    def streaming(self) -> bool:
        return self._stream is not None

    def set_header(self, name: str, value: str) -> None:
        """Add a response header (only effective before the response starts)."""
        self._headers[name] = value

    def upstream_headers(self, headers: Mapping[str, str]) -> None:
        """The upstream's answer started: its session header goes to the client as well."""
        for name, value in headers.items():
            if name.lower() == MCP_SESSION_ID_HEADER:
                self._headers[name] = value

    async def own_message(self, message: Mapping[str, Any]) -> None:
        """A message of the proxy's own (e.g. its `queued` progress) for the client's stream."""
        params = message.get("params")
        if message.get("method") == _PROGRESS and isinstance(params, dict):
            value = params.get("progress")
            if isinstance(value, int | float):
                self._progress_floor[params.get("progressToken")] = float(value)
        await self.message(dumps(message))

    async def message(self, data: bytes) -> None:
        if self._progress_floor:
            data = self._lifted(data) or data
        event_id = self._record.mint_id() if self._record is not None else None
        await self._write(format_event(data, event_id=event_id), event_id)

    async def event(self, frame: bytes, event_id: str | None) -> None:
        if self._progress_floor:
            for parsed in SseParser().feed(frame if frame.endswith(b"\n\n") else frame + b"\n\n"):
                if parsed.data and (lifted := self._lifted(parsed.data.encode())) is not None:
                    frame = format_event(lifted, event_id=event_id)
        await self._write(frame, event_id)

    def _lifted(self, data: bytes) -> bytes | None:
        """The upstream's progress notification with its value raised just above the proxy's
        last one on that token, when it would otherwise go backwards; None when it need not."""
        try:
            message = json.loads(data)
        except ValueError:
            return None
        params = message.get("params") if isinstance(message, dict) else None
        if message.get("method") != _PROGRESS or not isinstance(params, dict):
            return None
        token = params.get("progressToken")
        value = params.get("progress")
        floor = self._progress_floor.get(token)
        if floor is None or not isinstance(value, int | float) or value > floor:
            if floor is not None and isinstance(value, int | float):
                self._progress_floor[token] = float(value)
            return None
        lifted = round(floor + _LIFT, 9)
        self._progress_floor[token] = lifted
        return dumps({**message, "params": {**params, "progress": lifted}})

    async def comment(self, raw: bytes) -> None:
        await self._write(raw if raw.endswith(b"\n") else format_comment(), None, record=False)

    async def _write(self, chunk: bytes, event_id: str | None, *, record: bool = True) -> None:
        if not self._sse_ok:
            self.dropped += 1
            return
        async with self._lock:
            if record and self._record is not None:
                self._record.append(event_id or self._record.mint_id(), chunk)
            await self._send(chunk)

    async def let_go(self) -> None:
        """End the client's stream without the answer, as the upstream ended its own.

        Only when the client can come back for the rest: its stream is recorded, and it got an
        event id (the stream started). The call goes on; what follows is recorded for the
        client's `GET` with `Last-Event-ID`.
        """
        async with self._lock:
            if self._record is None or self._stream is None or self._released:
                return
            self._released = True
            if not self._gone.is_set():
                try:
                    await self._stream.write_eof()
                except _WRITE_ERRORS:
                    self._gone.set()

    async def _send(self, chunk: bytes) -> None:
        if self._gone.is_set() or self._released:
            return
        try:
            if self._stream is None:
                stream = web.StreamResponse(status=200, headers={**self._headers, **SSE_HEADERS})
                await stream.prepare(self._request)
                self._stream = stream
            await self._stream.write(chunk)
        except _WRITE_ERRORS:
            self._gone.set()

    async def finish(self, data: bytes, *, status: int = 200) -> web.StreamResponse:
        """End the exchange with its final message."""
        return await self.finish_many([data], status=status, batch=False)

    async def finish_message(self, message: Mapping[str, Any]) -> web.StreamResponse:
        """End with `message`: the upstream's own event frame when it came as one, unchanged.

        An upstream that answered with an event stream is answered with one (SSE stays SSE).
        """
        data = wire_bytes(message)
        if not isinstance(message, WireMessage) or message.frame is None or not self._sse_ok:
            return await self.finish(data)
        if data is not message.raw:  # changed on the way: our own frame for the new bytes
            return await self.finish(data)
        frame, event_id = message.frame, message.event_id
        async with self._lock:
            if self._record is not None:
                self._record.append(event_id or self._record.mint_id(), frame)
                self._record.finish()
            await self._send(frame)
            return await self._end()

    async def _end(self) -> web.StreamResponse:
        assert self._stream is not None or self._gone.is_set()
        if self._stream is None:
            return web.Response(status=200, headers=self._headers)  # nobody is listening
        if not self._gone.is_set() and not self._released:
            try:
                await self._stream.write_eof()
            except _WRITE_ERRORS:
                self._gone.set()
        return self._stream

    async def finish_many(
        self, items: Sequence[bytes], *, status: int = 200, batch: bool = True
    ) -> web.StreamResponse:
        """End with several final messages (a batch): one SSE event each, or one JSON array."""
        async with self._lock:
            if self._stream is None and not (self._gone.is_set() and self._record is not None):
                if self._record is not None:
                    self._record.finish()
                body = b"[" + b",".join(items) + b"]" if batch else items[0]
                return web.Response(
                    body=body, status=status, content_type=_JSON, headers=self._headers
                )
            for item in items:
                event_id = self._record.mint_id() if self._record is not None else None
                frame = format_event(item, event_id=event_id)
                if self._record is not None and event_id is not None:
                    self._record.append(event_id, frame)
                await self._send(frame)
            if self._record is not None:
                self._record.finish()
            return await self._end()

    async def accepted(self) -> web.StreamResponse:
        """End with no message at all (only notifications and responses were posted)."""
        if self._record is not None:
            self._record.finish()
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
