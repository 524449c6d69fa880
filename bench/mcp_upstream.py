"""The benchmarks' MCP upstream: the test suite's real `MCPServer` (Streamable HTTP, its own
process) behind an ASGI wrapper that counts client connections (`GET /bench/connections`).

The count is of distinct client (address, port) pairs that sent a request: the difference over a
cell is how many fresh TCP connections the target in front of it opened (keep-alive reuse shows
as few). Same counter as `bench.common.count_connections`, for uvicorn's ASGI scope.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import AsyncIterator
from typing import Any

from bench.common import CONNECTIONS_PATH, bench_process, free_port

__all__ = ["counted_upstream"]


class _Counting:
    """ASGI middleware: remember each client (address, port); answer the count on its path."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.peers: set[tuple[Any, ...]] = set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            if scope["path"] == CONNECTIONS_PATH:
                body = json.dumps({"connections": len(self.peers)}).encode()
                head = [(b"content-type", b"application/json")]
                head.append((b"content-length", str(len(body)).encode()))
                await send({"type": "http.response.start", "status": 200, "headers": head})
                await send({"type": "http.response.body", "body": body})
                return
            self.peers.add(tuple(scope.get("client") or ()))
        await self.app(scope, receive, send)


def _serve(port: int) -> None:
    import asyncio

    import uvicorn

    from tests.integration.mcp_servers import _Pressure, _PressureWrapper, _State, build_server

    state = _State()
    sdk_app = build_server(state).streamable_http_app(json_response=False, stateless_http=False)
    app = _Counting(_PressureWrapper(sdk_app, state, _Pressure()))
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        loop="asyncio",  # the same loop whatever the proxy under test uses
        timeout_graceful_shutdown=1,
    )
    asyncio.run(uvicorn.Server(config).serve())


@contextlib.asynccontextmanager
async def counted_upstream() -> AsyncIterator[tuple[str, str]]:
    """Run the upstream; yield (MCP endpoint URL, base URL for `connections_seen`)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "bench.mcp_upstream", str(port)]
    async with bench_process(argv, f"{base}/healthz"):
        yield f"{base}/mcp", base


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
