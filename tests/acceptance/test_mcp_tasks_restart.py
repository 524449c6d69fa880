"""MCP tasks across a crash, with real processes (the proxy and a real MCP server): twenty
background tasks accepted, the proxy SIGKILLed while two run and eighteen wait; after a restart
the waiting ones run exactly once each (the server's own log), the interrupted ones are `unknown`
— their tasks `failed`, their resend refused — until an operator resolves them."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.acceptance.test_proxy_crash import _free_port, interlock, proxy_process
from tests.integration.mcp_servers import running_upstream
from tests.integration.waiting import wait_until

pytestmark = pytest.mark.slow
TASKS = 20
LONG_S = 8.0  # the first two tasks are still running at the server when the proxy is killed
BOUNDED_S = 40.0
LEGACY = "2025-11-25"
_ids = itertools.count(1)


class Session:
    """A raw 2025-11-25 MCP session that declared `tasks` (the SDK cannot take a task handle
    from `tools/call`), as tenant acme, class background."""

    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url
        self.session_id: str | None = None

    async def post(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": LEGACY,
            "X-Interlock-Tenant": "acme",
            "X-Interlock-Class": "background",
        }
        if self.session_id:
            headers["Mcp-Session-Id"] = self.session_id
        body = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params}
        async with (
            asyncio.timeout(BOUNDED_S),
            self.http.post(self.url, json=body, headers=headers) as r,
        ):
            text = await r.text()
            self.session_id = self.session_id or r.headers.get("Mcp-Session-Id")
        if r.headers.get("Content-Type", "").startswith("text/event-stream"):
            text = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")][-1]
        message: dict[str, Any] = json.loads(text)
        return message

    async def open(self) -> None:
        capabilities = {"tasks": {"list": {}, "cancel": {}}}
        client = {"name": "restart-test", "version": "1"}
        await self.post(
            "initialize",
            {"protocolVersion": LEGACY, "capabilities": capabilities, "clientInfo": client},
        )
        headers = {"Content-Type": "application/json", "Mcp-Session-Id": self.session_id or ""}
        headers["MCP-Protocol-Version"] = LEGACY
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with self.http.post(self.url, json=note, headers=headers) as answer:
            assert answer.status == 202


def _config(folder: Path, port: int, upstream: str) -> Path:
    path = folder / "interlock.yaml"
    path.write_text(
        f"""
listen: "127.0.0.1:{port}"
ledger: {{url: "sqlite:///ledger.db", lease_s: 1, sweep_interval_s: 0.2}}
deferred: {{poll_interval_s: 0.1}}
defaults: {{timeout_s: 30, deadline_s: 60}}
upstreams:
  up:
    mcp: "{upstream}"
    limits: {{max_running: 4}}
"""
    )
    return path


async def _until(predicate: Any, what: str) -> None:
    await wait_until(predicate, BOUNDED_S, what=what, interval_s=0.05)


async def test_tasks_survive_a_sigkill_waiting_ones_run_once_interrupted_ones_are_unknown(
    tmp_path: Path,
) -> None:
    """Twenty task-augmented background `hold` calls get task handles at once; two start (the
    interactive share stays free) and the proxy is SIGKILLed; after the restart the eighteen
    waiting ones run exactly once (the server's `started` tags), `tasks/result` gives each its
    answer, the two interrupted ones end `failed` as unknown, and a resend of one is refused
    -32052 until `interlock ledger resolve`."""
    port = _free_port()
    tags = [f"task-{i:02d}" for i in range(TASKS)]
    with running_upstream() as upstream:
        config = _config(tmp_path, port, upstream.url)
        url = f"http://127.0.0.1:{port}/mcp/up"
        # no kept-alive connection may outlive the killed process: one per request
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            with proxy_process(config) as first:
                session = Session(http, url)
                await session.open()
                handles = {}
                for i, tag in enumerate(tags):
                    seconds = LONG_S if i < 2 else 0.05
                    arguments = {"seconds": seconds, "tag": tag}
                    params = {
                        "name": "hold",
                        "arguments": arguments,
                        "task": {"ttl": 60000},
                        "_meta": {"interlock/idempotency-key": tag},
                    }
                    created = await session.post("tools/call", params)
                    handles[tag] = created["result"]["task"]["taskId"]
                await _until(lambda: len(upstream.stats()["started"]) == 2, "two tasks start")
                interrupted = sorted(upstream.stats()["started"])
                assert interrupted == ["task-00", "task-01"]
                first.send_signal(signal.SIGKILL)
                first.wait(timeout=10)
            waiting = [tag for tag in tags if tag not in interrupted]
            accepted = json.loads(
                interlock(config, "ledger", "list", "--state", "accepted", "--json")
            )
            assert sorted(e["idempotency_key"] for e in accepted) == waiting

            with proxy_process(config) as second:
                session = Session(http, url)
                await session.open()
                for tag in waiting:
                    answer = await session.post("tasks/result", {"taskId": handles[tag]})
                    assert answer["result"]["content"][0]["text"] == "held 0.05 s", tag
                started = upstream.stats()["started"]
                assert {tag: started.count(tag) for tag in tags} == dict.fromkeys(tags, 1)
                await _until(
                    lambda: (
                        len(
                            json.loads(
                                interlock(config, "ledger", "list", "--state", "unknown", "--json")
                            )
                        )
                        == 2
                    ),
                    "the interrupted leases expire",
                )
                for tag in interrupted:
                    polled = await session.post("tasks/get", {"taskId": handles[tag]})
                    assert polled["result"]["status"] == "failed"
                    assert "unknown" in polled["result"]["statusMessage"]
                    result = await session.post("tasks/result", {"taskId": handles[tag]})
                    assert result["error"]["code"] == -32053
                resend = await session.post(
                    "tools/call",
                    {
                        "name": "hold",
                        "arguments": {"seconds": LONG_S, "tag": "task-00"},
                        "_meta": {"interlock/idempotency-key": "task-00"},
                    },
                )
                assert resend["error"]["code"] == -32052
                interlock(config, "ledger", "resolve", "task-00", "--as", "succeeded")
                after = await session.post("tasks/get", {"taskId": handles["task-00"]})
                assert after["result"]["status"] == "completed"
                assert upstream.stats()["started"].count("task-00") == 1
                second.send_signal(signal.SIGTERM)
                assert second.wait(timeout=20) == 0
