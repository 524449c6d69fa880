"""stdio upstreams behave like an MCP server over HTTP would (issue 12, items 4, 5 and 6).

- a client's `notifications/cancelled` reaches the process and the cancelled call is never sent
  again (item 4);
- a GET stream the client drops is noticed at once, so reconnecting is not refused 409 (item 5);
- `upstreams.<name>.session_idle_s` sets how long an idle session's process lives (item 6).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiohttp

from policies.config import parse_config_text
from proxy.state import CONFIG
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import RawMcp, running_proxy, stdio_upstream
from tests.integration.waiting import wait_until

http = mcp_proxy_harness.http


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _call(request_id: int, tool: str, **arguments: Any) -> dict[str, Any]:
    params = {"name": tool, "arguments": arguments}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


async def _counters(raw: RawMcp, request_id: int) -> dict[str, Any]:
    answer = await raw.post(_call(request_id, "count"))
    counters: dict[str, Any] = answer.last["result"]["structuredContent"]
    return counters


async def test_a_cancelled_stdio_call_is_forwarded_and_never_sent_again(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """The process sees the cancellation, the call ran once, the client's POST ends (-32800)."""
    async with running_proxy({"st": stdio_upstream("st", timeout_s=10)}, tmp_path) as proxy:
        raw = RawMcp(http, proxy.mcp_url("st"))
        await raw.initialize()
        held = asyncio.create_task(raw.post(_call(7, "hold", seconds=3, tag="to-cancel")))

        async def started() -> bool:
            return "to-cancel" in (await _counters(raw, 100))["started"]

        for _ in range(500):
            if await started():
                break
            await asyncio.sleep(0.02)
        cancel = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": 7, "reason": "user pressed stop"},
        }
        assert (await raw.post(cancel)).status == 202
        async with asyncio.timeout(10):
            answer = await held
        counters = await _counters(raw, 101)
    assert answer.last["error"]["code"] == -32800
    assert counters["started"] == ["to-cancel"]
    assert counters["cancelled"] == ["to-cancel"]


async def test_a_dropped_get_stream_is_noticed_at_once(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """After the client drops its GET stream, a new GET is accepted (not 409 until a keep-alive)."""
    async with running_proxy({"st": stdio_upstream("st")}, tmp_path) as proxy:
        raw = RawMcp(http, proxy.mcp_url("st"))
        await raw.initialize()
        spec = proxy.app[CONFIG].upstreams["st"]
        process = proxy.transport.stdio.session(spec, raw.session_id or "")
        assert process is not None
        headers = raw.headers({"Accept": "text/event-stream"})
        async with http.get(raw.url, headers=headers) as first:
            assert first.status == 200
            await wait_until(lambda: process.get_stream_open)
            first.close()
        await wait_until(lambda: not process.get_stream_open, timeout_s=5)
        async with http.get(raw.url, headers=headers) as second:
            assert second.status == 200


def test_session_idle_s_is_a_configuration_key(tmp_path: Path) -> None:
    """`upstreams.<name>.session_idle_s` is read from the file (default 300 s)."""
    text = """
upstreams:
  quick: {command: ["true"], session_idle_s: 0.5}
  default: {command: ["true"]}
"""
    config = parse_config_text(text, str(tmp_path / "interlock.yaml"), environ={})
    assert config.upstreams["quick"].session_idle_s == 0.5
    assert config.upstreams["default"].session_idle_s == 300


async def test_an_idle_session_ends_after_its_upstreams_session_idle_s(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A session process with nothing in flight ends after `session_idle_s`; the session is 404."""
    upstreams = {"st": stdio_upstream("st", session_idle_s=0.3)}
    async with running_proxy(upstreams, tmp_path) as proxy:
        raw = RawMcp(http, proxy.mcp_url("st"))
        await raw.initialize()
        (process,) = proxy.transport.stdio.processes()
        pid = process.pid
        assert pid is not None
        await wait_until(lambda: not _alive(pid))
        gone = await raw.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert gone.status == 404
    assert json.loads(gone.body)["error"]["data"]["reason"] == "session_not_found"
