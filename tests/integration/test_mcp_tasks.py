"""MCP tasks (2025-11-25 core) through the proxy, with an upstream that knows nothing of tasks and
is saturated: a task handle at once, the result later (what a direct call answers), cancel before
start means never run (the upstream's own count), only the creating tenant sees a task, and the
band policy defers bulk calls only when they cannot start now."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
import mcp_types as t
import pytest
from mcp import Client
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from policies.model import DeferredSettings, Limits
from proxy.state import LEDGER
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    LEGACY,
    RawMcp,
    RunningProxy,
    deferring_proxy,
    http_upstream,
    running_proxy,
)
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.waiting import wait_until

BOUNDED_S = 20.0
_IDS = itertools.count(100)
KEY = "interlock/idempotency-key"
http = mcp_proxy_harness.http


upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
async def proxy(upstream: RunningUpstream, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    upstream.reset()
    spec = http_upstream("up", upstream.url, limits=Limits(max_running=1))
    async with deferring_proxy(spec, tmp_path) as running:
        yield running


class TaskSession(ClientSession):
    """The SDK's client session, declaring the 2025-11-25 `tasks` capability (2.3.0 has the
    types but no switch for it)."""

    def _build_capabilities(self, version: str) -> t.ClientCapabilities:
        capabilities = super()._build_capabilities(version)
        tasks = t.ClientTasksCapability(
            list=t.TasksListCapability(), cancel=t.TasksCancelCapability()
        )
        return capabilities.model_copy(update={"tasks": tasks})


@contextlib.asynccontextmanager
async def task_session(url: str, tenant: str = "acme") -> AsyncIterator[ClientSession]:
    headers = {"X-Interlock-Tenant": tenant}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=BOUNDED_S) as http_client,
        streamable_http_client(url, http_client=http_client) as (read, write),
        TaskSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@contextlib.asynccontextmanager
async def busy(
    upstream: RunningUpstream, proxy: RunningProxy, seconds: float = 1.5
) -> AsyncIterator[None]:
    """The upstream's only slot is taken by a live call for `seconds`."""

    async def hold() -> None:
        async with Client(proxy.mcp_url("up"), mode="legacy") as client:
            await client.call_tool("hold", {"seconds": seconds, "tag": "busy"})

    task = asyncio.create_task(hold())
    try:
        await wait_until(lambda: "busy" in upstream.stats()["started"], BOUNDED_S)
        yield
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, BOUNDED_S)


async def _create(raw: RawMcp, tool: str, arguments: dict[str, Any]) -> t.CreateTaskResult:
    """A task-augmented `tools/call`, as raw JSON-RPC: the SDK (2.3.0) validates every
    `tools/call` answer as a `CallToolResult`, so it cannot receive a `CreateTaskResult`."""
    answer = await raw.post(_call(next(_IDS), tool, arguments, task=True))
    return t.CreateTaskResult.model_validate(answer.last["result"])


async def _get(session: ClientSession, task_id: str) -> t.GetTaskResult:
    request = t.GetTaskRequest(params=t.GetTaskRequestParams(task_id=task_id))
    return await session.send_request(request, t.GetTaskResult)


async def _result(session: ClientSession, task_id: str) -> t.CallToolResult:
    request = t.GetTaskPayloadRequest(params=t.GetTaskPayloadRequestParams(task_id=task_id))
    async with asyncio.timeout(BOUNDED_S):
        return await session.send_request(request, t.CallToolResult)


def _plain(result: t.CallToolResult) -> dict[str, Any]:
    data = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    data.pop("_meta", None)
    return data


async def test_a_saturated_upstream_gives_a_task_at_once_and_its_result_later(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """The SDK's client asks for a task while the upstream's only slot is taken: it gets a
    `working` task at once (the upstream has not seen the call), `tasks/get` says so, and
    `tasks/result` answers, once the slot frees, what a direct call to the upstream answers,
    marked with the related task."""
    raw = await _raw_with_tasks(http, proxy)
    async with task_session(proxy.mcp_url("up")) as session:
        async with busy(upstream, proxy):
            created = await _create(raw, "echo", {"text": "later"})
            assert created.task.status == "working"
            assert created.task.poll_interval == 100
            assert upstream.stats()["calls"].get("echo", 0) == 0
            polled = await _get(session, created.task.task_id)
            assert polled.status == "working"
            result = await _result(session, created.task.task_id)
        assert result.meta is not None
        assert result.meta["io.modelcontextprotocol/related-task"] == {
            "taskId": created.task.task_id
        }
        done = await _get(session, created.task.task_id)
        assert done.status == "completed"
    async with Client(upstream.url, mode="legacy") as direct:
        expected = await direct.call_tool("echo", {"text": "later"})
    assert _plain(result) == _plain(expected)
    assert upstream.stats()["calls"]["echo"] == 2  # the task's run, and the direct call


async def test_the_task_result_is_the_bytes_a_direct_call_answers(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """Raw JSON-RPC: the `tasks/result` result object is exactly the direct call's result
    object (every field, every value), plus the related-task `_meta`."""
    raw = RawMcp(http, proxy.mcp_url("up"))
    await _initialize_with_tasks(raw)
    arguments = {"text": "exactly this"}
    async with busy(upstream, proxy):
        created = await raw.post(_call(1, "echo", arguments, task=True))
        task_id = created.last["result"]["task"]["taskId"]
        answered = await raw.post(_request(2, "tasks/result", {"taskId": task_id}))
    result = answered.last["result"]
    assert result.pop("_meta") == {"io.modelcontextprotocol/related-task": {"taskId": task_id}}
    direct = RawMcp(http, upstream.url)
    await direct.initialize()
    expected = (await direct.post(_call(1, "echo", arguments))).last["result"]
    assert json.dumps(result, sort_keys=True) == json.dumps(expected, sort_keys=True)


async def test_a_cancelled_task_that_had_not_started_never_runs(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """`tasks/cancel` of a waiting task answers it `cancelled`; a task created after it runs
    and finishes once the slot frees, and the upstream's own counter shows the cancelled email
    was never sent. Cancelling again (now terminal) is -32602."""
    raw = await _raw_with_tasks(http, proxy)
    async with task_session(proxy.mcp_url("up")) as session:
        async with busy(upstream, proxy):
            doomed = await _create(raw, "send_email", {"to": "x@example.com", "subject": "no"})
            after = await _create(raw, "echo", {"text": "after"})
            request = t.CancelTaskRequest(
                params=t.CancelTaskRequestParams(task_id=doomed.task.task_id)
            )
            cancelled = await session.send_request(request, t.CancelTaskResult)
            assert cancelled.status == "cancelled"
        await _result(session, after.task.task_id)
        assert (await _get(session, doomed.task.task_id)).status == "cancelled"
        with pytest.raises(Exception) as again:
            await session.send_request(request, t.CancelTaskResult)
        assert getattr(getattr(again.value, "error", None), "code", None) == -32602
    stats = upstream.stats()
    assert stats["emails_total"] == 0
    assert stats["calls"]["echo"] == 1


async def test_only_the_tenant_that_created_a_task_can_read_list_or_cancel_it(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """Another tenant's `tasks/get`, `tasks/result` and `tasks/cancel` of the task are -32602
    (not found) and its `tasks/list` is empty; the owner lists it and gets its result."""
    async with (
        task_session(proxy.mcp_url("up"), "acme") as owner,
        task_session(proxy.mcp_url("up"), "globex") as other,
    ):
        raw = await _raw_with_tasks(http, proxy)
        async with busy(upstream, proxy):
            created = await _create(raw, "echo", {"text": "mine"})
            task_id = created.task.task_id
            for request, result_type in (
                (t.GetTaskRequest(params=t.GetTaskRequestParams(task_id=task_id)), t.GetTaskResult),
                (
                    t.CancelTaskRequest(params=t.CancelTaskRequestParams(task_id=task_id)),
                    t.CancelTaskResult,
                ),
                (
                    t.GetTaskPayloadRequest(params=t.GetTaskPayloadRequestParams(task_id=task_id)),
                    t.CallToolResult,
                ),
            ):
                with pytest.raises(Exception) as refused:
                    await other.send_request(request, result_type)
                assert refused.value.error.code == -32602  # type: ignore[attr-defined]
            listed = await other.send_request(t.ListTasksRequest(), t.ListTasksResult)
            assert listed.tasks == []
            mine = await owner.send_request(t.ListTasksRequest(), t.ListTasksResult)
            assert [task.task_id for task in mine.tasks] == [task_id]
        assert _plain(await _result(owner, task_id))["content"][0]["text"] == "mine"


async def test_bulk_calls_become_tasks_only_when_they_cannot_start_now(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """A client that declared tasks sends a bulk call without asking for a task: with a free
    slot it is answered live; with the upstream saturated it gets a task handle at once. A
    client that did not declare tasks never gets one (its bulk call waits its turn)."""
    raw = RawMcp(http, proxy.mcp_url("up"))
    await _initialize_with_tasks(raw)
    bulk = {"interlock/class": "bulk"}
    live = await raw.post(_call(1, "echo", {"text": "now"}, meta=bulk))
    assert live.last["result"]["content"][0]["text"] == "now"
    plain = RawMcp(http, proxy.mcp_url("up"))
    await plain.initialize()
    async with busy(upstream, proxy):
        handle = await raw.post(_call(2, "echo", {"text": "deferred"}, meta=bulk))
        assert handle.last["result"]["task"]["status"] == "working"
        waited = asyncio.create_task(plain.post(_call(3, "echo", {"text": "waits"}, meta=bulk)))
        interactive = await raw.post(_call(4, "echo", {"text": "refused"}))
        assert interactive.last["error"]["data"]["reason"] == "overloaded"
        answer = await asyncio.wait_for(waited, BOUNDED_S)
    assert "task" not in answer.last["result"]
    assert answer.last["result"]["content"][0]["text"] == "waits"


async def test_tasks_methods_are_the_upstreams_when_it_is_not_our_task(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """A task id the proxy does not know, at an upstream that runs no tasks: -32602 not found
    (never forwarded to an upstream that would not know it either)."""
    raw = RawMcp(http, proxy.mcp_url("up"))
    await _initialize_with_tasks(raw)
    before = upstream.stats()["mcp_requests"]
    answer = await raw.post(_request(5, "tasks/get", {"taskId": "no-such-task"}))
    assert answer.last["error"]["code"] == -32602
    assert upstream.stats()["mcp_requests"] == before


async def test_tasks_methods_without_a_task_id_are_refused_clearly(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """`tasks/get` with no task id, or one that is not a string, is -32602 naming `taskId`, and
    never reaches the upstream."""
    raw = RawMcp(http, proxy.mcp_url("up"))
    await _initialize_with_tasks(raw)
    before = upstream.stats()["mcp_requests"]
    for number, params in enumerate(({}, {"taskId": 7}, {"taskId": ""}), start=20):
        answer = await raw.post(_request(number, "tasks/get", params))
        error = answer.last["error"]
        assert error["code"] == -32602
        assert error["data"]["reason"] == "invalid_params"
        assert "taskId" in error["message"]
    assert upstream.stats()["mcp_requests"] == before


# --- raw JSON-RPC helpers ---


def _request(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def _call(
    request_id: int,
    tool: str,
    arguments: dict[str, Any],
    *,
    task: bool = False,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    params: dict[str, Any] = {"name": tool, "arguments": arguments}
    if task:
        params["task"] = {"ttl": 60_000}
    if meta:
        params["_meta"] = meta
    return _request(request_id, "tools/call", params)


class TenantRaw(RawMcp):
    """Raw JSON-RPC as tenant `acme`."""

    def headers(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return super().headers({"X-Interlock-Tenant": "acme", **(extra or {})})


async def _raw_with_tasks(http: aiohttp.ClientSession, proxy: RunningProxy) -> RawMcp:
    raw = TenantRaw(http, proxy.mcp_url("up"))
    await _initialize_with_tasks(raw)
    return raw


async def _initialize_with_tasks(raw: RawMcp) -> None:
    capabilities = {"tasks": {"list": {}, "cancel": {}}}
    answer = await raw.post(
        _request(
            0,
            "initialize",
            {
                "protocolVersion": LEGACY,
                "capabilities": capabilities,
                "clientInfo": {"name": "raw-tasks", "version": "1"},
            },
        )
    )
    raw.session_id = answer.headers.get("Mcp-Session-Id")
    raw.version = LEGACY
    assert (await raw.post({"jsonrpc": "2.0", "method": "notifications/initialized"})).status == 202
    assert json.loads(answer.messages[-1])["result"]["protocolVersion"] == LEGACY


async def test_a_task_too_large_to_keep_is_refused_and_never_runs(
    upstream: RunningUpstream, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """A task-augmented call whose request is over `deferred.max_request_bytes` is refused
    -32600 `too_large_to_defer`: nothing is recorded, and it is not run live instead."""
    upstream.reset()
    spec = http_upstream("up", upstream.url, limits=Limits(max_running=1))
    deferred = DeferredSettings(poll_interval_s=0.1, max_request_bytes=512)
    async with running_proxy({"up": spec}, tmp_path, read_only=False, deferred=deferred) as proxy:
        raw = await _raw_with_tasks(http, proxy)
        body = {"to": "x@example.com", "subject": "big", "body": "x" * 2000}
        answer = await raw.post(_call(next(_IDS), "send_email", body, task=True))
        error = answer.last["error"]
        assert (error["code"], error["data"]["reason"]) == (-32600, "too_large_to_defer")
        store = proxy.app[LEDGER].store
        assert store is not None
        assert await store.list_entries() == []
    assert upstream.stats()["emails_total"] == 0


async def test_a_tasks_list_cursor_never_given_out_is_refused_clearly(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """`tasks/list` with a cursor the ledger never gave out is -32602 `invalid_cursor`, the
    upstream is not asked, and a list without one still answers."""
    raw = await _raw_with_tasks(http, proxy)
    seen = upstream.stats().get("mcp_requests", 0)
    listed = await raw.post(_request(next(_IDS), "tasks/list", {"cursor": "nonsense!"}))
    error = listed.last["error"]
    assert (error["code"], error["data"]["reason"]) == (-32602, "invalid_cursor")
    assert upstream.stats().get("mcp_requests", 0) == seen
    listed = await raw.post(_request(next(_IDS), "tasks/list", {}))
    assert listed.last["result"]["tasks"] == []
