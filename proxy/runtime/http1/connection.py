"""One HTTP/1.1 connection to an upstream (an asyncio protocol) and the answer read from it.

The protocol only buffers what arrives and wakes the one reader waiting on it; the exchange
(write a request, read a head, read the body) is driven by the caller's task, so an answer costs
no task and no thread of its own. Reading stops when more than `_HIGH_WATER` bytes wait unread
(an upstream that streams faster than the caller reads is held back by TCP, not by our memory).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

from multidict import CIMultiDictProxy

from proxy.errors import UpstreamLost, UpstreamTimeout
from proxy.runtime.http1.chunked import ChunkedDecoder
from proxy.runtime.http1.head import (
    MAX_HEAD_BYTES,
    BadAnswer,
    Framing,
    ResponseHead,
    parse_response_head,
)

__all__ = ["Connection", "Response", "read_head"]

_HIGH_WATER = 256 * 1024
_LOW_WATER = 64 * 1024


class Connection(asyncio.Protocol):
    """Bytes from the upstream, and a way to wait for more (bounded by a read timeout)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.closed = False  # the upstream closed it, it was lost, or we closed it
        self.expires_at = 0.0  # while idle in a pool: when it is too old to reuse
        self._waiter: asyncio.Future[None] | None = None
        self._reading_paused = False
        self._writing_paused = False
        self._drained: asyncio.Future[None] | None = None

    # asyncio's callbacks ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, but they are one
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > _HIGH_WATER and not self._reading_paused and self.transport:
            self._reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()
        self._wake_writer()

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake_writer()

    # for the exchange ----------------------------------------------------------------------

    def write(self, *parts: bytes) -> None:
        assert self.transport is not None
        if len(parts) == 1:
            self.transport.write(parts[0])
        else:
            self.transport.writelines(parts)

    async def drain(self) -> None:
        """Wait until the kernel took most of what was written (for streamed request bodies)."""
        if self._writing_paused and not self.closed:
            self._drained = self._loop.create_future()
            try:
                await self._drained
            finally:
                self._drained = None
        if self.closed:
            raise UpstreamLost("upstream connection lost while the request was sent")

    async def wait_data(self, timeout_s: float | None) -> None:
        """Return once more bytes arrived or the connection closed.

        Raises:
            UpstreamTimeout: nothing arrived within `timeout_s`.
        """
        self.consumed()
        waiter = self._waiter = self._loop.create_future()
        timer = self._loop.call_later(timeout_s, _expire, waiter) if timeout_s is not None else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def consumed(self) -> None:
        """The reader took bytes from `buffer`: read again once it is small enough."""
        if self._reading_paused and len(self.buffer) <= _LOW_WATER and self.transport:
            self._reading_paused = False
            self.transport.resume_reading()

    def reusable(self, now: float) -> bool:
        """An idle connection can carry a request: open, not expired, and silent since its last
        answer (bytes the upstream sent unasked would be read as the next answer's start)."""
        return (
            not self.closed
            and now < self.expires_at
            and not self.buffer
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_writer(self) -> None:
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(UpstreamTimeout("upstream did not answer within the attempt timeout"))


async def read_head(connection: Connection, method: str, timeout_s: float | None) -> ResponseHead:
    """The final response head (interim 1xx answers are skipped).

    Raises:
        UpstreamLost: the connection closed first, or the head is malformed or too large.
        UpstreamTimeout: no byte came within `timeout_s` of the last one.
    """
    buffer = connection.buffer
    searched = 0
    while True:
        end = buffer.find(b"\r\n\r\n", searched)
        if end > MAX_HEAD_BYTES or (end < 0 and len(buffer) > MAX_HEAD_BYTES):
            raise UpstreamLost("upstream answer malformed (its head is too large)")
        if end >= 0:
            try:
                head = parse_response_head(bytes(buffer[:end]), method=method)
            except BadAnswer as exc:
                raise UpstreamLost(f"upstream answer malformed ({exc})") from exc
            del buffer[: end + 4]
            searched = 0
            if head.status == 101:
                raise UpstreamLost("upstream switched protocols, which was not asked for")
            if head.status >= 200:
                return head
            continue  # 100 Continue, 103 Early Hints: the real answer follows
        if connection.closed:
            raise UpstreamLost("upstream connection lost (closed before answering)")
        searched = max(0, len(buffer) - 3)
        await connection.wait_data(timeout_s)


class Response:
    """An upstream's answer: its head, and its body read piece by piece with `readany`.

    `release()` hands the connection back for the next request when the body was read to the
    end and both sides keep the connection alive; otherwise it closes the connection. Call it
    (or `close()`) exactly once per answer: it also frees the pool slot.
    """

    __slots__ = (
        "_connection",
        "_decoder",
        "_done",
        "_give_back",
        "_head",
        "_left",
        "_read_s",
        "_released",
        "_sending",
        "event_stream",
        "headers",
        "status",
    )

    def __init__(
        self,
        connection: Connection,
        head: ResponseHead,
        read_s: float | None,
        give_back: Callable[[Connection, ResponseHead | None], None],
        sending: asyncio.Task[None] | None = None,
    ) -> None:
        self.status = head.status
        self.headers: CIMultiDictProxy[str] = head.headers
        media_type = head.headers.get("Content-Type", "").partition(";")[0]
        self.event_stream = media_type.strip().lower() == "text/event-stream"
        """The answer is a server-sent event stream (its media type, in any spelling)."""
        self._connection = connection
        self._head = head
        self._read_s = read_s
        self._give_back = give_back
        self._sending = sending
        self._left = head.length
        self._decoder = ChunkedDecoder() if head.framing is Framing.CHUNKED else None
        self._done = head.framing is Framing.NONE or (
            head.framing is Framing.LENGTH and head.length == 0
        )
        self._released = False

    @property
    def content_length(self) -> int | None:
        """The body's size when the upstream said it (Content-Length), else None."""
        return self._head.length if self._head.framing is Framing.LENGTH else None

    def at_eof(self) -> bool:
        """The whole body has been read."""
        return self._done

    async def readany(self) -> bytes:
        """The next piece of the body as soon as any is there; `b""` at its end.

        Raises:
            UpstreamLost: the body was cut off or its framing is malformed.
            UpstreamTimeout: no byte came within the read timeout of the last one.
        """
        connection = self._connection
        while not self._done:
            buffer = connection.buffer
            if buffer:
                data = self._take(buffer)
                if data:
                    connection.consumed()
                    return data
                if self._done:
                    break
            if connection.closed:
                if self._head.framing is Framing.CLOSE:
                    self._done = True
                    break
                raise UpstreamLost("upstream connection lost (the answer was cut off)")
            await connection.wait_data(self._read_s)
        return b""

    async def read(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body (less only at its end)."""
        parts: list[bytes] = []
        size = 0
        while size < limit and (piece := await self.readany()):
            parts.append(piece)
            size += len(piece)
        return b"".join(parts)[:limit]

    def _take(self, buffer: bytearray) -> bytes:
        framing = self._head.framing
        if framing is Framing.LENGTH:
            if len(buffer) <= self._left:
                data = bytes(buffer)
                buffer.clear()
            else:
                data = bytes(buffer[: self._left])
                del buffer[: self._left]
            self._left -= len(data)
            self._done = self._left == 0
            return data
        if self._decoder is not None:
            try:
                data = self._decoder.decode(buffer)
            except BadAnswer as exc:
                raise UpstreamLost(f"upstream answer malformed ({exc})") from exc
            self._done = self._decoder.done
            return data
        data = bytes(buffer)  # until close
        buffer.clear()
        return data

    def release(self) -> None:
        """Done with this answer: the connection goes back to its pool if it can carry another."""
        self._end(reuse=True)

    def close(self) -> None:
        """Done with this answer before its end: the connection is closed."""
        self._end(reuse=False)

    def _end(self, *, reuse: bool) -> None:
        if self._released:
            return
        self._released = True
        sending = self._sending
        sent = sending is None or (
            sending.done() and not sending.cancelled() and sending.exception() is None
        )
        reusable = (
            reuse
            and self._done
            and self._head.keep_alive
            and not self._connection.closed
            and not self._connection.buffer  # bytes past the end: the framing was not ours
            and sent
        )
        if sending is not None and not sending.done():
            sending.cancel()
        self._give_back(self._connection, self._head if reusable else None)
