"""What the proxy keeps so that a client can resume a broken event stream (SEP-1699).

A handshake-era client whose POST stream broke sends `GET` with `Last-Event-ID`: it must get the
events it missed on *that* stream, then the rest of it, ending with the response. The proxy
answers from its own record whenever it wrote the stream itself (every `tools/call`, everything
to a stdio upstream); a raw relay's ids are the upstream's and the `GET` goes to the upstream.

Each stream the proxy writes with event ids is a `StreamRecord`: its frames (the exact bytes
sent, or that would have been sent to a client that left) under their ids, and whether it ended.
Ids are the upstream's where the upstream gave one (they are unique in its session), else minted
here (`<session-prefix>-<n>`, unique in the proxy). Bounded: per session the most recent
`max_streams` streams and `max_bytes` bytes of frames (a stream still being written forgets its
own oldest frames past that), at most `max_sessions` sessions, and `max_total_bytes` in all (the
least recently used sessions are forgotten first).
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["SessionStreams", "StreamRecord"]


@dataclass(eq=False)
class StreamRecord:
    """One event stream as written to the client: `(event_id, frame)` in order.

    Positions are absolute (the first frame ever written is 0), so they stay valid when the
    oldest frames of a long stream are forgotten to keep it under `max_bytes`.
    """

    frames: list[tuple[str, bytes]] = field(default_factory=list)
    """The frames still kept, oldest first (`dropped` older ones are forgotten)."""
    done: bool = False
    size: int = 0
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    prefix: str = ""
    on_grow: Callable[[int], None] | None = None
    max_bytes: int | None = None
    dropped: int = 0
    _after: dict[str, int] = field(default_factory=dict)  # event id -> position after it

    def mint_id(self) -> str:
        return f"{self.prefix}-{next(self._ids)}"

    @property
    def end(self) -> int:
        """The position after the last frame written."""
        return self.dropped + len(self.frames)

    def append(self, event_id: str, frame: bytes) -> None:
        self.frames.append((event_id, frame))
        self.size += len(frame)
        self._after[event_id] = self.end
        if self.max_bytes is not None and self.size > self.max_bytes + self.max_bytes // 4:
            self._forget_oldest()
        self._wake()
        if self.on_grow is not None:
            self.on_grow(len(frame))

    def _forget_oldest(self) -> None:
        """Down to `max_bytes` (the newest frame always stays), in one cut: a stream written
        for hours costs each frame one copy, not one per later frame."""
        assert self.max_bytes is not None
        cut = 0
        while self.size > self.max_bytes and cut < len(self.frames) - 1:
            event_id, frame = self.frames[cut]
            self.size -= len(frame)
            if self._after.get(event_id) == self.dropped + cut + 1:
                del self._after[event_id]
            cut += 1
        del self.frames[:cut]
        self.dropped += cut

    def finish(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def index_after(self, event_id: str) -> int | None:
        """The position right after the frame `event_id` (None: never written, or forgotten)."""
        return self._after.get(event_id)

    def since(self, position: int) -> list[tuple[str, bytes]] | None:
        """The frames from `position` on; None when some of them were forgotten meanwhile."""
        if position < self.dropped:
            return None
        return self.frames[position - self.dropped :]

    async def wait_changed(self, timeout_s: float) -> None:
        """Wait until a frame is added or the stream ends (or `timeout_s` passes)."""
        changed = self._changed
        if self.done:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await changed.wait()
        except TimeoutError:
            return


class _SessionBook:
    def __init__(self, max_streams: int, max_bytes: int, on_grow: Callable[[int], None]) -> None:
        self._on_grow = on_grow
        self.prefix = secrets.token_hex(4)
        self.numbers = itertools.count(1)
        self.streams: OrderedDict[int, StreamRecord] = OrderedDict()
        self._max_streams = max_streams
        self._max_bytes = max_bytes

    def open(self) -> StreamRecord:
        number = next(self.numbers)
        record = StreamRecord(
            prefix=f"{self.prefix}-{number}", on_grow=self._on_grow, max_bytes=self._max_bytes
        )
        self.streams[number] = record
        self._trim()
        return record

    def find(self, event_id: str) -> tuple[StreamRecord, int] | None:
        for record in reversed(self.streams.values()):
            index = record.index_after(event_id)
            if index is not None:
                return record, index
        return None

    @property
    def size(self) -> int:
        return sum(r.size for r in self.streams.values())

    def _trim(self) -> None:
        while len(self.streams) > self._max_streams:
            self.streams.popitem(last=False)
        total = self.size
        for number in list(self.streams):
            if total <= self._max_bytes or len(self.streams) == 1:
                break
            total -= self.streams.pop(number).size


class SessionStreams:
    """The stream records of every handshake-era session (bounded)."""

    def __init__(
        self,
        *,
        max_sessions: int = 1000,
        max_streams: int = 16,
        max_bytes: int = 4 * 1024 * 1024,
        max_total_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self._books: OrderedDict[str, _SessionBook] = OrderedDict()
        self._max_sessions = max_sessions
        self._max_streams = max_streams
        self._max_bytes = max_bytes
        self._max_total = max_total_bytes
        self._grown = 0  # bytes recorded since the total was last measured

    def open(self, session_id: str) -> StreamRecord:
        """A new stream record for `session_id`."""
        book = self._books.get(session_id)
        if book is None:
            book = _SessionBook(self._max_streams, self._max_bytes, self._grew)
            self._books[session_id] = book
            while len(self._books) > self._max_sessions:
                self._books.popitem(last=False)
        self._books.move_to_end(session_id)
        return book.open()

    def _grew(self, size: int) -> None:
        # Measuring the total walks every record: done once per `max_bytes` recorded.
        self._grown += size
        if self._grown < self._max_bytes:
            return
        self._grown = 0
        total = sum(book.size for book in self._books.values())
        while total > self._max_total and len(self._books) > 1:
            _, oldest = self._books.popitem(last=False)
            total -= oldest.size

    def find(self, session_id: str | None, event_id: str) -> tuple[StreamRecord, int] | None:
        """The stream that carried `event_id` in this session, and where to resume it."""
        book = self._books.get(session_id) if session_id else None
        return book.find(event_id) if book is not None else None

    def forget(self, session_id: str | None) -> None:
        if session_id:
            self._books.pop(session_id, None)
