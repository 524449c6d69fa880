"""MCP through the proxy to Streamable HTTP upstreams: real SDK clients, real MCPServers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.types import ElicitRequestParams, ElicitResult

from proxy.mcp.catalog import CATALOG
from proxy.state import LEDGER
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    LEGACY,
    RawMcp,
    RunningProxy,
    http_upstream,
    running_proxy,
)
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.waiting import wait_until

MODES = ["legacy", "auto", "2026-07-28"]


sse_upstream = mcp_proxy_harness.module_sse_upstream
json_upstream = mcp_proxy_harness.module_json_upstream


@pytest.fixture
async def proxy(
    sse_upstream: RunningUpstream, json_upstream: RunningUpstream, tmp_path: Path
) -> AsyncIterator[RunningProxy]:
    upstreams = {
        "sse": http_upstream("sse", sse_upstream.url, timeout_s=10),
        "json": http_upstream("json", json_upstream.url, timeout_s=10),
    }
    async with running_proxy(upstreams, tmp_path) as running:
        yield running


http = mcp_proxy_harness.http


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("upstream", ["sse", "json"])
async def test_sdk_client_lists_and_calls_tools_like_direct(
    proxy: RunningProxy,
    sse_upstream: RunningUpstream,
    json_upstream: RunningUpstream,
    mode: str,
    upstream: str,
):
    """In every client mode, against SSE and JSON upstreams, tools and results match direct ones."""
    direct_url = (sse_upstream if upstream == "sse" else json_upstream).url
    results = []
    for url in (direct_url, proxy.mcp_url(upstream)):
        async with Client(url, mode=mode, cache=None) as client:
            tools = await client.list_tools()
            echoed = await client.call_tool("echo", {"text": "héllo"})
            results.append(([t.model_dump() for t in tools.tools], echoed.model_dump()))
    assert results[0] == results[1]
    assert results[1][1]["content"][0]["text"] == "héllo"


@pytest.mark.parametrize("mode", MODES)
async def test_progress_callbacks_arrive_through_the_proxy(proxy: RunningProxy, mode: str):
    """Progress notifications from an SSE upstream reach the client's callback in every mode."""
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with Client(proxy.mcp_url("sse"), mode=mode, cache=None) as client:
        result = await client.call_tool(
            "slow_progress", {"steps": 3}, progress_callback=on_progress
        )
    assert result.content[0].text == "done after 3 steps"
    # The pipeline may add progress of its own ("queued", "running"); the upstream's are steps.
    steps = [item for item in seen if (item[2] or "").startswith("step")]
    assert steps == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_elicitation_round_trip_in_the_handshake_era(proxy: RunningProxy):
    """A server→client elicitation reaches the client mid-call and its answer reaches the tool."""
    asked: list[str] = []

    async def answer(context: Any, params: ElicitRequestParams) -> ElicitResult:
        asked.append(params.message)
        return ElicitResult(action="accept", content={"name": "Ada"})

    async with Client(
        proxy.mcp_url("sse"), mode="legacy", cache=None, elicitation_callback=answer
    ) as client:
        result = await client.call_tool("ask_name", {})
    assert asked == ["What is your name?"]
    assert result.content[0].text == "hello Ada"


@pytest.mark.parametrize("upstream", ["sse", "json"])
async def test_tools_call_answer_is_byte_identical_to_direct(
    proxy: RunningProxy,
    http: aiohttp.ClientSession,
    sse_upstream: RunningUpstream,
    json_upstream: RunningUpstream,
    upstream: str,
):
    """The JSON-RPC response bytes of a tools/call are the upstream's, in both protocol eras."""
    direct_url = (sse_upstream if upstream == "sse" else json_upstream).url
    answers: list[list[bytes]] = []
    for url in (direct_url, proxy.mcp_url(upstream)):
        legacy = RawMcp(http, url)
        await legacy.initialize()
        call = {
            "jsonrpc": "2.0",
            "id": 41,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "żółw ☃ \\n"}},
        }
        handshake = await legacy.post(call)
        modern = await RawMcp(http, url).call_modern("m-1", "echo", {"text": "x\u2028y"})
        assert handshake.status == modern.status == 200
        answers.append([handshake.messages[-1], modern.messages[-1]])
    assert answers[0] == answers[1]


async def test_tools_list_teaches_tool_annotations(proxy: RunningProxy):
    """tools/list answers passing through record each tool's annotations for classification."""
    async with Client(proxy.mcp_url("sse"), mode="legacy", cache=None) as client:
        await client.list_tools()
    learned = proxy.app[CATALOG].annotations["sse"]
    assert learned["search_docs"] == {"readOnlyHint": True}
    assert learned["send_email"] == {"destructiveHint": True, "idempotentHint": False}
    assert learned["echo"] == {}


async def test_modern_tools_list_is_learned_too(proxy: RunningProxy):
    """A 2026-07-28 tools/list from a JSON upstream is learned the same way."""
    async with Client(proxy.mcp_url("json"), mode="2026-07-28", cache=None) as client:
        await client.list_tools()
    assert proxy.app[CATALOG].annotations["json"]["count"] == {"readOnlyHint": True}


async def test_session_delete_ends_the_upstream_session(
    proxy: RunningProxy, http: aiohttp.ClientSession
):
    """DELETE through the proxy ends the session; the session then answers 404 (kept as 404)."""
    raw = RawMcp(http, proxy.mcp_url("sse"))
    await raw.initialize()
    assert raw.session_id
    ping = {"jsonrpc": "2.0", "id": 5, "method": "ping"}
    assert (await raw.post(ping)).status == 200
    assert await raw.delete() == 200
    after = await raw.post(ping)
    assert after.status == 404


async def test_sdk_client_closes_its_session_with_delete(
    proxy: RunningProxy, sse_upstream: RunningUpstream
):
    """A legacy SDK client leaving sends DELETE through the proxy, which reaches the upstream."""
    before = sse_upstream.stats()["http_methods"].get("DELETE", 0)
    async with Client(proxy.mcp_url("sse"), mode="legacy", cache=None) as client:
        await client.list_tools()
    assert sse_upstream.stats()["http_methods"].get("DELETE", 0) == before + 1


async def test_cancelling_a_modern_call_cancels_the_upstream_handler(
    proxy: RunningProxy, sse_upstream: RunningUpstream
):
    """A 2026-07-28 client that gives up closes its stream; the proxy aborts the upstream call."""
    await _give_up_a_modern_hold(proxy, sse_upstream, "modern-c")


async def _give_up_a_modern_hold(
    proxy: RunningProxy, sse_upstream: RunningUpstream, tag: str
) -> None:
    """A modern client starts a long `hold`, gives up once the upstream runs it, and the
    upstream's handler is then cancelled."""
    async with Client(proxy.mcp_url("sse"), mode="2026-07-28", cache=None) as client:
        call = asyncio.create_task(client.call_tool("hold", {"seconds": 30, "tag": tag}))
        await wait_until(lambda: tag in sse_upstream.stats()["started"])
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    await wait_until(lambda: tag in sse_upstream.stats()["cancelled"])


async def test_a_modern_side_effect_whose_client_leaves_is_recorded_unknown(
    sse_upstream: RunningUpstream, tmp_path: Path
):
    """The call was forwarded, so it may have acted: its entry ends `unknown` (never `running`,
    never `succeeded`), and the proxy stays usable for the next call."""
    upstreams = {"sse": http_upstream("sse", sse_upstream.url, timeout_s=10)}
    async with running_proxy(upstreams, tmp_path, read_only=False) as proxy:
        await _leave_a_side_effect(proxy, sse_upstream)


async def _leave_a_side_effect(proxy: RunningProxy, sse_upstream: RunningUpstream) -> None:
    await _give_up_a_modern_hold(proxy, sse_upstream, "modern-u")
    store = proxy.app[LEDGER].store
    assert store is not None
    for _ in range(500):  # the entry is marked once the cancelled call has unwound
        held = [e for e in await store.list_entries(upstream="sse") if e.tool == "hold"]
        if held and str(held[0].state) != "running":
            break
        await asyncio.sleep(0.01)
    (entry,) = held
    assert str(entry.state) == "unknown"
    assert "client" in (entry.error or ""), entry.error
    async with Client(proxy.mcp_url("sse"), mode="2026-07-28", cache=None) as client:
        assert (await client.call_tool("echo", {"text": "next"})).content[0].text


async def test_cancelling_a_legacy_call_forwards_the_cancellation(
    proxy: RunningProxy, sse_upstream: RunningUpstream
):
    """A handshake-era client's notifications/cancelled reaches the upstream, which stops."""
    async with Client(proxy.mcp_url("sse"), mode="legacy", cache=None) as client:
        call = asyncio.create_task(client.call_tool("hold", {"seconds": 30, "tag": "legacy-c"}))
        await wait_until(lambda: "legacy-c" in sse_upstream.stats()["started"])
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await wait_until(lambda: "legacy-c" in sse_upstream.stats()["cancelled"])
        assert (await client.call_tool("echo", {"text": "still here"})).content[0].text


async def test_only_allowed_headers_reach_the_upstream(
    proxy: RunningProxy, http: aiohttp.ClientSession, sse_upstream: RunningUpstream
):
    """Host, cookies and the proxy's own headers stay behind; the call still works (a foreign
    Origin is refused at the edge, and an allowed one is not forwarded: test_browser_guard)."""
    raw = RawMcp(http, proxy.mcp_url("sse"))
    await raw.initialize()
    answer = await raw.post(
        {"jsonrpc": "2.0", "id": 9, "method": "tools/list"},
        {
            "Cookie": "secret=1",
            "X-Interlock-Tenant": "acme",
            "Idempotency-Key": "k",
            "X-Custom": "no",
        },
    )
    assert answer.status == 200
    seen = sse_upstream.stats()["last_headers"]
    assert seen["host"] == f"127.0.0.1:{sse_upstream.port}"
    assert seen["mcp-session-id"] == raw.session_id
    assert seen["mcp-protocol-version"] == LEGACY
    for name in ("cookie", "x-interlock-tenant", "idempotency-key", "x-custom"):
        assert name not in seen
    assert seen["accept-encoding"] == "identity"


async def test_get_stream_is_relayed(proxy: RunningProxy, http: aiohttp.ClientSession):
    """The handshake-era GET stream opens through the proxy as an event stream."""
    raw = RawMcp(http, proxy.mcp_url("sse"))
    await raw.initialize()
    headers = raw.headers({"Accept": "text/event-stream"})
    async with http.get(proxy.mcp_url("sse"), headers=headers) as stream:
        assert stream.status == 200
        assert stream.headers["Content-Type"].startswith("text/event-stream")
