"""MCP tasks on the 2026-07-28 line (the `io.modelcontextprotocol/tasks` extension, SEP-2663)
through the proxy, with an upstream that knows nothing of tasks and is saturated: the SDK's own
client (its extension hooks) gets `resultType: "task"` and resolves it by polling `tasks/get`
(result inline) to what a direct call answers; `tasks/cancel` of a task not started means it
never runs; a request that does not declare the extension is never given a task and its `tasks/*`
are -32021."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import aiohttp
import anyio
import httpx2
import mcp_types as t
import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from pydantic import ConfigDict
from pydantic.alias_generators import to_camel

from policies.model import Limits
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    ENVELOPE,
    MODERN,
    RawMcp,
    RunningProxy,
    deferring_proxy,
    http_upstream,
)
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.waiting import wait_until

EXT = "io.modelcontextprotocol/tasks"
BOUNDED_S = 20.0
TENANT = {"X-Interlock-Tenant": "acme", "X-Interlock-Class": "bulk"}
http = mcp_proxy_harness.http


class CreateTaskResult2026(t.Result):
    """The extension's `CreateTaskResult` (SDK 2.3.0 has no 2026 task types)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class GetTaskResult2026(t.Result):
    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskIdParams(t.RequestParams):
    task_id: str


class GetTask2026(t.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"  # the SDK then sends `Mcp-Name: <taskId>`


POLLS: list[str] = []


async def resolve(created: CreateTaskResult2026, ctx: ClaimContext) -> t.CallToolResult:
    """Poll `tasks/get` (honouring `pollIntervalMs`) until the task is done."""
    with anyio.fail_after(BOUNDED_S):
        while True:
            request = GetTask2026(params=TaskIdParams(task_id=created.task_id))
            snapshot = await ctx.session.send_request(request, GetTaskResult2026)
            POLLS.append(snapshot.status)
            if snapshot.status == "completed":
                assert snapshot.result is not None
                return t.CallToolResult.model_validate(snapshot.result)
            assert snapshot.status == "working", snapshot
            await anyio.sleep((snapshot.poll_interval_ms or 1000) / 1000)


class ClientTasks(ClientExtension):
    identifier = EXT

    def claims(self) -> tuple[ResultClaim[Any], ...]:
        return (ResultClaim(result_type="task", model=CreateTaskResult2026, resolve=resolve),)


upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
async def proxy(upstream: RunningUpstream, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    upstream.reset()
    POLLS.clear()
    spec = http_upstream("up", upstream.url, limits=Limits(max_running=1))
    async with deferring_proxy(spec, tmp_path) as running:
        yield running


@contextlib.asynccontextmanager
async def sdk_client(url: str, *, tasks: bool = True) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers=TENANT, timeout=BOUNDED_S) as http_client:
        transport = streamable_http_client(url, http_client=http_client)
        extensions = [ClientTasks()] if tasks else None
        async with Client(transport, mode=MODERN, extensions=extensions) as client:
            yield client


@contextlib.asynccontextmanager
async def busy(upstream: RunningUpstream, proxy: RunningProxy) -> AsyncIterator[None]:
    """The upstream's only slot is taken by a live call for a moment."""

    async def hold() -> None:
        async with Client(proxy.mcp_url("up"), mode="legacy") as client:
            await client.call_tool("hold", {"seconds": 1.5, "tag": "busy"})

    task = asyncio.create_task(hold())
    try:
        await wait_until(lambda: "busy" in upstream.stats()["started"], BOUNDED_S)
        yield
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, BOUNDED_S)


def _plain(result: t.CallToolResult) -> dict[str, Any]:
    data = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    data.pop("_meta", None)
    return data


async def test_the_sdk_client_resolves_a_task_to_what_a_direct_call_answers(
    upstream: RunningUpstream, proxy: RunningProxy
) -> None:
    """A bulk call that cannot start now, from the SDK client with the extension: the proxy
    answers `resultType: "task"`, the client polls `tasks/get` (working while the slot is
    taken, then completed with the result inline) and returns the direct call's result."""
    async with sdk_client(proxy.mcp_url("up")) as client, busy(upstream, proxy):
        result = await client.call_tool("echo", {"text": "modern"})
    assert "working" in POLLS
    assert POLLS[-1] == "completed"
    async with Client(upstream.url, mode=MODERN) as direct:
        expected = await direct.call_tool("echo", {"text": "modern"})
    assert _plain(result) == _plain(expected)
    assert upstream.stats()["calls"]["echo"] == 2


async def test_a_request_without_the_extension_gets_no_task_and_no_tasks_methods(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """Without the extension declared in its `_meta`, a saturated bulk call waits its turn and
    is answered with a plain result, and `tasks/get` is -32021 (missing capability)."""
    async with sdk_client(proxy.mcp_url("up"), tasks=False) as client, busy(upstream, proxy):
        result = await client.call_tool("echo", {"text": "plain"})
    assert _plain(result)["content"][0]["text"] == "plain"
    raw = RawMcp(http, proxy.mcp_url("up"))
    answer = await raw.post(
        _request(1, "tasks/get", {"taskId": "x"}, declared=False), _headers("tasks/get", "x")
    )
    assert answer.last["error"]["code"] == -32021


async def test_cancel_of_a_task_not_started_means_it_never_runs(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """Raw 2026-07-28 JSON-RPC: a saturated bulk `send_email` becomes a task; `tasks/cancel`
    acknowledges (`resultType: "complete"`), `tasks/get` then says cancelled, and once a later
    task has run the upstream's own counter shows the email was never sent. `tasks/result`
    does not exist on this line (-32601)."""
    raw = RawMcp(http, proxy.mcp_url("up"))
    async with busy(upstream, proxy):
        email = {"to": "x@example.com", "subject": "never"}
        created = await raw.post(
            _tools_call(1, "send_email", email), _headers("tools/call", "send_email")
        )
        task = created.last["result"]
        assert task["resultType"] == "task"
        assert task["status"] == "working"
        assert task["pollIntervalMs"] == 100
        later = await raw.post(
            _tools_call(2, "echo", {"text": "later"}), _headers("tools/call", "echo")
        )
        later_id = later.last["result"]["taskId"]
        ack = await raw.post(
            _request(3, "tasks/cancel", {"taskId": task["taskId"]}),
            _headers("tasks/cancel", task["taskId"]),
        )
        assert ack.last["result"] == {"resultType": "complete"}
        missing = await raw.post(
            _request(4, "tasks/result", {"taskId": task["taskId"]}),
            _headers("tasks/result", task["taskId"]),
        )
        assert missing.last["error"]["code"] == -32601
    async with asyncio.timeout(BOUNDED_S):
        while True:
            polled = await raw.post(
                _request(5, "tasks/get", {"taskId": later_id}), _headers("tasks/get", later_id)
            )
            if polled.last["result"]["status"] == "completed":
                break
            await asyncio.sleep(0.05)
    assert polled.last["result"]["result"]["content"][0]["text"] == "later"
    assert polled.last["result"]["resultType"] == "complete"
    cancelled = await raw.post(
        _request(6, "tasks/get", {"taskId": task["taskId"]}), _headers("tasks/get", task["taskId"])
    )
    assert cancelled.last["result"]["status"] == "cancelled"
    assert upstream.stats()["emails_total"] == 0


def _meta(declared: bool = True) -> dict[str, Any]:
    capabilities = {"extensions": {EXT: {}}} if declared else {}
    return {**ENVELOPE, "io.modelcontextprotocol/clientCapabilities": capabilities}


def _request(
    request_id: int, method: str, params: dict[str, Any], *, declared: bool = True
) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": method,
        "params": {**params, "_meta": _meta(declared)},
    }


def _tools_call(request_id: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return _request(request_id, "tools/call", {"name": tool, "arguments": arguments})


def _headers(method: str, name: str) -> dict[str, str]:
    return {"MCP-Protocol-Version": MODERN, "Mcp-Method": method, "Mcp-Name": name, **TENANT}
