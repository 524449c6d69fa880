"""With tracing off (no exporter), Interlock records no span, yet the caller's trace context still
reaches the upstream through the whole MCP path (transport, `tools/call` pipeline, attempt):
from the `traceparent` header or from `params._meta`, whichever the caller used."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.telemetry import tracing
from tests.integration.mcp_proxy_harness import (
    ENVELOPE,
    MODERN,
    http_upstream,
    running_proxy,
    serving_mcp,
)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": MODERN,
    "Mcp-Method": "tools/call",
    "Mcp-Name": "lookup",
}


@pytest.fixture
async def recording_upstream() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A stateless MCP endpoint that notes the trace context each tools/call arrived with."""
    seen: list[dict[str, Any]] = []

    async def mcp(request: web.Request) -> web.Response:
        body = await request.json()
        meta = body.get("params", {}).get("_meta", {})
        seen.append({"header": request.headers.get("traceparent"), "meta": meta.get("traceparent")})
        result = {"content": [{"type": "text", "text": "found"}], "isError": False}
        return web.json_response({"jsonrpc": "2.0", "id": body.get("id"), "result": result})

    async with serving_mcp(mcp) as url:
        yield url, seen


@pytest.mark.parametrize("carrier", ["header", "meta"])
async def test_the_callers_trace_reaches_the_upstream_when_tracing_is_off(
    recording_upstream: tuple[str, list[dict[str, Any]]], tmp_path: Path, carrier: str
) -> None:
    url, seen = recording_upstream
    meta: dict[str, Any] = dict(ENVELOPE)
    headers = dict(HEADERS)
    if carrier == "meta":
        meta["traceparent"] = TRACEPARENT
    else:
        headers["traceparent"] = TRACEPARENT
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "lookup", "arguments": {"q": "x"}, "_meta": meta},
    }
    async with (
        running_proxy({"up": http_upstream("up", url)}, tmp_path) as proxy,
        aiohttp.ClientSession() as http,
        http.post(proxy.mcp_url("up"), json=call, headers=headers) as answer,
    ):
        assert not tracing.tracing_on()  # the app bound a no-op provider: nothing records
        assert answer.status == 200, await answer.text()
        reply = await answer.json()
    assert reply["result"]["content"][0]["text"] == "found"
    assert seen == [{"header": TRACEPARENT, "meta": TRACEPARENT}]
