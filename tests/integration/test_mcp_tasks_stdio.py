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


async def test_a_modern_task_runs_over_the_shared_process(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """2026-07-28: a bulk call declaring the extension, while paused, is a task; once resumed,
    `tasks/get` shows it completed with the result inline."""
    raw = RawMcp(http, proxy.mcp_url("st"))
    meta = {
        **ENVELOPE,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}},
        "interlock/class": "bulk",
    }
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "echo"}
    proxy.app[SCHEDULER].pause("upstream:st")
    call = {"name": "echo", "arguments": {"text": "shared"}, "_meta": meta}
    created = await raw.post(_request(1, "tools/call", call), headers)
    task_id = created.last["result"]["taskId"]
    proxy.app[SCHEDULER].resume("upstream:st")
    get_headers = {**headers, "Mcp-Method": "tasks/get", "Mcp-Name": task_id}
    async with asyncio.timeout(BOUNDED_S):
        while True:
            polled = await raw.post(
                _request(2, "tasks/get", {"taskId": task_id, "_meta": meta}), get_headers
            )
            if polled.last["result"]["status"] != "working":
                break
            await asyncio.sleep(0.05)
    assert polled.last["result"]["status"] == "completed"
    assert polled.last["result"]["result"]["content"] == [{"type": "text", "text": "shared"}]


async def test_a_task_tried_while_its_upstream_was_paused_runs_soon_after_the_resume(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """The dispatcher meets the pause first and is refused (a paused caller is told to come back
    in 30 s); the resume lets the task start at the dispatcher's next look, not half a minute
    later."""
    raw = RawMcp(http, proxy.mcp_url("st"))
    meta = {
        **ENVELOPE,
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}},
        "interlock/class": "bulk",
    }
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "echo"}
    proxy.app[SCHEDULER].pause("upstream:st")
    call = {"name": "echo", "arguments": {"text": "after the pause"}, "_meta": meta}
    created = await raw.post(_request(1, "tools/call", call), headers)
    task_id = created.last["result"]["taskId"]
    await asyncio.sleep(0.5)  # the dispatcher, woken by the new task, tries it: paused
    proxy.app[SCHEDULER].resume("upstream:st")
    get_headers = {**headers, "Mcp-Method": "tasks/get", "Mcp-Name": task_id}
    async with asyncio.timeout(BOUNDED_S):  # well under the pause's 30 s
        while True:
            polled = await raw.post(
                _request(2, "tasks/get", {"taskId": task_id, "_meta": meta}), get_headers
            )
            if polled.last["result"]["status"] != "working":
                break
            await asyncio.sleep(0.05)
    assert polled.last["result"]["status"] == "completed"
