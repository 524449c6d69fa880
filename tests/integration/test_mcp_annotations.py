"""The proxy learns tool annotations by itself, over HTTP and stdio alike: a tool it was never
shown in a `tools/list` is still classified by its `readOnlyHint` (real stdio MCPServer). A call
waits for that listing only within its own deadline; the listing goes on without it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from policies.model import LedgerSettings
from proxy.mcp.catalog import CATALOG, tool_annotations
from proxy.state import LEDGER
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    RawMcp,
    RunningProxy,
    http_upstream,
    running_proxy,
    stdio_upstream,
)
from tests.integration.mcp_servers import RunningUpstream, running_upstream
from tests.integration.sentinel import Sentinel

http = mcp_proxy_harness.http

DOWN = LedgerSettings(url="postgresql+asyncpg://postgres@127.0.0.1:9/none")


@contextlib.asynccontextmanager
async def _slow_to_list(
    list_delay_s: float, folder: Path, http: aiohttp.ClientSession
) -> AsyncIterator[tuple[RunningProxy, RawMcp, RunningUpstream]]:
    """A proxy (side effects allowed) before a real HTTP upstream that holds every `tools/list`
    for `list_delay_s`, an initialized client session on it, and the upstream."""
    with running_upstream() as upstream:
        upstream.control(list_delay_s=list_delay_s, methods=[])
        upstreams = {"up": http_upstream("up", upstream.url)}
        async with running_proxy(upstreams, folder, read_only=False) as proxy:
            raw = RawMcp(http, proxy.mcp_url("up"))
            await raw.initialize()
            yield proxy, raw, upstream


async def _call(
    raw: RawMcp, number: int, tool: str, arguments: dict[str, Any], deadline_ms: int | None = None
) -> dict[str, Any]:
    """The answer to one `tools/call` (with `deadline_ms` as the call's own deadline)."""
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    if deadline_ms is not None:
        params["_meta"] = {"interlock/deadline-ms": deadline_ms}
    answer = await raw.post(
        {"jsonrpc": "2.0", "id": number, "method": "tools/call", "params": params}
    )
    return answer.last


async def test_a_stdio_tool_never_listed_is_classified_by_its_annotations(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """With the ledger down, a read-only stdio tool the client never listed still runs (the
    proxy listed it itself), while an unannotated one is refused -32054 (fail closed)."""
    upstreams = {"st": stdio_upstream("st", timeout_s=10)}
    async with running_proxy(upstreams, tmp_path, read_only=False, ledger=DOWN) as proxy:
        raw = RawMcp(http, proxy.mcp_url("st"))
        await raw.initialize()
        read = await _call(raw, 1, "search_docs", {"query": "q"})
        send = await _call(raw, 2, "charge", {"amount": 1})
        assert tool_annotations(proxy.app, "st", "search_docs") == {"readOnlyHint": True}
    assert read["result"]["content"][0]["text"] == "3 results for 'q'"
    assert send["error"]["code"] == -32054


async def test_listing_tools_ignores_proxy_settings_in_the_environment(
    tmp_path: Path, http: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy's own tools/list carries the upstream's injected credentials: an HTTP_PROXY in
    the environment must not receive it (only configured upstreams are ever contacted)."""
    sentinel = Sentinel().start()
    try:
        with running_upstream() as upstream:  # started first: its health check uses urllib
            for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
                monkeypatch.setenv(name, sentinel.url)
            monkeypatch.delenv("NO_PROXY", raising=False)
            monkeypatch.delenv("no_proxy", raising=False)
            upstreams = {"up": http_upstream("up", upstream.url, headers={"X-Key": "secret"})}
            async with running_proxy(upstreams, tmp_path, read_only=False, ledger=DOWN) as proxy:
                raw = RawMcp(http, proxy.mcp_url("up"))
                await raw.initialize()
                await _call(raw, 1, "search_docs", {"query": "q"})
                assert tool_annotations(proxy.app, "up", "search_docs") == {"readOnlyHint": True}
    finally:
        sentinel.stop()
    assert sentinel.connections == 0


async def test_a_call_waits_for_the_listing_only_within_its_own_deadline(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """An upstream slow to list its tools (2 s, within the listing's own 3 s) and a call with a
    1 s deadline to a tool never listed: the call waits for the listing at most half its
    deadline, then runs classified by the default (side-effecting: it is ledgered) and is
    answered while the listing still runs; the listing is not abandoned with it, and the next
    call finds the tool read-only."""
    async with _slow_to_list(2.0, tmp_path, http) as (proxy, raw, _):
        async with asyncio.timeout(10):
            first = await _call(raw, 1, "search_docs", {"query": "q"}, deadline_ms=1000)
        unknown_when_answered = tool_annotations(proxy.app, "up", "search_docs")
        listing = proxy.app[CATALOG].listings.get("up")
        assert listing is not None  # still running once the call was answered
        await asyncio.wait_for(asyncio.shield(listing), 10)
        learned = tool_annotations(proxy.app, "up", "search_docs")
        second = await _call(raw, 2, "search_docs", {"query": "q"})
        store = proxy.app[LEDGER].store
        assert store is not None
        ledgered = [e.tool for e in await store.list_entries()]
    assert first["result"]["content"][0]["text"] == "3 results for 'q'"
    assert unknown_when_answered is None
    assert learned == {"readOnlyHint": True}
    assert second["result"]["content"][0]["text"] == "3 results for 'q'"
    assert ledgered == ["search_docs"]  # the first call only: the second was known read-only


async def test_the_time_spent_waiting_for_the_listing_counts_against_the_deadline(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A call's deadline covers the whole call, learning its tool included. The listing never
    ends (the upstream holds it past the listing's own timeout) and the call has 1 s: it waits
    half of that for the listing, so a tool that takes 0.8 s no longer fits in what is left,
    and the call ends as a call whose deadline ran out mid-flight (-32053, `unknown`: the tool
    was classified side-effecting by default), not as one that had its whole second after the
    listing gave up."""
    async with _slow_to_list(60.0, tmp_path, http) as (_, raw, upstream):
        answer = await _call(raw, 1, "hold", {"seconds": 0.8}, deadline_ms=1000)
        await asyncio.sleep(1.0)  # a blind retry would have reached the upstream by now
        held = upstream.stats()["calls"]["hold"]
    assert answer["error"]["code"] == -32053, answer
    assert answer["error"]["data"]["state"] == "unknown"
    assert held == 1  # sent once: an unknown outcome is never retried by the proxy
