"""What makes two MCP tool calls the same call: the key, the operation and the arguments; and
which attribute values a call may carry at all (real SDK Client → proxy → real MCPServer)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import RawMcp
from tests.integration.mcp_servers import RunningUpstream, running_upstream
from tests.integration.proxy_harness import running_proxy

KEY = "interlock/idempotency-key"
http = mcp_proxy_harness.http


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningUpstream]:
    with running_upstream() as running:
        yield running


@pytest.fixture
def fresh(upstream: RunningUpstream) -> RunningUpstream:
    upstream.reset()
    return upstream


def config(upstream: RunningUpstream, extra: str = "") -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 5, deadline_s: 10}}
        upstreams:
          up:
            mcp: "{upstream.url}"
        {extra}
        """


def error_of(exc: MCPError) -> tuple[int, dict[str, Any]]:
    data = exc.error.data if isinstance(exc.error.data, dict) else {}
    return exc.error.code, data


async def test_a_key_reused_for_another_tool_is_a_mismatch_not_a_replay(
    fresh: RunningUpstream, tmp_path: Path
) -> None:
    """`refund` sent with the key and arguments of an earlier `charge` is refused -32602
    idempotency_key_mismatch: never answered "CHARGED", and the refund is not sent either."""
    async with (
        running_proxy(config(fresh), tmp_path) as proxy,
        Client(proxy.mcp_url("up"), mode="legacy") as client,
    ):
        charged = await client.call_tool("charge", {"amount": 500}, meta={KEY: "pay-7"})
        with pytest.raises(MCPError) as caught:
            await client.call_tool("refund", {"amount": 500}, meta={KEY: "pay-7"})
    assert charged.content[0].text == "CHARGED 500"  # type: ignore[union-attr]
    code, data = error_of(caught.value)
    assert (code, data["reason"]) == (-32602, "idempotency_key_mismatch")
    assert fresh.stats()["calls"] == {"charge": 1}


async def test_absent_arguments_are_not_the_same_call_as_empty_ones(
    fresh: RunningUpstream, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A key first sent without `arguments` and then with `arguments: {}` is a mismatch."""
    async with running_proxy(config(fresh), tmp_path) as proxy:
        raw = RawMcp(http, proxy.mcp_url("up"))
        await raw.initialize()
        params: dict[str, Any] = {"name": "get_current_time", "_meta": {KEY: "time-1"}}
        first = await raw.post(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        )
        assert first.last["result"]["content"][0]["text"] == "tick 1"
        params = {**params, "arguments": {}}
        second = await raw.post(
            {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
        )
    assert second.last["error"]["code"] == -32602
    assert second.last["error"]["data"]["reason"] == "idempotency_key_mismatch"
    assert fresh.stats()["calls"] == {"get_current_time": 1}
