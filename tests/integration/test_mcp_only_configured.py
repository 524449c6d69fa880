"""Only configured upstreams are contacted: an MCP upstream's redirect is never followed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from proxy.state import LEDGER
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import ENVELOPE, MODERN, http_upstream, running_proxy
from tests.integration.proxy_harness import serving

http = mcp_proxy_harness.http


@pytest.fixture
async def elsewhere() -> AsyncIterator[tuple[str, list[str]]]:
    """A server nobody configured, counting every request it receives."""
    seen: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        seen.append(f"{request.method} {request.path}")
        return web.json_response({"jsonrpc": "2.0", "id": 1, "result": {"content": []}})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    async with serving(app) as base:
        yield base, seen


@pytest.fixture
async def redirector(elsewhere: tuple[str, list[str]]) -> AsyncIterator[str]:
    """The configured upstream: it answers every request with 307 to the unconfigured server."""
    target = f"{elsewhere[0]}/mcp"

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPTemporaryRedirect(target)

    app = web.Application()
    app.router.add_route("*", "/mcp", redirect)
    async with serving(app) as base:
        yield f"{base}/mcp"


async def test_a_redirect_is_not_followed_and_the_call_is_released(
    redirector: str,
    elsewhere: tuple[str, list[str]],
    http: aiohttp.ClientSession,
    tmp_path: Path,
):
    """A side-effecting tools/call answered 307 is not re-sent to the Location: the unconfigured
    server receives nothing, and the entry is released (the call did not run)."""
    upstreams = {"up": http_upstream("up", redirector)}
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "send_email", "arguments": {"to": "x"}, "_meta": dict(ENVELOPE)},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "send_email",
    }
    async with running_proxy(upstreams, tmp_path, read_only=False) as proxy:
        async with http.post(proxy.mcp_url("up"), json=body, headers=headers) as answer:
            await answer.read()
            status = answer.status
        store = proxy.app[LEDGER].store
        assert store is not None
        entries = await store.list_entries()
    assert status == 307  # the upstream's own answer is relayed to the caller as it came
    assert elsewhere[1] == []
    assert [str(e.state) for e in entries] == ["rejected"]


@pytest.mark.parametrize("tool", ["search_docs", "send_email"])
async def test_an_unreachable_upstream_is_named_but_its_address_is_not(
    tmp_path: Path, http: aiohttp.ClientSession, tool: str
) -> None:
    """The caller learns which upstream failed and why, never its internal host:port."""
    upstreams = {"up": http_upstream("up", "http://127.0.0.1:9/mcp")}
    async with running_proxy(upstreams, tmp_path) as proxy:
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": tool, "arguments": {"query": "q"}, "_meta": ENVELOPE},
        }
        headers = {
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "tools/call",
            "Mcp-Name": tool,
        }
        async with http.post(proxy.mcp_url("up"), json=body, headers=headers) as answer:
            text = await answer.text()
    assert "upstream_unreachable" in text or "-32054" in text
    assert "127.0.0.1:9" not in text
    assert "('127.0.0.1', 9)" not in text
