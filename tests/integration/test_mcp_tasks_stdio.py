"""MCP tasks with a stdio upstream (a process the proxy spawns): a deferred call runs over a
process of the proxy's own (handshake era) or the shared one (2026-07-28), once the upstream's
pause is lifted."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.state import SCHEDULER
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    ENVELOPE,
    LEGACY,
    MODERN,
    RawMcp,
    RunningProxy,
    deferring_proxy,
    stdio_upstream,
)

EXT = "io.modelcontextprotocol/tasks"
BOUNDED_S = 20.0
http = mcp_proxy_harness.http


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[RunningProxy]:
    async with deferring_proxy(stdio_upstream("st", timeout_s=10), tmp_path) as running:
        yield running


def _request(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


async def test_a_handshake_era_task_runs_over_a_process_of_the_proxys_own(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """With the upstream paused, a task-augmented `echo` is a task; once resumed, `tasks/result`
    gives the tool's answer (run by a stdio process the proxy started for deferred calls)."""
    raw = RawMcp(http, proxy.mcp_url("st"))
    init = {
        "protocolVersion": LEGACY,
        "capabilities": {"tasks": {"list": {}, "cancel": {}}},
        "clientInfo": {"name": "raw", "version": "1"},
    }
    answer = await raw.post(_request(0, "initialize", init))
    raw.session_id, raw.version = answer.headers["Mcp-Session-Id"], LEGACY
    assert (await raw.post({"jsonrpc": "2.0", "method": "notifications/initialized"})).status == 202
    proxy.app[SCHEDULER].pause("upstream:st")
    call = {"name": "echo", "arguments": {"text": "from stdio"}, "task": {"ttl": 60000}}
    created = await raw.post(_request(1, "tools/call", call))
    task_id = created.last["result"]["task"]["taskId"]
    proxy.app[SCHEDULER].resume("upstream:st")
    async with asyncio.timeout(BOUNDED_S):
        result = await raw.post(_request(2, "tasks/result", {"taskId": task_id}))
    content = result.last["result"]["content"]
    assert content == [{"type": "text", "text": "from stdio"}]


_TASKS_META = {
    **ENVELOPE,
    "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}},
    "interlock/class": "bulk",
}
_TASKS_HEADERS = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "echo"}


async def _a_task_while_paused(
    proxy: RunningProxy, http: aiohttp.ClientSession, text: str, *, wait_s: float = 0.0
) -> dict[str, Any]:
    """A bulk `echo` declaring the 2026-07-28 extension while its upstream is paused (a task);
    `wait_s` later the upstream is resumed; `tasks/get` is then polled until the task is no
    longer working (within `BOUNDED_S`): its last result."""
    raw = RawMcp(http, proxy.mcp_url("st"))
    proxy.app[SCHEDULER].pause("upstream:st")
    call = {"name": "echo", "arguments": {"text": text}, "_meta": _TASKS_META}
    created = await raw.post(_request(1, "tools/call", call), _TASKS_HEADERS)
    task_id = created.last["result"]["taskId"]
    await asyncio.sleep(wait_s)
    proxy.app[SCHEDULER].resume("upstream:st")
    get_headers = {**_TASKS_HEADERS, "Mcp-Method": "tasks/get", "Mcp-Name": task_id}
    poll = _request(2, "tasks/get", {"taskId": task_id, "_meta": _TASKS_META})
    async with asyncio.timeout(BOUNDED_S):
        while True:
            result: dict[str, Any] = (await raw.post(poll, get_headers)).last["result"]
            if result["status"] != "working":
                return result
            await asyncio.sleep(0.05)


async def test_a_modern_task_runs_over_the_shared_process(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """2026-07-28: a bulk call declaring the extension, while paused, is a task; once resumed,
    `tasks/get` shows it completed with the result inline."""
    result = await _a_task_while_paused(proxy, http, "shared")
    assert result["status"] == "completed"
    assert result["result"]["content"] == [{"type": "text", "text": "shared"}]


async def test_a_task_tried_while_its_upstream_was_paused_runs_soon_after_the_resume(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """The dispatcher meets the pause first and is refused (a paused caller is told to come back
    in 30 s); the resume lets the task start at the dispatcher's next look, not half a minute
    later (`BOUNDED_S` is well under that)."""
    # Half a second paused: the dispatcher, woken by the new task, tries it and is refused.
    result = await _a_task_while_paused(proxy, http, "after the pause", wait_s=0.5)
    assert result["status"] == "completed"
