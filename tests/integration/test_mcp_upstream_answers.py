"""What an MCP upstream's answer proves, and what a replay of it may say (real SDK Client →
proxy → real MCPServer, the server behind a gateway that can misbehave)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from ledger import LedgerStore, sqlite_connect
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import RawMcp
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.proxy_harness import running_proxy
from tests.integration.waiting import wait_until
from tests.ledger_fixtures import sqlite_write_lock_in_another_process

KEY = "interlock/idempotency-key"
http = mcp_proxy_harness.http


upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
def fresh(upstream: RunningUpstream) -> RunningUpstream:
    upstream.reset()
    upstream.control(reject_next=0, fail_after=0)
    return upstream


def config(upstream: RunningUpstream, extra: str = "", upstream_extra: str = "") -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 5, deadline_s: 10}}
        upstreams:
          up:
            mcp: "{upstream.url}"
            retry: {{max_attempts: 3, base_delay_s: 0.01}}
            {upstream_extra}
        {extra}
        """


def error_of(exc: MCPError) -> tuple[int, dict[str, Any]]:
    data = exc.error.data if isinstance(exc.error.data, dict) else {}
    return exc.error.code, data


async def test_a_503_after_the_tool_ran_is_unknown_and_never_resent(
    fresh: RunningUpstream, tmp_path: Path
) -> None:
    """A gateway answers 503 after the tool acted: that is no proof of "not executed", so the
    entry is `unknown` (-32053), the proxy does not retry, and a resend is refused -32052."""
    fresh.control(fail_after=1, status=503, methods=["tools/call"])
    args = {"to": "a@example.com", "subject": "transfer"}
    async with (
        running_proxy(config(fresh), tmp_path) as proxy,
        Client(proxy.mcp_url("up"), mode="legacy") as client,
    ):
        with pytest.raises(MCPError) as first:
            await client.call_tool("send_email", args, meta={KEY: "tr-1"})
        await wait_until(lambda: proxy.scheduler.cooldown_remaining("up") == 0)  # Retry-After
        with pytest.raises(MCPError) as again:
            await client.call_tool("send_email", args, meta={KEY: "tr-1"})
        entry, _ = await proxy.store.get("tr-1")
    assert error_of(first.value)[0] == -32053
    code, data = error_of(again.value)
    assert (code, data["state"]) == (-32052, "unknown")
    assert entry.state == "unknown"
    assert fresh.stats()["emails_by_key"] == {"tr-1": 1}


async def test_a_status_the_upstream_declares_not_executed_releases_the_key(
    fresh: RunningUpstream, tmp_path: Path
) -> None:
    """With `not_executed_statuses: [503]` the operator vouches for this upstream's 503: the
    call is released (`rejected`) and refused -32050, and the same key may be sent again."""
    fresh.control(reject_next=1, status=503, retry_after=None, methods=["tools/call"])
    args = {"to": "b@example.com", "subject": "hello"}
    declared = "not_executed_statuses: [503]"
    async with (
        running_proxy(config(fresh, upstream_extra=declared), tmp_path) as proxy,
        Client(proxy.mcp_url("up"), mode="legacy") as client,
    ):
        with pytest.raises(MCPError) as refused:
            await client.call_tool(
                "send_email", args, meta={KEY: "ok-1", "interlock/class": "interactive"}
            )
        entry, _ = await proxy.store.get("ok-1")
    assert error_of(refused.value)[0] == -32050
    assert entry.state == "rejected"
    assert fresh.stats()["emails_total"] == 0


async def test_an_outcome_that_was_not_kept_is_never_replayed_as_a_result(
    fresh: RunningUpstream, tmp_path: Path
) -> None:
    """A result over max_outcome_bytes is kept as a hash only: a repeat of its key is answered
    -32056 outcome_not_retained with the state and entry id, never a result."""
    small = config(fresh).replace("lease_s: 5", "lease_s: 5, max_outcome_bytes: 8")
    async with (
        running_proxy(small, tmp_path) as proxy,
        Client(proxy.mcp_url("up"), mode="legacy") as client,
    ):
        await client.call_tool("charge", {"amount": 5}, meta={KEY: "big-1"})
        with pytest.raises(MCPError) as caught:
            await client.call_tool("charge", {"amount": 5}, meta={KEY: "big-1"})
        entry, _ = await proxy.store.get("big-1")
    code, data = error_of(caught.value)
    assert (code, data["reason"], data["state"]) == (-32056, "outcome_not_retained", "succeeded")
    assert data["entry_id"] == entry.id
    assert fresh.stats()["calls"] == {"charge": 1}


async def test_an_entry_resolved_by_an_operator_is_not_replayed_as_a_result(
    fresh: RunningUpstream, tmp_path: Path
) -> None:
    """An `unknown` entry an operator resolved `succeeded` has no stored result: a resend of its
    key is answered -32056 with state succeeded (the tool is not called again)."""
    rule = """
        tools:
          - {match: "up/hold", timeout_s: 0.3}
        """
    async with (
        running_proxy(config(fresh, rule), tmp_path) as proxy,
        Client(proxy.mcp_url("up"), mode="legacy") as client,
    ):
        with pytest.raises(MCPError):
            await client.call_tool("hold", {"seconds": 1, "tag": "r"}, meta={KEY: "held-1"})
        await proxy.store.resolve("held-1", as_="succeeded", note="it ran", actor="sre")
        with pytest.raises(MCPError) as caught:
            await client.call_tool("hold", {"seconds": 1, "tag": "r"}, meta={KEY: "held-1"})
    code, data = error_of(caught.value)
    assert (code, data["reason"], data["state"]) == (-32056, "outcome_not_retained", "succeeded")
    assert fresh.stats()["started"] == ["r"]


async def test_a_legacy_outcome_replays_to_a_modern_client_in_its_shape(
    fresh: RunningUpstream, tmp_path: Path
) -> None:
    """An outcome stored from a 2025-11-25 session is replayed to a 2026-07-28 SDK Client as a
    valid result of that revision (`resultType` added), marked as a replay."""
    args = {"amount": 12}
    async with running_proxy(config(fresh), tmp_path) as proxy:
        async with Client(proxy.mcp_url("up"), mode="legacy") as legacy:
            first = await legacy.call_tool("charge", args, meta={KEY: "rev-1"})
        async with Client(proxy.mcp_url("up"), mode="2026-07-28") as modern:
            replayed = await modern.call_tool("charge", args, meta={KEY: "rev-1"})
    assert replayed.content == first.content
    assert (replayed.meta or {}).get("interlock/replayed") is True
    assert fresh.stats()["calls"] == {"charge": 1}


async def test_a_modern_outcome_replays_to_a_legacy_client_without_modern_fields(
    fresh: RunningUpstream, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """An outcome stored from a 2026-07-28 call is replayed to a 2025-11-25 session without
    what that revision does not have (`resultType`), through the SDK Client and on the wire."""
    args = {"amount": 13}
    async with running_proxy(config(fresh), tmp_path) as proxy:
        async with Client(proxy.mcp_url("up"), mode="2026-07-28") as modern:
            first = await modern.call_tool("charge", args, meta={KEY: "rev-2"})
        async with Client(proxy.mcp_url("up"), mode="legacy") as legacy:
            replayed = await legacy.call_tool("charge", args, meta={KEY: "rev-2"})
        raw = RawMcp(http, proxy.mcp_url("up"))
        await raw.initialize()
        params = {"name": "charge", "arguments": args, "_meta": {KEY: "rev-2"}}
        answer = await raw.post(
            {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": params}
        )
    assert replayed.content == first.content
    result = answer.last["result"]
    assert result["_meta"]["interlock/replayed"] is True
    assert "resultType" not in result, json.dumps(result)
    assert "io.modelcontextprotocol/serverInfo" not in result["_meta"]
    assert fresh.stats()["calls"] == {"charge": 1}


async def test_a_finish_interrupted_by_shutdown_still_lands(
    fresh: RunningUpstream,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The upstream answered while the ledger could not be written, and the outcome is still
    being retried when shutdown begins (grace 0): the ledger comes back as it starts closing,
    and the finish commits before it closes, so the entry is `succeeded`, not left `running` to
    expire into `unknown`. (Another process holds SQLite's write lock past the busy timeout.)"""
    monkeypatch.setattr(sqlite_connect, "BUSY_TIMEOUT_MS", 200)
    rule = 'tools:\n          - {match: "up/hold", side_effect: true}'
    grace = config(fresh, rule).replace("lease_s: 5}", "lease_s: 5}\n        shutdown_grace_s: 0")
    # The lock outlives the proxy: its holder exits only once released, as the ledger closes.
    async with contextlib.AsyncExitStack() as lock, running_proxy(grace, tmp_path) as proxy:
        client_call = asyncio.create_task(
            call_once(proxy.mcp_url("up"), "hold", {"seconds": 1.0, "tag": "f"}, "fin-1")
        )
        await wait_until(lambda: fresh.stats()["started"] == ["f"])  # claimed and forwarded
        url = proxy.config.ledger.url
        release = await lock.enter_async_context(sqlite_write_lock_in_another_process(url))
        await wait_until(lambda: "outcome not recorded yet" in caplog.text, 10.0)
        real_close = proxy.store.close

        async def close_as_the_ledger_returns() -> None:
            release()  # the finish is still being retried as the ledger starts closing
            await real_close()

        monkeypatch.setattr(proxy.store, "close", close_as_the_ledger_returns)
    client_call.cancel()
    await asyncio.gather(client_call, return_exceptions=True)
    store = await LedgerStore.open(proxy.config.ledger, owner="test")
    try:
        entry, _ = await store.get("fin-1")
    finally:
        await store.close()
    assert entry.state == "succeeded"
    assert fresh.stats()["calls"] == {"hold": 1}


async def call_once(url: str, tool: str, args: dict[str, Any], key: str) -> Any:
    async with Client(url, mode="legacy") as client:
        return await client.call_tool(tool, args, meta={KEY: key})
