"""What makes two MCP tool calls the same call: the key, the operation and the arguments; and
which attribute values a call may carry at all (real SDK Client → proxy → real MCPServer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from ledger import ClaimRequest
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import RawMcp
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.proxy_harness import running_proxy

KEY = "interlock/idempotency-key"
http = mcp_proxy_harness.http


upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
def fresh(upstream: RunningUpstream) -> RunningUpstream:
    upstream.reset()
    return upstream


def config(upstream: RunningUpstream, extra: str = "", defaults: str = "") -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 5, deadline_s: 10, {defaults}}}
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


async def test_an_idempotent_tool_repeated_runs_again_and_is_recorded_each_time(
    fresh: RunningUpstream, tmp_path: Path
) -> None:
    """`idempotentHint: true` makes the default key `none`: a deliberate repeat runs again
    instead of replaying the first answer, and each call is still a ledger entry."""
    async with running_proxy(config(fresh), tmp_path) as proxy:
        async with Client(proxy.mcp_url("up"), mode="legacy") as client:
            await client.list_tools()
            for _ in range(2):
                result = await client.call_tool("set_flag", {"value": "on"})
                assert not (result.meta or {}).get("interlock/replayed")
        entries = await proxy.store.list_entries()
    assert fresh.stats()["calls"] == {"set_flag": 2}
    assert [(e.tool, e.key_source, e.state) for e in entries] == [
        ("set_flag", "none", "succeeded")
    ] * 2


async def test_derived_keys_carry_the_dedup_window_and_explicit_keys_do_not(
    fresh: RunningUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger is told how long each key dedupes: a derived key for `dedup_window_s` (or
    the rule's `window_s`), an explicit key for the whole retention (None)."""
    extra = """
        tools:
          - {match: "up/charge", key: {window_s: 7}}
        """
    async with running_proxy(config(fresh, extra, "dedup_window_s: 42"), tmp_path) as proxy:
        claims: list[ClaimRequest] = []
        real_claim = proxy.store.claim

        async def recording_claim(request: ClaimRequest) -> Any:
            claims.append(request)
            return await real_claim(request)

        monkeypatch.setattr(proxy.store, "claim", recording_claim)
        async with Client(proxy.mcp_url("up"), mode="legacy") as client:
            await client.call_tool("send_email", {"to": "a", "subject": "s"})
            await client.call_tool("charge", {"amount": 1})
            await client.call_tool("send_email", {"to": "a", "subject": "s"}, meta={KEY: "k"})
    assert [(c.key_source, c.dedup_window_s) for c in claims] == [
        ("derived", 42.0),
        ("derived", 7.0),
        ("explicit", None),
    ]
