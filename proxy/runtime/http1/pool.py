"""Kept-alive HTTP/1.1 connections to one upstream, and one request at a time on each.

`Pool.request` sends a request and returns once the answer's head is in; the body is read from
the returned `Response`. At most `limit` requests are in flight at once; the others wait for a
connection to come free, within the attempt's connect timeout (nothing was sent if it passes).

Idle connections are reused newest first, and dropped when the upstream closed them or when
they have been idle for `idle_s` (or one second less than the upstream's own `Keep-Alive:
timeout`), so a request is rarely written into a connection the upstream is closing.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import socket
import ssl
import time
from collections.abc import Callable, Iterable

import aiohttp
from yarl import URL

from proxy.errors import UpstreamNotReached
from proxy.runtime.http1.connection import Connection, Response, read_head
from proxy.runtime.http1.head import BadRequestHead, ResponseHead, keep_alive_s, request_head

__all__ = ["Pool"]

_IDLE_S = 15.0
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
_ONE_WRITE_MAX = 64 * 1024  # a body up to this size is copied behind the head: one send


class Pool:
    """Connections to the upstream at `base` (scheme, host and port are what count)."""

    def __init__(
        self,
        base: URL,
        *,
        limit: int,
        idle_s: float = _IDLE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if base.scheme not in ("http", "https") or not base.host:
            raise ValueError(f"not an http(s) URL: {base}")
        self.base = base
        self._host = base.host
        self._port = base.port or (443 if base.scheme == "https" else 80)
        self._host_header = base.host_port_subcomponent or self._host
        self._ssl = ssl.create_default_context() if base.scheme == "https" else None
        self._limit = limit
        self._idle_s = idle_s
        self._clock = clock
        self._idle: list[Connection] = []
        self._in_use = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        self.opened = 0
        """Connections opened so far (each one a TCP and maybe TLS handshake)."""

    async def request(
        self,
        method: str,
        url: URL,
        headers: Iterable[tuple[str, str]],
        body: bytes | aiohttp.StreamReader | None,
        *,
        connect_s: float,
        read_s: float | None,
        wait_s: float | None = None,
    ) -> Response:
        """Send one request to `url` (on this pool's upstream) and read the answer's head.

        `wait_s` bounds the wait for a free connection (default `connect_s`), `connect_s` the
        opening of a new one, `read_s` each wait for a byte of the answer (None: no bound).

        Raises:
            UpstreamNotReached: nothing was sent (no connection, or a header that cannot be).
            UpstreamLost, UpstreamTimeout: sent, and no well-formed head came back in time.
        """
        if isinstance(body, bytes):
            framing: str | None = str(len(body))
        elif body is not None:
            framing = "chunked"
        else:
            framing = "0" if method in _BODY_METHODS else None
        try:
            head = request_head(method, url.raw_path_qs, self._host_header, headers, framing)
        except BadRequestHead as exc:
            raise UpstreamNotReached(f"request not sent ({exc})") from exc
        connection = await self._acquire(connect_s, connect_s if wait_s is None else wait_s)
        sending: asyncio.Task[None] | None = None
        try:
            if isinstance(body, bytes) and len(body) <= _ONE_WRITE_MAX:
                connection.write(head + body)
            elif isinstance(body, bytes):
                connection.write(head, body)
            else:
                connection.write(head)
                if body is not None:  # streamed: the answer may come before the body ends
                    sending = asyncio.ensure_future(_send_chunked(connection, body))
                    sending.add_done_callback(_seen)
            answer = await read_head(connection, method, read_s)
        except BaseException:
            if sending is not None:
                sending.cancel()
            self._give_back(connection, None)
            raise
        return Response(connection, answer, read_s, self._give_back, sending)

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.abort()

    # connections and slots -------------------------------------------------------------

    async def _acquire(self, connect_s: float, wait_s: float) -> Connection:
        await self._slot(wait_s)
        try:
            now = self._clock()
            while self._idle:
                connection = self._idle.pop()
                if connection.reusable(now):
                    return connection
                connection.abort()
            return await self._connect(connect_s)
        except BaseException:
            self._free_slot()
            raise

    async def _slot(self, wait_s: float) -> None:
        if self._closed:
            raise UpstreamNotReached("upstream not reached (the proxy is shutting down)")
        if self._in_use < self._limit and not self._waiters:
            self._in_use += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(wait_s):
                await waiter  # a releasing request handed its slot over
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._free_slot()  # handed over just as we gave up: pass it on
            elif waiter in self._waiters:  # a release may have dropped it already
                self._waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise UpstreamNotReached(
                    f"upstream not reached (all {self._limit} connections stayed busy)"
                ) from exc
            raise

    def _free_slot(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on; `_in_use` is unchanged
                return
        self._in_use -= 1

    def _give_back(self, connection: Connection, head: ResponseHead | None) -> None:
        """A request is over: keep its connection for the next one (`head` of a reusable
        answer) or close it; either way its slot is free."""
        lasts = self._idle_s
        if head is not None and (promised := keep_alive_s(head.headers)) is not None:
            lasts = min(lasts, promised - 1.0)
        if head is None or lasts <= 0 or self._closed or connection.closed:
            connection.abort()
        else:
            connection.expires_at = self._clock() + lasts
            self._idle.append(connection)
        self._free_slot()

    async def _connect(self, connect_s: float) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_s):
                _, connection = await loop.create_connection(
                    lambda: Connection(loop),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl else None,
                )
        except TimeoutError as exc:
            raise UpstreamNotReached("upstream not reached (connect timeout)") from exc
        except ssl.SSLError as exc:  # an OSError whose errno (1, "EPERM") says nothing
            reason = exc.reason or type(exc).__name__
            raise UpstreamNotReached(f"upstream not reached (TLS handshake: {reason})") from exc
        except socket.gaierror as exc:
            raise UpstreamNotReached("upstream not reached (name lookup failed)") from exc
        except OSError as exc:
            name = errno.errorcode.get(exc.errno or 0, type(exc).__name__)
            raise UpstreamNotReached(f"upstream not reached ({name})") from exc
        self.opened += 1
        return connection


def _seen(task: asyncio.Task[None]) -> None:
    """A failed body copy is reported by the answer it cuts off, not as an unretrieved error."""
    if not task.cancelled():
        task.exception()


async def _send_chunked(connection: Connection, body: aiohttp.StreamReader) -> None:
    """Copy a streamed request body as chunks. If the caller's body fails, the connection is
    aborted before the last chunk: the upstream never sees a complete request."""
    try:
        while chunk := await body.readany():
            connection.write(b"%x\r\n" % len(chunk), chunk, b"\r\n")
            await connection.drain()
        connection.write(b"0\r\n\r\n")
    except BaseException:
        connection.abort()
        raise
