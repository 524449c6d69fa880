"""The listening side: how many client connections the proxy holds, and how long it waits for
slow ones.

- `max_connections`: a connection beyond the cap is answered `503` with `Retry-After` and closed
  at once, before it costs more than the accept (a flood of idle connections cannot exhaust the
  process's file descriptors).
- `client_header_timeout_s`: a connection must send a complete request head within this — a head
  trickling in a byte at a time (slowloris) is cut off — and an idle keep-alive connection is
  closed after it (aiohttp's keep-alive timer, armed from the connection's start).
- `client_body_timeout_s`: a request body that stops arriving for this long is cut off
  (`BodyWatch`, one task for every request still reading its body).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from policies.model import Config
from proxy.state import CONFIG

__all__ = ["BODY_WATCH", "BodyWatch", "setup_body_watch", "start_runner"]

log = logging.getLogger("interlock.listener")


def _refusal_bytes() -> bytes:
    body = json.dumps(
        {
            "error": {
                "type": "overloaded",
                "reason": "too_many_connections",
                "message": "The proxy holds its maximum of client connections; retry shortly.",
                "retry_after_s": 1,
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head + body


_REFUSAL = _refusal_bytes()


def _cap_connections(server: web.Server, max_connections: int) -> None:
    """Refuse connections beyond `max_connections` as they are accepted."""
    register = server.connection_made

    def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
        if len(server.connections) >= max_connections:
            transport.write(_REFUSAL)
            transport.close()
            return
        register(handler, transport)

    # An instance attribute: the handler calls `manager.connection_made(self, transport)`.
    server.connection_made = connection_made  # type: ignore[method-assign]


async def start_runner(
    app: web.Application, config: Config, host: str, port: int, **runner_args: Any
) -> web.AppRunner:
    """Set up `app` behind a listening socket with the edge's connection limits and timeouts."""
    edge = config.edge
    # A client that leaves never cancels its handler: an MCP call's pipeline runs in it and must
    # run on (`proxy.mcp.transport.handoff`); the disconnect watchers tell it who left.
    runner = web.AppRunner(
        app,
        keepalive_timeout=edge.header_timeout_s,
        handler_cancellation=False,
        **runner_args,
    )
    await runner.setup()
    assert runner.server is not None
    _cap_connections(runner.server, edge.max_connections)
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner


class BodyWatch:
    """Closes the connection of a request whose body made no progress for `timeout_s`."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_s = timeout_s
        self._reading: dict[int, tuple[web.BaseRequest, int, float]] = {}
        self._task: asyncio.Task[None] | None = None

    def add(self, request: web.BaseRequest) -> int:
        key = id(request)
        self._reading[key] = (request, request.content.total_bytes, time.monotonic())
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="body-watch")
        return key

    def remove(self, key: int) -> None:
        self._reading.pop(key, None)

    async def _run(self) -> None:
        interval = min(1.0, self._timeout_s / 4)
        while self._reading:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for key, (request, seen, since) in list(self._reading.items()):
                content = request.content
                if content.is_eof():
                    self._reading.pop(key, None)
                elif content.total_bytes != seen:
                    self._reading[key] = (request, content.total_bytes, now)
                elif now - since >= self._timeout_s:
                    self._reading.pop(key, None)
                    log.warning(
                        "closed a connection whose request body stalled for %.0f s (%s %s)",
                        self._timeout_s,
                        request.method,
                        request.path,
                    )
                    if request.transport is not None:
                        request.transport.close()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


BODY_WATCH = web.AppKey("body_watch", BodyWatch)


def setup_body_watch(app: web.Application) -> None:
    """Install the body watch (the app's `CONFIG` must be set)."""
    app[BODY_WATCH] = BodyWatch(app[CONFIG].edge.body_timeout_s)
    app.cleanup_ctx.append(_watch_ctx)


async def _watch_ctx(app: web.Application) -> AsyncIterator[None]:
    yield
    await app[BODY_WATCH].close()
