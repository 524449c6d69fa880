"""Run the proxy's MCP transport for a test: a real aiohttp server on a free 127.0.0.1 port.

    async with running_proxy({"up": http_upstream("up", url)}) as proxy:
        async with Client(proxy.mcp_url("up")) as client: ...

The application is the minimal one the transport needs (configuration, runtime, annotations and
`setup_mcp`), served by `web.AppRunner` with aiohttp's default of not cancelling handlers when a
client disconnects (as `web.run_app` serves it in production).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from policies.model import Config, UpstreamSpec
from proxy.mcp_routes import setup_mcp
from proxy.state import ANNOTATIONS, CONFIG, RUNTIME, Runtime
from tests.integration.mcp_servers import REPO_ROOT, stdio_command

__all__ = ["RunningProxy", "http_upstream", "running_proxy", "stdio_upstream"]


def http_upstream(name: str, url: str, **values: Any) -> UpstreamSpec:
    """A Streamable HTTP upstream spec."""
    return UpstreamSpec(name=name, kind="mcp_http", url=url, **values)


def stdio_upstream(name: str, command: tuple[str, ...] | None = None, **values: Any) -> UpstreamSpec:
    """A stdio upstream spec (by default the test upstream's stdio script)."""
    return UpstreamSpec(
        name=name,
        kind="mcp_stdio",
        command=command or stdio_command(),
        cwd=str(REPO_ROOT),
        **values,
    )


@dataclass
class RunningProxy:
    app: web.Application
    port: int

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def mcp_url(self, upstream: str) -> str:
        return f"{self.base}/mcp/{upstream}"


def build_app(config: Config, **mcp_options: Any) -> web.Application:
    """The minimal application around the MCP transport."""
    app = web.Application(client_max_size=config.max_body_bytes)
    app[CONFIG] = config
    app[RUNTIME] = Runtime()
    app[ANNOTATIONS] = {}
    setup_mcp(app, **mcp_options)
    return app


@contextlib.asynccontextmanager
async def running_proxy(
    upstreams: Mapping[str, UpstreamSpec], *, config: Mapping[str, Any] | None = None, **mcp_options: Any
) -> AsyncIterator[RunningProxy]:
    """Serve the proxy for `upstreams` until the block ends (then shut it down cleanly)."""
    app = build_app(Config(upstreams=dict(upstreams), **(config or {})), **mcp_options)
    runner = web.AppRunner(app, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield RunningProxy(app=app, port=port)
    finally:
        await runner.cleanup()
