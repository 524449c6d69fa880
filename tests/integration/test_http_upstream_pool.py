"""An HTTP upstream's connections are a bounded pool (`upstreams.<name>.max_connections`): every
request to it holds a slot, however many callers are in flight."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from aiohttp import web

from tests.integration.proxy_harness import running_proxy, serving

CALLS = 6
LIMIT = 2


class _Counting:
    """A real aiohttp upstream that holds each request a moment, counting how many are inside at
    once (it lets in all that come: the proxy's pool must keep the rest out)."""

    def __init__(self) -> None:
        self.inside = 0
        self.most = 0

    async def handle(self, _request: web.Request) -> web.Response:
        self.inside += 1
        self.most = max(self.most, self.inside)
        try:
            await asyncio.sleep(0.3)
        finally:
            self.inside -= 1
        return web.json_response({"ok": True})


async def test_concurrent_calls_never_hold_more_connections_than_the_pool(tmp_path: Path):
    """Six concurrent calls through an upstream with `max_connections: 2` never have more than
    two requests at the upstream at once, and all six are answered."""
    counting = _Counting()
    app = web.Application()
    app.router.add_get("/v1/models", counting.handle)
    config = """
        limits:
          global: {{max_running: 64, max_pending: 64}}
        upstreams:
          api: {{http: "{url}", max_connections: {limit}}}
    """
    async with serving(app) as url:
        text = config.format(url=url, limit=LIMIT)
        async with running_proxy(text, tmp_path) as proxy, aiohttp.ClientSession() as http:

            async def one() -> int:
                async with http.get(f"{proxy.base}/http/api/v1/models") as answer:
                    await answer.read()
                    return answer.status

            statuses = await asyncio.gather(*(one() for _ in range(CALLS)))
    assert statuses == [200] * CALLS
    assert counting.most == LIMIT
