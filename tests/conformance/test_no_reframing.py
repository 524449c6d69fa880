"""What crosses the proxy is what was sent (issue 12, item 7).

A real aiohttp server plays an MCP upstream that frames its events its own way (LF line ends,
`id:` before `event:`) and records the exact bytes of every request. Through the proxy, a
`tools/call` reaches it without added fields, and its answer reaches the client as it sent it:
an event stream stays an event stream, with its ids, its framing, its `Mcp-Session-Id`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
)
from tests.integration.proxy_harness import serving

http = mcp_proxy_harness.http
SESSION = "upstream-session-1"


def _frame(event_id: str, message: dict[str, Any]) -> bytes:
    """The upstream's own framing: LF line ends, the id first."""
    return f"id: {event_id}\nevent: message\ndata: {json.dumps(message)}\n\n".encode()


@dataclass
class FramingUpstream:
    """An MCP upstream answering every request with one SSE event of its own framing."""

    bodies: list[bytes] = field(default_factory=list)
    sent: list[bytes] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.bodies.append(body)
        message = json.loads(body)
        if "id" not in message:
            return web.Response(status=202)
        result = minimal_result(message["method"], "framing")
        frame = _frame(
            f"ev-{len(self.bodies)}", {"jsonrpc": "2.0", "id": message["id"], "result": result}
        )
        self.sent.append(frame)
        headers = {"Content-Type": "text/event-stream", "Mcp-Session-Id": SESSION}
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        await response.write(frame)
        await response.write_eof()
        return response


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[FramingUpstream, str]]:
    fake = FramingUpstream()
    app = web.Application()
    app.router.add_route("*", "/mcp", fake.handle)
    async with serving(app) as base:
        yield fake, f"{base}/mcp"


@pytest.fixture
async def proxy(
    tmp_path: Path, upstream: tuple[FramingUpstream, str]
) -> AsyncIterator[RunningProxy]:
    async with running_proxy({"up": http_upstream("up", upstream[1])}, tmp_path) as running:
        yield running


async def _call(raw: RawMcp, body: bytes) -> aiohttp.ClientResponse:
    return await raw.http.post(raw.url, data=body, headers=raw.headers())


async def test_a_tools_call_reaches_the_upstream_as_the_client_wrote_it(
    proxy: RunningProxy, upstream: tuple[FramingUpstream, str], http: aiohttp.ClientSession
) -> None:
    """No `"_meta": {}` (or anything else) is added to a forwarded request."""
    fake, _ = upstream
    raw = RawMcp(http, proxy.mcp_url("up"))
    await raw.initialize()
    body = b'{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "look"}}'
    async with await _call(raw, body) as answer:
        await answer.read()
    assert fake.bodies[-1] == body


async def test_a_callers_trace_reaches_the_upstream_in_a_meta_of_its_own(
    proxy: RunningProxy, upstream: tuple[FramingUpstream, str], http: aiohttp.ClientSession
) -> None:
    """A caller's trace context is the one thing added: in a `_meta` the client did not send."""
    fake, _ = upstream
    raw = RawMcp(http, proxy.mcp_url("up"))
    await raw.initialize()
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    body = b'{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "look"}}'
    headers = raw.headers({"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"})
    async with await raw.http.post(raw.url, data=body, headers=headers) as answer:
        await answer.read()
    forwarded = json.loads(fake.bodies[-1])
    meta = forwarded["params"].pop("_meta")
    assert meta["traceparent"].split("-")[1] == trace_id
    assert forwarded == json.loads(body)


async def test_an_upstream_event_stream_reaches_the_client_byte_for_byte(
    proxy: RunningProxy, upstream: tuple[FramingUpstream, str], http: aiohttp.ClientSession
) -> None:
    """The answer stays SSE, with the upstream's framing, event id and session header."""
    fake, _ = upstream
    raw = RawMcp(http, proxy.mcp_url("up"))
    await raw.initialize()
    body = b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"look","arguments":{}}}'
    async with await _call(raw, body) as answer:
        data = await answer.read()
        assert answer.content_type == "text/event-stream"
        assert answer.headers.get("Mcp-Session-Id") == SESSION
    assert data == fake.sent[-1]


@pytest.mark.parametrize(
    "meta",
    [b'{"progressToken": 7, "client/own": {"a": [1, 2]}}', b'"not an object"', b"[]"],
    ids=["an-object", "a-string", "a-list"],
)
async def test_a_meta_of_the_clients_own_goes_up_as_written_and_a_trace_is_added_to_it(
    proxy: RunningProxy,
    upstream: tuple[FramingUpstream, str],
    http: aiohttp.ClientSession,
    meta: bytes,
) -> None:
    """Whatever `_meta` the client wrote goes up byte for byte when there is no trace to carry
    (the upstream judges it); with one, an object keeps its members beside the trace context,
    and anything else is replaced by an object holding only the trace context."""
    fake, _ = upstream
    raw = RawMcp(http, proxy.mcp_url("up"))
    await raw.initialize()
    body = b'{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "look", '
    body += b'"_meta": ' + meta + b"}}"
    async with await _call(raw, body) as answer:
        await answer.read()
    assert fake.bodies[-1] == body
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    headers = raw.headers({"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"})
    async with await raw.http.post(raw.url, data=body, headers=headers) as answer:
        await answer.read()
    forwarded = json.loads(fake.bodies[-1])["params"]["_meta"]
    assert forwarded.pop("traceparent").split("-")[1] == trace_id
    client_meta = json.loads(meta)
    assert forwarded == (client_meta if isinstance(client_meta, dict) else {})
