"""JSON-RPC batches through the proxy: split for the upstream, every request answered."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from policies.model import EdgeSettings
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    MODERN,
    RawMcp,
    RunningProxy,
    http_upstream,
    running_proxy,
    stdio_upstream,
)
from tests.integration.mcp_servers import RunningUpstream

upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
async def proxy(upstream: RunningUpstream, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    upstreams = {"up": http_upstream("up", upstream.url), "st": stdio_upstream("st")}
    async with running_proxy(upstreams, tmp_path) as running:
        yield running


http = mcp_proxy_harness.http


def _call(request_id: Any, tool: str, **arguments: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }


def _by_id(messages: list[bytes]) -> dict[Any, dict[str, Any]]:
    return {json.loads(m)["id"]: json.loads(m) for m in messages}


BATCH = [
    _call(1, "echo", text="one"),
    {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
    {"jsonrpc": "2.0", "id": "two", "method": "tools/list"},
    {"jsonrpc": "2.0", "id": 3, "method": "ping"},
]


@pytest.mark.parametrize("name", ["up", "st"])
async def test_batch_answers_each_request_as_a_json_array(
    proxy: RunningProxy, http: aiohttp.ClientSession, name: str
):
    """A JSON-only client gets one array with an answer per request (none for the notification)."""
    raw = RawMcp(http, proxy.mcp_url(name))
    await raw.initialize()
    answer = await raw.post(BATCH, {"Accept": "application/json"})
    assert answer.status == 200
    answers = {item["id"]: item for item in answer.json()}
    assert set(answers) == {1, "two", 3}
    assert answers[1]["result"]["content"][0]["text"] == "one"
    assert answers["two"]["result"]["tools"]
    assert answers[3]["result"] == {}


async def test_batch_streams_progress_and_answers_over_sse(
    proxy: RunningProxy, http: aiohttp.ClientSession
):
    """An SSE client gets each element's progress and answer as events on one stream."""
    raw = RawMcp(http, proxy.mcp_url("up"))
    await raw.initialize()
    slow = _call(10, "slow_progress", steps=2)
    slow["params"]["_meta"] = {"progressToken": "p10"}
    answer = await raw.post([slow, _call(11, "echo", text="eleven")])
    assert answer.headers["Content-Type"].startswith("text/event-stream")
    messages = [json.loads(m) for m in answer.messages]
    notes = [m["params"] for m in messages if m.get("method") == "notifications/progress"]
    # The pipeline may add progress of its own ("queued", "running"); the upstream's are steps.
    assert [n["progress"] for n in notes if n.get("message", "").startswith("step")] == [1, 2]
    assert all(n["progressToken"] == "p10" for n in notes)
    answers = {m["id"]: m for m in messages if "id" in m}
    assert answers[10]["result"]["content"][0]["text"] == "done after 2 steps"
    assert answers[11]["result"]["content"][0]["text"] == "eleven"


async def test_batch_mixing_answered_and_refused_elements_answers_each(
    proxy: RunningProxy, http: aiohttp.ClientSession, upstream: RunningUpstream
):
    """An element the upstream refuses (429) and an invalid one get errors; the rest succeed."""
    raw = RawMcp(http, proxy.mcp_url("up"))
    await raw.initialize()
    upstream.control(reject_next=1, status=429, retry_after="3", methods=["tools/list"])
    try:
        answer = await raw.post(
            [
                {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                {"jsonrpc": "2.0", "id": 2, "method": "ping"},
                {"jsonrpc": "2.0", "id": 3, "method": ""},
            ],
            {"Accept": "application/json"},
        )
    finally:
        upstream.control(reject_next=0)
    answers = {item["id"]: item for item in answer.json()}
    assert answers[1]["error"]["code"] == -32050  # refused, with the upstream's own delay
    assert answers[1]["error"]["data"] == {
        "reason": "upstream",
        "scope": "upstream:up",
        "retry_after_s": 3.0,
    }
    assert answers[2]["result"] == {}
    assert answers[3]["error"]["code"] == -32600


async def test_batch_of_notifications_only_is_accepted(
    proxy: RunningProxy, http: aiohttp.ClientSession
):
    """Notifications (and responses) alone get 202 with no body."""
    raw = RawMcp(http, proxy.mcp_url("up"))
    await raw.initialize()
    note = {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"}
    answer = await raw.post([note, note])
    assert (answer.status, answer.body) == (202, b"")


async def test_batches_are_refused_where_the_protocol_has_none(
    proxy: RunningProxy, http: aiohttp.ClientSession, upstream: RunningUpstream
):
    """A 2026-07-28 batch, or initialize inside a batch, is a -32600 and nothing is forwarded."""
    before = upstream.stats()["mcp_requests"]
    raw = RawMcp(http, proxy.mcp_url("up"))
    modern = await raw.post(
        [{"jsonrpc": "2.0", "id": 1, "method": "ping"}], {"MCP-Protocol-Version": MODERN}
    )
    assert (modern.status, modern.json()["error"]["data"]["reason"]) == (400, "batch_not_supported")
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
    batched = await raw.post([init])
    assert batched.json()["error"]["data"]["reason"] == "initialize_in_batch"
    assert upstream.stats()["mcp_requests"] == before


@pytest.mark.parametrize("name", ["up", "st"])
async def test_a_batch_over_max_batch_is_refused_whole_and_nothing_is_sent(
    upstream: RunningUpstream, tmp_path: Path, http: aiohttp.ClientSession, name: str
):
    """One POST of many pings used to become as many concurrent upstream requests (10,000 held
    6,720 connections at once); past `max_batch` (here 8) the batch is a 400 / -32600 and no
    element reaches the upstream. A batch at the limit is served."""
    edge = EdgeSettings(max_batch=8)
    upstreams = {"up": http_upstream("up", upstream.url), "st": stdio_upstream("st")}
    async with running_proxy(upstreams, tmp_path, edge=edge) as proxy:
        raw = RawMcp(http, proxy.mcp_url(name))
        await raw.initialize()
        upstream.reset()
        pings = [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(9)]
        answer = await raw.post(pings, {"Accept": "application/json"})
        assert answer.status == 400
        assert answer.json()["error"]["data"]["reason"] == "batch_too_large"
        if name == "up":
            assert upstream.stats().get("mcp_requests", 0) == 0
        served = await raw.post(pings[:8], {"Accept": "application/json"})
        assert served.status == 200
        assert len(served.json()) == 8


async def test_every_upstream_request_holds_a_slot_of_a_bounded_pool(
    upstream: RunningUpstream, tmp_path: Path, http: aiohttp.ClientSession
):
    """With `max_connections: 2` for the upstream, six concurrent calls never have more than two
    requests at the upstream at once (the pool was unlimited), and all six are answered."""
    upstreams = {"up": http_upstream("up", upstream.url, max_connections=2)}
    async with running_proxy(upstreams, tmp_path) as proxy:
        raw = RawMcp(http, proxy.mcp_url("up"))
        await raw.initialize()
        upstream.reset()
        calls = [_call(i, "hold", seconds=0.3, tag=f"p{i}") for i in range(6)]
        answer = await raw.post(calls, {"Accept": "application/json"})
    assert answer.status == 200
    assert len(answer.json()) == 6
    assert upstream.stats()["max_running"] == 2
