"""Resumable event streams (SEP-1699) through the proxy (issue 12, item 3).

A server that primes its stream (an event id, `retry:`) and then closes it expects the client to
come back with `GET` + `Last-Event-ID`. Through the proxy the answer must not be lost: the proxy
follows the stream itself, relays the server's ids, and a client that loses its own connection can
resume from the proxy - for HTTP and for stdio upstreams.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from mcp import Client

from proxy.mcp.wire.sse import SseEvent, SseParser
from proxy.state import LEDGER
from tests.conformance import processes
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    RawMcp,
    RunningProxy,
    http_upstream,
    running_proxy,
    stdio_upstream,
)

http = mcp_proxy_harness.http
RECONNECTED = "Reconnection test completed successfully."


@pytest.fixture(scope="module")
def reference_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("reference") / "reference.log"
    with processes.reference_http(log) as url:
        yield url


def _upstreams(url: str) -> dict[str, Any]:
    return {
        "ref": http_upstream("ref", url, timeout_s=20),
        "st": stdio_upstream("st", tuple(processes.reference_stdio_command()), timeout_s=20),
    }


@pytest.fixture
async def read_only_proxy(tmp_path: Path, reference_url: str) -> AsyncIterator[RunningProxy]:
    async with running_proxy(_upstreams(reference_url), tmp_path) as running:
        yield running


async def _calls(client: Client) -> dict[str, int]:
    result = await client.call_tool("reference_calls", {})
    assert result.structured_content is not None
    counts = result.structured_content
    return {name: int(value) for name, value in counts.items()}


async def test_a_read_only_call_on_a_stream_the_server_closes_is_answered_once(
    read_only_proxy: RunningProxy,
) -> None:
    """The server primes and closes the stream: the client gets the answer, the tool ran once."""
    async with Client(read_only_proxy.mcp_url("ref"), mode="legacy", cache=None) as client:
        before = (await _calls(client)).get("test_reconnection", 0)
        result = await client.call_tool("test_reconnection", {})
        after = (await _calls(client)).get("test_reconnection", 0)
    assert result.is_error is False
    assert result.content[0].text.startswith(RECONNECTED)
    assert after - before == 1


async def test_a_side_effecting_call_on_a_stream_the_server_closes_is_recorded_succeeded(
    tmp_path: Path, reference_url: str
) -> None:
    """The default policy ledgers the call: resumed, it ends `succeeded`, never `unknown`."""
    async with running_proxy(_upstreams(reference_url), tmp_path, read_only=False) as proxy:
        async with Client(proxy.mcp_url("ref"), mode="legacy", cache=None) as client:
            result = await client.call_tool("test_reconnection", {})
        store = proxy.app[LEDGER].store
        assert store is not None
        entries = await store.list_entries(upstream="ref")
    assert result.content[0].text.startswith(RECONNECTED)
    assert [(e.tool, str(e.state)) for e in entries] == [("test_reconnection", "succeeded")]


async def _sse_events(answer: aiohttp.ClientResponse, *, until_id: Any) -> list[SseEvent]:
    """Read events until the JSON-RPC response with id `until_id` (bounded)."""
    parser, events = SseParser(), []
    async with asyncio.timeout(20):
        async for chunk in answer.content.iter_any():
            for event in parser.feed(chunk):
                events.append(event)
                if event.data and json.loads(event.data).get("id") == until_id:
                    return events
    return events


def _call(request_id: int, tool: str, token: Any = None) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": {}}
    if token is not None:
        params["_meta"] = {"progressToken": token}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


async def test_the_client_sees_the_servers_priming_and_closing_and_resumes_as_directly(
    read_only_proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """The server's priming event (id, empty data, retry) reaches the client, its stream ends
    where the server ended it, and GET with Last-Event-ID brings the answer."""
    raw = RawMcp(http, read_only_proxy.mcp_url("ref"))
    await raw.initialize()
    async with http.post(raw.url, json=_call(5, "test_reconnection"), headers=raw.headers()) as ans:
        assert ans.content_type == "text/event-stream"
        posted = await _sse_events(ans, until_id=5)
    first = posted[0]
    assert first.id
    assert first.data == ""
    assert first.retry is not None
    assert all(not e.data for e in posted), "the server closed the stream before its answer"
    last_id = [e.id for e in posted if e.id][-1]
    assert last_id is not None
    headers = raw.headers({"Accept": "text/event-stream", "Last-Event-ID": last_id})
    async with http.get(raw.url, headers=headers) as resumed:
        assert resumed.status == 200
        events = await _sse_events(resumed, until_id=5)
    assert all(e.id for e in events if not e.comment)
    assert json.loads(events[-1].data)["result"]["content"][0]["text"].startswith(RECONNECTED)


async def _resume_after_first_event(
    http: aiohttp.ClientSession, raw: RawMcp, request_id: int
) -> list[SseEvent]:
    """POST a slow call, drop the connection after its first event, resume with Last-Event-ID."""
    body = _call(request_id, "test_tool_with_progress", token="resume-me")
    parser, first = SseParser(), None
    async with http.post(raw.url, json=body, headers=raw.headers()) as answer:
        assert answer.content_type == "text/event-stream"
        async with asyncio.timeout(20):
            while first is None:
                events = parser.feed(await answer.content.readany())
                first = next((e for e in events if not e.comment), None)
        answer.close()  # the client's connection breaks here
    assert first.id, "the first event carries no id: nothing to resume from"
    headers = raw.headers({"Accept": "text/event-stream", "Last-Event-ID": first.id})
    async with http.get(raw.url, headers=headers) as resumed:
        assert resumed.status == 200
        return [first, *await _sse_events(resumed, until_id=request_id)]


@pytest.mark.parametrize("upstream", ["ref", "st"])
async def test_a_client_that_lost_its_stream_resumes_it_through_the_proxy(
    read_only_proxy: RunningProxy, http: aiohttp.ClientSession, upstream: str
) -> None:
    """GET with Last-Event-ID after a broken POST stream returns the rest of it, answer included
    (HTTP upstream and stdio upstream alike)."""
    raw = RawMcp(http, read_only_proxy.mcp_url(upstream))
    await raw.initialize()
    events = await _resume_after_first_event(http, raw, 9)
    messages = [json.loads(e.data) for e in events if e.data]
    progress = [m["params"]["progress"] for m in messages if m.get("method")]
    assert messages[-1]["id"] == 9
    assert messages[-1]["result"]["content"][0]["text"] == "Progress test completed"
    assert 100 in progress


async def test_a_primed_call_whose_upstream_vanishes_before_the_resumption_is_unknown(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """The upstream primed the stream (so the request arrived) and then stopped listening: the
    side-effecting call becomes `unknown` (-32053), never "not sent" and retried."""
    primed = asyncio.Event()

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.method != "POST":
            return web.Response(status=405)
        message = json.loads(await request.read())
        if "id" not in message:
            return web.Response(status=202)
        if message["method"] != "tools/call":
            result: dict[str, Any] = {"tools": []}
            if message["method"] == "initialize":
                result = {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "vanishing", "version": "1"},
                }
            body = {"jsonrpc": "2.0", "id": message["id"], "result": result}
            return web.json_response(body, headers={"Mcp-Session-Id": "s-1"})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"id: p-1\r\ndata: \r\nretry: 300\r\n\r\n")
        await response.write_eof()
        primed.set()
        return response

    app = web.Application()
    app.router.add_route("*", "/mcp", handle)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/mcp"
    upstreams = {"up": http_upstream("up", url, timeout_s=10)}
    try:
        async with running_proxy(upstreams, tmp_path, read_only=False) as proxy:
            raw = RawMcp(http, proxy.mcp_url("up"))
            await raw.initialize()
            posted = await raw.post(_call(3, "send_it"))  # ends after the priming event
            async with asyncio.timeout(10):
                await primed.wait()
            await runner.cleanup()  # the upstream is gone before the proxy comes back
            headers = raw.headers({"Accept": "text/event-stream", "Last-Event-ID": "p-1"})
            async with http.get(raw.url, headers=headers) as resumed:
                events = await _sse_events(resumed, until_id=3)
            store = proxy.app[LEDGER].store
            assert store is not None
            entries = await store.list_entries(upstream="up")
    finally:
        await runner.cleanup()
    assert posted.messages == []
    assert json.loads(events[-1].data)["error"]["code"] == -32053
    assert [(e.tool, str(e.state), e.attempt) for e in entries] == [("send_it", "unknown", 1)]
