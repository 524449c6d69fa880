"""The proxy keeps no cookies of its own for an upstream, on either path.

Every caller's calls to one upstream (MCP Streamable HTTP, or HTTP) share the proxy's pooled client
session. A cookie jar on that session would replay a cookie the upstream set in one caller's
answer on every other caller's request (a session-affinity or login cookie handed to the wrong
agent). Real aiohttp servers play the upstreams: they set a cookie on every answer and record the
`Cookie` header of every request they receive. They are reached by a host name, `localhost`: a
cookie jar keeps no cookie set by a server named by an IP address.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    RawMcp,
    RunningProxy,
    http_upstream,
    minimal_result,
    running_proxy,
    serving_mcp,
)
from tests.integration.proxy_harness import running_proxy as running_http_proxy
from tests.integration.proxy_harness import serving

http = mcp_proxy_harness.http


@dataclass
class CookieSettingUpstream:
    """Answers every request with JSON and a `Set-Cookie` naming the request it answered."""

    cookies_seen: list[str | None] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.cookies_seen.append(request.headers.get("Cookie"))
        message = json.loads(await request.read())
        if "id" not in message:
            return web.Response(status=202)
        result = minimal_result(message["method"], "cookies")
        response = web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})
        response.set_cookie("affinity", f"request-{len(self.cookies_seen)}", path="/")
        return response


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[CookieSettingUpstream, str]]:
    fake = CookieSettingUpstream()
    async with serving_mcp(fake.handle) as url:
        yield fake, url.replace("127.0.0.1", "localhost")


@pytest.fixture
async def proxy(
    tmp_path: Path, upstream: tuple[CookieSettingUpstream, str]
) -> AsyncIterator[RunningProxy]:
    async with running_proxy({"up": http_upstream("up", upstream[1])}, tmp_path) as running:
        yield running


async def test_a_cookie_one_caller_was_given_never_rides_on_another_callers_call(
    proxy: RunningProxy,
    upstream: tuple[CookieSettingUpstream, str],
    http: aiohttp.ClientSession,
) -> None:
    """Two callers, each with its own connection and session: the upstream's cookies reach
    neither the other caller's requests nor the same caller's later ones through the proxy."""
    fake, _ = upstream
    first = RawMcp(http, proxy.mcp_url("up"))
    await first.initialize()
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as other_http:
        second = RawMcp(other_http, proxy.mcp_url("up"))
        await second.initialize()
        for request_id, raw in enumerate((first, second, first, second), start=10):
            body = {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "tools/call",
                "params": {"name": "look", "arguments": {}},
            }
            answer = await raw.post(body)
            assert answer.status == 200, answer
    assert len(fake.cookies_seen) >= 6  # two handshakes and four calls reached the upstream
    assert fake.cookies_seen == [None] * len(fake.cookies_seen)


async def test_an_http_upstreams_cookie_never_rides_on_a_later_call(tmp_path: Path) -> None:
    """The model-API path relays `Set-Cookie` to its caller and keeps none for itself: no later
    request to the upstream, from that caller or another, carries it."""
    cookies_seen: list[str | None] = []

    async def answer(request: web.Request) -> web.Response:
        cookies_seen.append(request.headers.get("Cookie"))
        response = web.json_response({"ok": True})
        response.set_cookie("affinity", f"request-{len(cookies_seen)}", path="/")
        return response

    app = web.Application()
    app.router.add_get("/v1/models", answer)
    async with serving(app) as base:
        url = base.replace("127.0.0.1", "localhost")
        text = f'upstreams:\n  api: {{http: "{url}"}}\n'
        async with running_http_proxy(text, tmp_path) as proxy:
            for _ in range(3):
                async with (
                    aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as caller,
                    caller.get(f"{proxy.base}/http/api/v1/models") as got,
                ):
                    assert got.status == 200
                    assert got.cookies["affinity"].value == f"request-{len(cookies_seen)}"
    assert cookies_seen == [None, None, None]
