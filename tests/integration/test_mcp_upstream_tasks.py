"""An upstream that runs MCP tasks itself (2026-07-28 extension): its task handle is relayed to
the caller unchanged and the ledger entry records it as the upstream's task; the caller's
`tasks/get` for it reaches the upstream, and another tenant's does not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from ledger import EntryState
from proxy.state import LEDGER
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    ENVELOPE,
    MODERN,
    RawMcp,
    http_upstream,
    running_proxy,
    serving_mcp,
)

EXT = "io.modelcontextprotocol/tasks"
http = mcp_proxy_harness.http
TASK = {
    "taskId": "up-task-1",
    "status": "working",
    "createdAt": "2026-08-01T10:00:00Z",
    "lastUpdatedAt": "2026-08-01T10:00:00Z",
    "ttlMs": 60000,
    "pollIntervalMs": 50,
}


@pytest.fixture
async def tasking_upstream() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A minimal stateless MCP endpoint whose `build` tool runs as a task of its own."""
    received: list[dict[str, Any]] = []

    async def mcp(request: web.Request) -> web.Response:
        body = await request.json()
        received.append(body)
        method = body.get("method")
        if method == "tools/list":
            tool = {"name": "build", "inputSchema": {"type": "object"}}
            tool["execution"] = {"taskSupport": "optional"}
            result: dict[str, Any] = {"resultType": "complete", "tools": [tool]}
        elif method == "tools/call":
            result = {"resultType": "task", **TASK}
        elif method == "tasks/get":
            done = {"resultType": "complete", "content": [{"type": "text", "text": "built"}]}
            result = {"resultType": "complete", **TASK, "status": "completed", "result": done}
        else:
            error = {"code": -32601, "message": "method not found"}
            return web.json_response({"jsonrpc": "2.0", "id": body.get("id"), "error": error})
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result})

    async with serving_mcp(mcp) as url:
        yield url, received


def _body(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    meta = {**ENVELOPE, "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXT: {}}}}
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {**params, "_meta": meta},
    }


def _headers(method: str, name: str, tenant: str) -> dict[str, str]:
    return {
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
        "Mcp-Name": name,
        "X-Interlock-Tenant": tenant,
    }


async def test_the_upstreams_own_task_is_relayed_recorded_and_polled_by_its_tenant_only(
    tasking_upstream: tuple[str, list[dict[str, Any]]],
    tmp_path: Path,
    http: aiohttp.ClientSession,
) -> None:
    """The upstream answers `tools/call` with a task: the caller gets exactly that handle, the
    entry is `succeeded` holding the upstream's task id; `tasks/get` of it by the same tenant
    is forwarded and answered by the upstream, by another tenant refused -32602 without
    reaching the upstream."""
    url, received = tasking_upstream
    async with running_proxy({"up": http_upstream("up", url)}, tmp_path, read_only=False) as proxy:
        raw = RawMcp(http, proxy.mcp_url("up"))
        call = _body(1, "tools/call", {"name": "build", "arguments": {}})
        created = await raw.post(call, _headers("tools/call", "build", "acme"))
        assert created.last["result"] == {"resultType": "task", **TASK}
        store = proxy.app[LEDGER].store
        assert store is not None
        (entry,) = await store.list_entries()
        assert entry.state is EntryState.SUCCEEDED
        assert entry.task_id == "up:up:up-task-1"
        polled = await raw.post(
            _body(2, "tasks/get", {"taskId": "up-task-1"}),
            _headers("tasks/get", "up-task-1", "acme"),
        )
        assert polled.last["result"]["status"] == "completed"
        assert polled.last["result"]["result"]["content"][0]["text"] == "built"
        seen = len(received)
        stranger = await raw.post(
            _body(3, "tasks/get", {"taskId": "up-task-1"}),
            _headers("tasks/get", "up-task-1", "globex"),
        )
        assert stranger.last["error"]["code"] == -32602
        assert len(received) == seen


async def test_a_read_only_calls_upstream_task_is_recorded_and_polled_by_its_tenant_only(
    tasking_upstream: tuple[str, list[dict[str, Any]]],
    tmp_path: Path,
    http: aiohttp.ClientSession,
) -> None:
    """A read-only call answered with the upstream's own task is recorded too (a `succeeded`
    entry naming the upstream's task, without a key), so only its tenant reaches the upstream
    with `tasks/*` for it: another tenant is refused -32602 and the upstream never sees it."""
    url, received = tasking_upstream
    async with running_proxy({"up": http_upstream("up", url)}, tmp_path, read_only=True) as proxy:
        raw = RawMcp(http, proxy.mcp_url("up"))
        call = _body(1, "tools/call", {"name": "build", "arguments": {}})
        created = await raw.post(call, _headers("tools/call", "build", "acme"))
        assert created.last["result"] == {"resultType": "task", **TASK}
        store = proxy.app[LEDGER].store
        assert store is not None
        (entry,) = await store.list_entries()
        assert (entry.state, entry.task_id, entry.tenant) == (
            EntryState.SUCCEEDED,
            "up:up:up-task-1",
            "acme",
        )
        seen = len(received)
        stranger = await raw.post(
            _body(2, "tasks/get", {"taskId": "up-task-1"}),
            _headers("tasks/get", "up-task-1", "globex"),
        )
        assert stranger.last["error"]["code"] == -32602
        assert len(received) == seen
        polled = await raw.post(
            _body(3, "tasks/get", {"taskId": "up-task-1"}),
            _headers("tasks/get", "up-task-1", "acme"),
        )
        assert polled.last["result"]["status"] == "completed"
