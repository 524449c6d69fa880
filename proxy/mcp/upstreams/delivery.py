"""One caller's messages from a stdio process, written in order without holding up the reader.

A stdio process's output is read by one task for all the callers it serves (the shared modern
process serves every modern client). If that task awaited each caller's write, one client that
stops reading its stream (its socket full, its connection still open) would stop it, and every
other caller's answer queued behind in the pipe. `Delivery` queues a caller's messages and writes
them from a task of its own, so the reader only appends. The caller's answer goes out after what
was queued before it (`flush`).

A caller that falls more than `max_bytes` behind loses the messages past that (they are
progress and log notifications a client that reads nothing would not see anyway); the drop is
logged once per call.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from proxy.mcp.upstreams.relay import Relay

__all__ = ["Delivery"]

log = logging.getLogger("interlock.mcp.stdio")

MAX_QUEUED_BYTES = 4 * 1024 * 1024


class Delivery:
    """An ordered, bounded queue of messages for one caller, drained by its own task."""

    def __init__(self, relay: Relay, name: str, *, max_bytes: int = MAX_QUEUED_BYTES) -> None:
        self._relay = relay
        self._name = name
        self._max = max_bytes
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._task: asyncio.Task[None] | None = None
        self.dropped = 0

    def put(self, data: bytes) -> None:
        """Queue `data` for the caller (never waits)."""
        if self._queue and self._queued + len(data) > self._max:
            self.dropped += 1
            if self.dropped == 1:
                log.warning(
                    "%s: a caller is not reading its stream; dropping what it would be sent "
                    "past %d bytes",
                    self._name,
                    self._max,
                )
            return
        self._queue.append(data)
        self._queued += len(data)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._drain())

    async def _drain(self) -> None:
        while self._queue:
            data = self._queue.popleft()
            self._queued -= len(data)
            try:
                await self._relay.message(data)
            except Exception:  # one caller's broken stream must not end the others' delivery
                log.exception("%s: a message could not be relayed to its caller", self._name)

    async def flush(self) -> None:
        """Wait until everything queued so far has been written (or dropped by `close`); a
        cancelled wait leaves the writing to go on."""
        while self._task is not None and not self._task.done():
            await asyncio.wait({self._task})

    def close(self) -> None:
        """Stop writing: the call ended without its answer (nothing may follow an error)."""
        self._queue.clear()
        self._queued = 0
        if self._task is not None and not self._task.done():
            self._task.cancel()


class Backlog:
    """Messages waiting for a GET stream nobody has opened yet: the newest `max_count`, and no
    more than `max_bytes` (stdio lines can be megabytes each), oldest forgotten first."""

    def __init__(self, *, max_count: int = 256, max_bytes: int = MAX_QUEUED_BYTES) -> None:
        self._messages: deque[bytes] = deque()
        self._bytes = 0
        self._max_count = max_count
        self._max_bytes = max_bytes

    def __len__(self) -> int:
        return len(self._messages)

    def append(self, data: bytes) -> None:
        self._messages.append(data)
        self._bytes += len(data)
        while len(self._messages) > 1 and (
            len(self._messages) > self._max_count or self._bytes > self._max_bytes
        ):
            self._bytes -= len(self._messages.popleft())

    def popleft(self) -> bytes:
        data = self._messages.popleft()
        self._bytes -= len(data)
        return data
