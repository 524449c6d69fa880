"""Server-Sent Events: an incremental parser that keeps each event's exact bytes, and a writer.

Pure: no I/O. The parser is fed chunks as they arrive and returns every event completed so far,
so a relay forwards each event as soon as its blank line arrives (never the whole stream) and can
forward it byte-for-byte (`SseEvent.raw`). Comments (`: ping`) come out as events of their own
(`comment=True`) so keep-alives can be relayed too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SSE_HEADERS", "SseEvent", "SseParser", "format_comment", "format_event"]

SSE_HEADERS: Mapping[str, str] = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",
}
"""The headers of an event stream the proxy opens itself."""

_LINE_END = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event (or one comment line)."""

    raw: bytes
    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None
    comment: bool = False


class SseParser:
    """Incremental `text/event-stream` parser (WHATWG rules; any of CRLF, LF, CR ends a line).

    `max_event_bytes` bounds how much one event may buffer (a stream that never ends an event
    raises `ValueError` instead of eating memory).
    """

    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._buffer = bytearray()
        self._start = 0  # where the current event's raw bytes begin in `_buffer`
        self._scan = 0  # where the next line begins
        self._checked = 0  # bytes before this hold no line end (after `_scan`)
        self._fields: list[tuple[str, str]] = []
        self._max = max_event_bytes

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Add bytes; return the events (and comments) they completed.

        Linear in the bytes fed, however they are chunked: the buffer grows in place, a line end
        is searched for only in bytes not searched before, and consumed events are dropped from
        the front once per call.
        """
        buffer = self._buffer
        buffer += chunk
        events: list[SseEvent] = []
        while True:
            match = _LINE_END.search(buffer, max(self._scan, self._checked))
            if match is None:
                self._checked = len(buffer)
                break
            if match.end() == len(buffer) and buffer[-1] == 0x0D:
                self._checked = match.start()  # a lone CR at the end may be half of a CRLF
                break
            line = buffer[self._scan : match.start()]
            self._scan = match.end()
            event = self._line(line)
            if event is not None:
                events.append(event)
        if self._start:
            del buffer[: self._start]
            self._scan -= self._start
            self._checked -= self._start
            self._start = 0
        if len(buffer) > self._max:
            raise ValueError(f"SSE event larger than {self._max} bytes")
        return events

    def _take_raw(self) -> bytes:
        with memoryview(self._buffer) as view:
            raw = view[self._start : self._scan].tobytes()
        self._start = self._scan
        return raw

    def _line(self, line: bytearray) -> SseEvent | None:
        if not line:
            if not self._fields:
                self._take_raw()
                return None
            return self._dispatch()
        if line.startswith(b":"):
            if self._fields:
                return None  # a comment inside an event stays part of that event's bytes
            return SseEvent(
                raw=self._take_raw(), comment=True, data=line[1:].decode(errors="replace")
            )
        name, _, value = line.decode(errors="replace").partition(":")
        self._fields.append((name, value[1:] if value.startswith(" ") else value))
        return None

    def _dispatch(self) -> SseEvent:
        event, data, event_id, retry = "message", [], None, None
        for name, value in self._fields:
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value or "message"
            elif name == "id" and "\0" not in value:
                event_id = value
            elif name == "retry" and value.isdigit():
                retry = int(value)
        self._fields = []
        return SseEvent(
            raw=self._take_raw(), event=event, data="\n".join(data), id=event_id, retry=retry
        )


def format_event(
    data: bytes, *, event: str | None = "message", event_id: str | None = None
) -> bytes:
    """One SSE event carrying `data` (split over several `data:` lines if it has line breaks)."""
    parts = []
    if event:
        parts.append(b"event: " + event.encode() + b"\r\n")
    if event_id is not None:
        parts.append(b"id: " + event_id.encode() + b"\r\n")
    for line in _LINE_END.split(data) if (b"\n" in data or b"\r" in data) else (data,):
        parts.append(b"data: " + line + b"\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def format_comment(text: str = "ping") -> bytes:
    """A comment line (keep-alive)."""
    return b": " + text.encode() + b"\r\n\r\n"
