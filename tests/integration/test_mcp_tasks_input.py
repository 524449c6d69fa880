"""A deferred task whose tool asks for input (2026-07-28 tasks extension, SEP-2663): the real
test upstream's `confirm_send` answers `resultType: "input_required"`; the task then shows
`input_required` with the upstream's `inputRequests` in `tasks/get`; `tasks/update` with the
`inputResponses` puts it back in line and the re-send (with the responses and the upstream's
`requestState`) completes it. Only the creating tenant may update it, and only while it waits for
input."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from policies.model import Limits
from tests.integration import mcp_proxy_harness
from tests.integration import test_mcp_tasks as core_tasks
from tests.integration.mcp_proxy_harness import (
    RawMcp,
    RunningProxy,
    deferring_proxy,
    http_upstream,
    serving_mcp,
)
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.test_mcp_tasks_extension import (
    BOUNDED_S,
    _headers,
    _request,
    _tools_call,
    busy,
)

http = mcp_proxy_harness.http
ANSWERS = {"confirm": {"action": "accept", "content": {"ok": True}}}


upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
async def proxy(upstream: RunningUpstream, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    upstream.reset()
    spec = http_upstream("up", upstream.url, limits=Limits(max_running=1))
    async with deferring_proxy(spec, tmp_path) as running:
        yield running


async def _get(raw: RawMcp, task_id: str, headers: dict[str, str] | None = None) -> dict[str, Any]:
    answer = await raw.post(
        _request(9, "tasks/get", {"taskId": task_id}),
        {**_headers("tasks/get", task_id), **(headers or {})},
    )
    return dict(answer.last)


async def _until(raw: RawMcp, task_id: str, status: str) -> dict[str, Any]:
    async with asyncio.timeout(BOUNDED_S):
        while True:
            polled = await _get(raw, task_id)
            if polled["result"]["status"] == status:
                return dict(polled["result"])
            assert polled["result"]["status"] in ("working", "input_required"), polled
            await asyncio.sleep(0.05)


async def _update(
    raw: RawMcp, task_id: str, responses: Any, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    answer = await raw.post(
        _request(7, "tasks/update", {"taskId": task_id, "inputResponses": responses}),
        {**_headers("tasks/update", task_id), **(headers or {})},
    )
    return dict(answer.last)


async def _deferred_confirm(upstream: RunningUpstream, proxy: RunningProxy, raw: RawMcp) -> str:
    """A saturated bulk `confirm_send` becomes a task; its handle."""
    async with busy(upstream, proxy):
        created = await raw.post(
            _tools_call(1, "confirm_send", {"to": "bob"}), _headers("tools/call", "confirm_send")
        )
    task = created.last["result"]
    assert task["resultType"] == "task", task
    return str(task["taskId"])


async def test_input_required_then_update_completes_the_task(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """task → input_required with the upstream's inputRequests → tasks/update → completed with
    the upstream's result; the tool ran to completion exactly once."""
    raw = RawMcp(http, proxy.mcp_url("up"))
    task_id = await _deferred_confirm(upstream, proxy, raw)
    waiting = await _until(raw, task_id, "input_required")
    asked = waiting["inputRequests"]["confirm"]
    assert asked["method"] == "elicitation/create"
    assert asked["params"]["message"] == "Send to bob?"
    assert "result" not in waiting
    assert "error" not in waiting
    assert upstream.stats()["calls"].get("confirm_send_done", 0) == 0

    ack = await _update(raw, task_id, ANSWERS)
    assert ack["result"] == {"resultType": "complete"}, ack
    done = await _until(raw, task_id, "completed")
    assert done["result"]["content"][0]["text"] == "confirmed send to bob (accept)"
    calls = upstream.stats()["calls"]
    assert calls["confirm_send"] == 2  # the asking round and the re-send with the answers
    assert calls["confirm_send_done"] == 1


async def test_another_tenants_update_is_not_found(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    raw = RawMcp(http, proxy.mcp_url("up"))
    task_id = await _deferred_confirm(upstream, proxy, raw)
    await _until(raw, task_id, "input_required")
    other = {"X-Interlock-Tenant": "globex"}
    refused = await _update(raw, task_id, ANSWERS, other)
    assert refused["error"]["data"]["reason"] == "task_not_found", refused
    still = await _until(raw, task_id, "input_required")
    assert still["inputRequests"]["confirm"]["method"] == "elicitation/create"
    assert upstream.stats()["calls"].get("confirm_send_done", 0) == 0


async def test_update_of_a_task_not_waiting_for_input_is_refused(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """A working task and a completed one are not waiting for input: -32602, and nothing
    changes (the working task still completes with its own result)."""
    raw = RawMcp(http, proxy.mcp_url("up"))
    async with busy(upstream, proxy):
        created = await raw.post(
            _tools_call(1, "echo", {"text": "plain"}), _headers("tools/call", "echo")
        )
        task_id = created.last["result"]["taskId"]
        working = await _update(raw, task_id, ANSWERS)
    assert working["error"]["code"] == -32602, working
    assert working["error"]["data"]["reason"] == "task_not_waiting_for_input"
    done = await _until(raw, task_id, "completed")
    assert done["result"]["content"][0]["text"] == "plain"
    finished = await _update(raw, task_id, ANSWERS)
    assert finished["error"]["code"] == -32602, finished
    assert finished["error"]["data"]["reason"] == "task_not_waiting_for_input"


async def test_a_task_waiting_for_input_can_be_cancelled(
    upstream: RunningUpstream, proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """`inputResponses` that are not an object are refused (-32602); `tasks/cancel` of a task in
    input_required: acknowledged, cancelled, never re-sent, and its answers refused afterwards."""
    raw = RawMcp(http, proxy.mcp_url("up"))
    task_id = await _deferred_confirm(upstream, proxy, raw)
    await _until(raw, task_id, "input_required")
    malformed = await _update(raw, task_id, ["accept"])
    assert malformed["error"]["code"] == -32602, malformed
    assert malformed["error"]["data"]["reason"] == "invalid_params"
    ack = await raw.post(
        _request(8, "tasks/cancel", {"taskId": task_id}), _headers("tasks/cancel", task_id)
    )
    assert ack.last["result"] == {"resultType": "complete"}
    assert (await _get(raw, task_id))["result"]["status"] == "cancelled"
    late = await _update(raw, task_id, ANSWERS)
    assert late["error"]["data"]["reason"] == "task_not_waiting_for_input"
    assert upstream.stats()["calls"]["confirm_send"] == 1


@pytest.fixture
async def asking_legacy_upstream() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A minimal MCP endpoint that answers `tools/call` with `input_required` whatever the
    revision (the SDK server cannot on 2025-11-25); it records the calls it received."""
    received: list[dict[str, Any]] = []

    async def mcp(request: web.Request) -> web.Response:
        body = await request.json()
        method, request_id = body.get("method"), body.get("id")
        if request_id is None:
            return web.Response(status=202)
        if method == "initialize":
            version = body["params"]["protocolVersion"]
            info = {"name": "asking", "version": "1"}
            result = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": info}
        elif method == "tools/list":
            schema = {"type": "object", "properties": {"to": {"type": "string"}}}
            result = {"tools": [{"name": "send", "inputSchema": schema}]}
        elif method == "tools/call":
            received.append(body["params"])
            ask = {"method": "elicitation/create", "params": {"message": "Send it?"}}
            result = {"resultType": "input_required", "inputRequests": {"confirm": ask}}
        else:
            error = {"code": -32601, "message": "method not found"}
            return web.json_response({"jsonrpc": "2.0", "id": request_id, "error": error})
        headers = {"Mcp-Session-Id": "asking-session"}  # a session: the client's tasks count
        body = {"jsonrpc": "2.0", "id": request_id, "result": result}
        return web.json_response(body, headers=headers)

    async with serving_mcp(mcp) as url:
        yield url, received


async def test_on_the_2025_11_25_line_a_deferred_call_asking_for_input_still_fails(
    asking_legacy_upstream: tuple[str, list[dict[str, Any]]],
    tmp_path: Path,
    http: aiohttp.ClientSession,
) -> None:
    """No way to answer there: a core task whose upstream answers `input_required` ends
    failed with reason `input_required`, and it is never re-sent."""
    url, received = asking_legacy_upstream
    async with deferring_proxy(http_upstream("up", url), tmp_path) as legacy:
        raw = await core_tasks._raw_with_tasks(http, legacy)
        created = await core_tasks._create(raw, "send", {"to": "bob"})
        task_id = created.task.task_id
        async with core_tasks.task_session(legacy.mcp_url("up")) as session:
            with pytest.raises(Exception) as failed:
                await core_tasks._result(session, task_id)
            assert (await core_tasks._get(session, task_id)).status == "failed"
    assert failed.value.error.data["reason"] == "input_required"  # type: ignore[attr-defined]
    assert len(received) == 1
