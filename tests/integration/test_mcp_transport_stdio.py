"""MCP through the proxy to stdio upstreams it spawns: sessions, the shared modern process, ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitRequestParams, ElicitResult

from proxy.mcp.catalog import CATALOG
from proxy.state import CONFIG, LEDGER
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    ENVELOPE,
    RawMcp,
    RunningProxy,
    running_proxy,
    stdio_upstream,
)
from tests.integration.mcp_servers import REPO_ROOT, stdio_command
from tests.integration.waiting import wait_until

MODES = ["legacy", "auto", "2026-07-28"]


@pytest.fixture
async def proxy(tmp_path: Path) -> AsyncIterator[RunningProxy]:
    upstreams = {"st": stdio_upstream("st", timeout_s=10)}
    async with running_proxy(upstreams, tmp_path) as running:
        yield running


http = mcp_proxy_harness.http


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _direct_lines(messages: list[dict[str, Any]], answers: int) -> list[bytes]:
    """Talk to the stdio test server directly and return the first `answers` response lines."""
    process = await asyncio.create_subprocess_exec(
        *stdio_command(),
        cwd=REPO_ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    lines: list[bytes] = []
    try:
        for message in messages:
            process.stdin.write(json.dumps(message).encode() + b"\n")
        await process.stdin.drain()
        async with asyncio.timeout(20):
            while len(lines) < answers:
                line = (await process.stdout.readline()).rstrip(b"\n")
                if b'"id"' in line:
                    lines.append(line)
    finally:
        process.kill()
        await process.wait()
    return lines


@pytest.mark.parametrize("mode", MODES)
async def test_sdk_client_works_against_a_stdio_upstream(proxy: RunningProxy, mode: str):
    """In every client mode, a stdio upstream lists its tools and answers calls via the proxy."""
    progress: list[float] = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        if (message or "").startswith("step"):  # not the pipeline's own "queued" / "running"
            progress.append(value)

    async with Client(proxy.mcp_url("st"), mode=mode, cache=None) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        echoed = await client.call_tool("echo", {"text": "over stdio"})
        slow = await client.call_tool("slow_progress", {"steps": 2}, progress_callback=on_progress)
    assert {"echo", "send_email", "search_docs"} <= names
    assert echoed.content[0].text == "over stdio"
    assert slow.content[0].text == "done after 2 steps"
    assert progress == [1, 2]
    assert proxy.app[CATALOG].annotations["st"]["search_docs"] == {"readOnlyHint": True}


async def test_client_session_over_a_stdio_upstream(proxy: RunningProxy):
    """A bare ClientSession on the streamable HTTP transport drives a stdio upstream unmodified."""
    async with (
        streamable_http_client(proxy.mcp_url("st")) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        tools = await session.list_tools()
        result = await session.call_tool("echo", {"text": "session"})
    assert any(tool.name == "echo" for tool in tools.tools)
    assert result.content[0].text == "session"


async def test_elicitation_reaches_the_client_from_a_stdio_session(proxy: RunningProxy):
    """A stdio server's elicitation request is relayed mid-call and the answer written back."""

    async def answer(context: Any, params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action="accept", content={"name": "Grace"})

    async with Client(
        proxy.mcp_url("st"), mode="legacy", cache=None, elicitation_callback=answer
    ) as client:
        result = await client.call_tool("ask_name", {})
    assert result.content[0].text == "hello Grace"


async def test_answers_are_the_processes_bytes(proxy: RunningProxy, http: aiohttp.ClientSession):
    """Responses reach the client as the very line the process wrote (ids restored in modern)."""
    init = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw-test", "version": "1"},
        },
    }
    call = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "żółw ☃"}},
    }
    modern = {
        "jsonrpc": "2.0",
        "id": "m-7",
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": "żółw ☃"}, "_meta": dict(ENVELOPE)},
    }
    initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    expected_legacy = (await _direct_lines([init, initialized, call], 2))[1]
    expected_modern = (await _direct_lines([modern], 1))[0]

    legacy = RawMcp(http, proxy.mcp_url("st"))
    await legacy.initialize()
    assert (await legacy.post(call)).body == expected_legacy
    answer = await RawMcp(http, proxy.mcp_url("st")).call_modern("m-7", "echo", {"text": "żółw ☃"})
    assert answer.body == expected_modern


async def test_modern_clients_share_one_process_without_crossing_answers(proxy: RunningProxy):
    """Concurrent modern clients reuse ids and progress tokens; each gets only its own messages."""

    async def run(steps: int) -> tuple[str, list[float]]:
        seen: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            if (message or "").startswith("step"):  # not the pipeline's own "running"
                assert total == steps
                seen.append(value)

        async with Client(proxy.mcp_url("st"), mode="2026-07-28", cache=None) as client:
            result = await client.call_tool(
                "slow_progress", {"steps": steps, "delay_s": 0.02}, progress_callback=on_progress
            )
        return result.content[0].text, seen

    results = await asyncio.gather(run(2), run(3), run(4))
    assert results == [
        ("done after 2 steps", [1, 2]),
        ("done after 3 steps", [1, 2, 3]),
        ("done after 4 steps", [1, 2, 3, 4]),
    ]
    assert len([p for p in proxy.transport.stdio.processes() if p.shared]) == 1


async def test_delete_ends_the_sessions_process(proxy: RunningProxy, http: aiohttp.ClientSession):
    """DELETE stops the session's process; the session then answers 404."""
    raw = RawMcp(http, proxy.mcp_url("st"))
    await raw.initialize()
    assert raw.session_id
    process = proxy.transport.stdio.session(proxy.app[CONFIG].upstreams["st"], raw.session_id)
    assert process is not None
    assert process.pid is not None
    pid = process.pid
    assert await raw.delete() == 200
    await wait_until(lambda: not _alive(pid))
    after = await raw.post({"jsonrpc": "2.0", "id": 3, "method": "ping"})
    assert after.status == 404
    assert after.json()["error"]["data"]["reason"] == "session_not_found"


async def test_a_crashed_child_ends_its_session(proxy: RunningProxy, http: aiohttp.ClientSession):
    """A process dying mid-call fails that call, ends the session (404), and is reaped."""
    raw = RawMcp(http, proxy.mcp_url("st"))
    await raw.initialize()
    process = proxy.transport.stdio.session(proxy.app[CONFIG].upstreams["st"], raw.session_id or "")
    assert process is not None
    answer = await raw.post(
        {"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "die"}}
    )
    assert answer.status in (200, 404)
    if answer.status == 200:
        assert "error" in answer.last or answer.last["result"]["isError"]
    await wait_until(lambda: process.exited.is_set())
    after = await raw.post({"jsonrpc": "2.0", "id": 5, "method": "ping"})
    assert after.status == 404


async def test_a_crashed_shared_process_is_replaced(
    proxy: RunningProxy, http: aiohttp.ClientSession
):
    """When the shared modern process dies, the next modern request starts a new one."""
    raw = RawMcp(http, proxy.mcp_url("st"))
    assert (await raw.call_modern(1, "echo", {"text": "a"})).status == 200
    (first,) = [p for p in proxy.transport.stdio.processes() if p.shared]
    await raw.call_modern(2, "die", {})
    await wait_until(lambda: first.exited.is_set())
    again = await raw.call_modern(3, "echo", {"text": "b"})
    assert json.loads(again.messages[-1])["result"]["content"][0]["text"] == "b"
    (second,) = [p for p in proxy.transport.stdio.processes() if p.shared]
    assert second.pid != first.pid


async def test_idle_processes_are_reaped(tmp_path: Path, http: aiohttp.ClientSession):
    """A session process with nothing in flight is ended after the idle period."""
    upstreams = {"st": stdio_upstream("st")}
    async with running_proxy(upstreams, tmp_path, stdio_idle_s=0.3) as proxy:
        raw = RawMcp(http, proxy.mcp_url("st"))
        await raw.initialize()
        (process,) = proxy.transport.stdio.processes()
        assert process.pid is not None
        pid = process.pid
        await wait_until(lambda: not _alive(pid))
        assert proxy.transport.stdio.processes() == []
        assert (await raw.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})).status == 404


async def test_stdio_sessions_are_capped_per_upstream(tmp_path: Path, http: aiohttp.ClientSession):
    """Past `max_sessions` live sessions, initialize is refused (-32050 overloaded) without
    spawning; ending a session frees its slot."""
    upstreams = {"st": stdio_upstream("st", max_sessions=1)}
    async with running_proxy(upstreams, tmp_path) as proxy:
        first = RawMcp(http, proxy.mcp_url("st"))
        await first.initialize()
        assert first.session_id
        second = RawMcp(http, proxy.mcp_url("st"))
        refused = await second.initialize()
        error = refused.last["error"]
        assert error["code"] == -32050
        assert error["data"]["reason"] == "overloaded"
        assert error["data"]["retry_after_s"] > 0
        assert len(proxy.transport.stdio.processes()) == 1
        assert await first.delete() == 200
        third = RawMcp(http, proxy.mcp_url("st"))
        await third.initialize()
        assert third.session_id


async def test_shutdown_ends_every_process(tmp_path: Path, http: aiohttp.ClientSession):
    """Stopping the proxy ends the session processes and the shared one."""
    upstreams = {"st": stdio_upstream("st")}
    async with running_proxy(upstreams, tmp_path) as proxy:
        await RawMcp(http, proxy.mcp_url("st")).initialize()
        await RawMcp(http, proxy.mcp_url("st")).call_modern(1, "echo", {"text": "x"})
        pids = [p.pid for p in proxy.transport.stdio.processes()]
    assert len(pids) == 2
    await wait_until(lambda: not any(_alive(pid) for pid in pids if pid is not None))


async def test_a_command_that_cannot_start_is_a_clear_error(
    tmp_path: Path, http: aiohttp.ClientSession
):
    """An upstream whose command does not exist gets a JSON-RPC error; the proxy stays up."""
    upstreams = {
        "broken": stdio_upstream("broken", ("/nonexistent/interlock-test-binary",)),
        "st": stdio_upstream("st"),
    }
    async with running_proxy(upstreams, tmp_path) as proxy:
        answer = await RawMcp(http, proxy.mcp_url("broken")).initialize()
        assert answer.status == 200
        error = answer.json()["error"]
        assert error["data"]["reason"] == "upstream_unreachable"
        assert (await RawMcp(http, proxy.mcp_url("st")).initialize()).status == 200


async def test_get_stream_opens_once_per_session(proxy: RunningProxy, http: aiohttp.ClientSession):
    """A session's GET stream opens as SSE, a second one is refused (409), DELETE ends it."""
    raw = RawMcp(http, proxy.mcp_url("st"))
    await raw.initialize()
    headers = raw.headers({"Accept": "text/event-stream"})
    async with http.get(proxy.mcp_url("st"), headers=headers) as stream:
        assert stream.status == 200
        async with http.get(proxy.mcp_url("st"), headers=headers) as second:
            assert second.status == 409
        assert await raw.delete() == 200
        async with asyncio.timeout(10):
            await stream.read()


async def test_a_process_counts_against_max_sessions_from_spawn_to_exit(
    tmp_path: Path, http: aiohttp.ClientSession
):
    """Initializes in waves 50 ms apart against `max_sessions: 2`: a process counted only once
    its initialize was answered let every wave spawn more (36 live processes, 2.5 GB in the
    report); now at most two processes ever run and the rest are refused overloaded."""
    upstreams = {"st": stdio_upstream("st", max_sessions=2)}
    me = psutil.Process()
    most = 0

    def children() -> int:
        found = 0
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                found += "mcp_stdio_server" in " ".join(child.cmdline())
        return found

    async with running_proxy(upstreams, tmp_path) as proxy:
        clients = [RawMcp(http, proxy.mcp_url("st")) for _ in range(8)]
        started = []
        for client in clients:
            started.append(asyncio.ensure_future(client.initialize()))
            for _ in range(5):  # 50 ms between waves, watching the process count meanwhile
                most = max(most, children())
                await asyncio.sleep(0.01)
        pending = asyncio.ensure_future(asyncio.gather(*started))
        while not pending.done():
            most = max(most, children())
            await asyncio.sleep(0.01)
        answers = await pending
        opened = [c for c in clients if c.session_id]
        refused = [a for a in answers if "error" in a.last]
    assert most <= 2
    assert len(opened) <= 2
    assert len(opened) + len(refused) == 8
    assert all(a.last["error"]["data"]["reason"] == "overloaded" for a in refused)


async def _silent_call(port: int, tool: str, arguments: dict[str, Any]) -> asyncio.StreamWriter:
    """A modern tools/call (with a progress token) from a client that reads its answer's head and
    then nothing more, on a socket with a small receive buffer: what it is sent piles up."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock)
    meta = {**ENVELOPE, "progressToken": "flood"}
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": meta},
        }
    ).encode()
    head = (
        f"POST /mcp/st HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2026-07-28\r\n"
        f"Mcp-Method: tools/call\r\nMcp-Name: {tool}\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    writer.write(head.encode() + body)
    await writer.drain()
    assert (await asyncio.wait_for(reader.readline(), 20)).startswith(b"HTTP/1.1 200")
    return writer


async def test_a_client_that_stops_reading_does_not_stall_the_shared_process(
    proxy: RunningProxy, http: aiohttp.ClientSession
):
    """The shared modern process serves every modern client: one whose tool floods progress
    while the client reads none of it must not hold up the others' answers (the process's
    output was read no further than that client read)."""
    silent = await _silent_call(proxy.port, "flood_progress", {"steps": 5000, "size": 4096})
    try:
        raw = RawMcp(http, proxy.mcp_url("st"))
        for number in range(30):  # 20 MB of progress for the silent client meanwhile
            answer = await asyncio.wait_for(raw.call_modern(number + 2, "echo", {"text": "hi"}), 20)
            assert answer.status == 200
            assert answer.last["result"]["content"][0]["text"] == "hi"
            await asyncio.sleep(0.2)
    finally:
        silent.close()


async def test_a_side_effect_over_stdio_is_recorded_before_and_after_and_replayed(tmp_path: Path):
    """A side-effecting call to a stdio process is claimed in the ledger and its answer (read to
    its envelope: the tool's output as the server's text) is recorded; the same key then
    replays that answer without reaching the process again. That the claim commits before the
    call is sent is the shared pipeline's order, held for every transport by
    `test_mcp_pipeline.py::test_duplicate_delivery_serially_executes_once` under the
    "forward before the claim commits" mutant (`make mutants`)."""
    upstreams = {"st": stdio_upstream("st", timeout_s=10)}
    async with running_proxy(upstreams, tmp_path, read_only=False) as proxy:
        store = proxy.app[LEDGER].store
        assert store is not None
        meta = {"interlock/idempotency-key": "k-stdio"}
        args = {"to": "a@example.com", "subject": "once"}
        async with Client(proxy.mcp_url("st"), mode="legacy") as client:  # one process
            first = await client.call_tool("send_email", args, meta=meta)
            again = await client.call_tool("send_email", args, meta=meta)
            counts = await client.call_tool("count", {})
        entry, history = await store.get("k-stdio")
    assert first.content[0].text == "sent email #1 to a@example.com"
    assert again.content == first.content
    assert (again.meta or {}).get("interlock/replayed") is True
    assert counts.structured_content is not None
    assert counts.structured_content["emails_total"] == 1
    assert [(str(t.from_state), str(t.to_state)) for t in history] == [
        ("None", "running"),
        ("running", "succeeded"),
    ]
    assert entry.outcome is not None
    assert json.loads(entry.outcome)["result"]["content"] == [
        {"type": "text", "text": "sent email #1 to a@example.com"}
    ]
