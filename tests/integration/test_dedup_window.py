"""Derived keys deduplicate only within their window, end to end (real SDK Client → proxy →
real MCPServer; fake provider for HTTP). Needs the ledger side of `ClaimRequest.dedup_window_s`.

No test sleeps for the window: each polls (bounded) until the repeat runs again, and checks that
it was a replay until then.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.integration import fake_provider, mcp_proxy_harness
from tests.integration.fake_provider import FakeProvider
from tests.integration.http_calls import post
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.proxy_harness import running_proxy

KEY = "interlock/idempotency-key"
REPLAYED = "interlock/replayed"
POLL_S = 10.0

provider = fake_provider.provider


upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
def fresh(upstream: RunningUpstream) -> RunningUpstream:
    upstream.reset()
    return upstream


def config(upstream: RunningUpstream, window_s: float, extra: str = "") -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 5, deadline_s: 10, dedup_window_s: {window_s}}}
        upstreams:
          up:
            mcp: "{upstream.url}"
        {extra}
        """


async def until_it_runs_again(send: Callable[[], Awaitable[Any]], replayed: Callable[[Any], bool]):
    """Repeat `send` until its answer is no replay (bounded); returns (replays seen, answer)."""
    deadline = time.monotonic() + POLL_S
    replays = 0
    while time.monotonic() < deadline:
        answer = await send()
        if not replayed(answer):
            return replays, answer
        replays += 1
        await asyncio.sleep(0.05)
    raise AssertionError(f"still replayed after {POLL_S} s")


def is_replay(result: Any) -> bool:
    return bool((result.meta or {}).get(REPLAYED))


async def test_a_derived_key_repeat_after_the_window_runs_again(
    fresh: RunningUpstream, tmp_path: Path
) -> None:
    """An unannotated `get_current_time` repeated at once is a replay (a retry); repeated after
    `dedup_window_s` it runs again, as a new entry beside the old one."""
    async with (
        running_proxy(config(fresh, 1), tmp_path) as proxy,
        Client(proxy.mcp_url("up"), mode="legacy") as client,
    ):
        first = await client.call_tool("get_current_time")
        replays, later = await until_it_runs_again(
            lambda: client.call_tool("get_current_time"), is_replay
        )
        entries = await proxy.store.list_entries()
    assert first.content[0].text == "tick 1"  # type: ignore[union-attr]
    assert replays >= 1
    assert later.content[0].text == "tick 2"
    assert fresh.stats()["calls"] == {"get_current_time": 2}
    assert [e.state for e in entries] == ["succeeded", "succeeded"]


async def test_a_rules_window_overrides_the_default(fresh: RunningUpstream, tmp_path: Path) -> None:
    """`key: {window_s: N}` on a rule: that tool's repeat runs again after N seconds while
    another tool's derived key still replays under the (long) default window."""
    rule = """
        tools:
          - {match: "up/get_current_time", key: {window_s: 0.5}}
        """
    async with (
        running_proxy(config(fresh, 300, rule), tmp_path) as proxy,
        Client(proxy.mcp_url("up"), mode="legacy") as client,
    ):
        await client.call_tool("charge", {"amount": 3})
        await client.call_tool("get_current_time")
        await until_it_runs_again(lambda: client.call_tool("get_current_time"), is_replay)
        charged_again = await client.call_tool("charge", {"amount": 3})
    assert is_replay(charged_again)
    assert fresh.stats()["calls"] == {"charge": 1, "get_current_time": 2}


async def test_an_explicit_key_outlives_the_window(fresh: RunningUpstream, tmp_path: Path) -> None:
    """An explicit key is kept for retention: after the derived window has passed (a derived
    call ran again), the explicit key still replays its first outcome."""
    async with (
        running_proxy(config(fresh, 0.5), tmp_path) as proxy,
        Client(proxy.mcp_url("up"), mode="legacy") as client,
    ):
        await client.call_tool("charge", {"amount": 9}, meta={KEY: "pay-9"})
        await client.call_tool("get_current_time")
        await until_it_runs_again(lambda: client.call_tool("get_current_time"), is_replay)
        again = await client.call_tool("charge", {"amount": 9}, meta={KEY: "pay-9"})
    assert is_replay(again)
    assert fresh.stats()["calls"] == {"charge": 1, "get_current_time": 2}


async def test_an_unknown_entry_answers_for_its_derived_key_whatever_the_window(
    fresh: RunningUpstream, tmp_path: Path
) -> None:
    """A derived-key call that became `unknown` still refuses its repeat (-32052) after the
    window: the safety rule holds for running, unknown and blocked entries."""
    rule = """
        tools:
          - {match: "up/hold", timeout_s: 0.3}
        """
    async with (
        running_proxy(config(fresh, 0.5, rule), tmp_path) as proxy,
        Client(proxy.mcp_url("up"), mode="legacy") as client,
    ):
        with pytest.raises(MCPError) as timed_out:
            await client.call_tool("hold", {"seconds": 1, "tag": "once"})
        await client.call_tool("get_current_time")
        await until_it_runs_again(lambda: client.call_tool("get_current_time"), is_replay)
        with pytest.raises(MCPError) as refused:
            await client.call_tool("hold", {"seconds": 1, "tag": "once"})
    assert timed_out.value.error.code == -32053
    assert refused.value.error.code == -32052
    assert fresh.stats()["started"] == ["once"]


async def test_an_http_derived_key_repeat_after_the_window_runs_again(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """The same for HTTP: a POST without Idempotency-Key repeated after the window executes
    again (at once it is a replay)."""
    text = f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 5, deadline_s: 10, dedup_window_s: 0.5}}
        upstreams:
          fake: {{http: "{provider.url}"}}
        """
    async with running_proxy(text, tmp_path) as proxy:
        assert (await post(proxy, {"n": 1}))[0] == 201
        replays, (status, _, _) = await until_it_runs_again(
            lambda: post(proxy, {"n": 1}), lambda answer: "Idempotent-Replayed" in answer[1]
        )
    assert (status, replays >= 1) == (201, True)
    assert provider.executions[""] == 2
