"""The demo's deferred-work step: task handles while the upstream is paused, a SIGKILL, and the
restart that runs each task exactly once.

It speaks the 2026-07-28 tasks extension as raw JSON-RPC (the SDK 2.3.0 has no task types for
that line): a bulk `send_email` that cannot start now is answered with a task handle at once; the
proxy is killed while the tasks wait; after a restart they run, `tasks/get` gives each result
inline, and the upstream's own counters show one execution per email.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from dataclasses import dataclass
from typing import Any

import aiohttp
from rich.console import Console

__all__ = ["DemoRow", "after_the_restart", "before_the_crash"]

console = Console()
_MODERN = "2026-07-28"
_EXTENSION = "io.modelcontextprotocol/tasks"
_SUBJECTS = ("Invoice 1", "Invoice 2", "Invoice 3")
_BOUNDED_S = 30.0
_ids = itertools.count(1)


@dataclass
class DemoRow:
    """One line of the demo's summary table."""

    step: str
    what_happened: str
    proof: str


def _meta() -> dict[str, Any]:
    return {
        "io.modelcontextprotocol/protocolVersion": _MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "interlock-demo", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {_EXTENSION: {}}},
        "interlock/class": "bulk",
    }


async def _rpc(
    http: aiohttp.ClientSession, url: str, method: str, params: dict[str, Any], name: str
) -> dict[str, Any]:
    """One 2026-07-28 request (its `_meta` envelope and routing headers); its response."""
    body = {
        "jsonrpc": "2.0",
        "id": next(_ids),
        "method": method,
        "params": {**params, "_meta": _meta()},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": _MODERN,
        "Mcp-Method": method,
        "Mcp-Name": name,
    }
    async with http.post(url, json=body, headers=headers) as answer:
        text = await answer.text()
    if answer.headers.get("Content-Type", "").startswith("text/event-stream"):
        data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
        text = [d for d in data if d][-1]
    message: dict[str, Any] = json.loads(text)
    return message


async def _admin(http: aiohttp.ClientSession, url: str, action: str) -> None:
    base = url.split("/mcp/", 1)[0]
    token = os.environ.get("INTERLOCK_ADMIN_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    scope = f"{base}/admin/scopes/upstream:demo/{action}"
    async with http.post(scope, json={}, headers=headers) as answer:
        answer.raise_for_status()


async def before_the_crash(url: str) -> dict[str, str]:
    """Pause the upstream, send three bulk emails (each answered with a task handle at once),
    and return the handles by subject."""
    console.rule("5. Bulk emails while the upstream is paused: task handles, then a SIGKILL")
    handles: dict[str, str] = {}
    async with aiohttp.ClientSession() as http:
        await _admin(http, url, "pause")
        for subject in _SUBJECTS:
            arguments = {"to": "billing@example.com", "subject": subject}
            call = {"name": "send_email", "arguments": arguments}
            answer = await _rpc(http, url, "tools/call", call, "send_email")
            task = answer["result"]
            handles[subject] = task["taskId"]
            console.print(
                f"  {subject}: resultType={task['resultType']} status={task['status']} "
                f"taskId={task['taskId'][:10]}… pollIntervalMs={task['pollIntervalMs']}"
            )
    return handles


async def after_the_restart(url: str, handles: dict[str, str]) -> DemoRow:
    """Poll each task until it is completed; show the upstream's counters."""
    console.print("  restarted on the same ledger: the accepted tasks resume")
    done: dict[str, str] = {}
    async with aiohttp.ClientSession() as http:
        async with asyncio.timeout(_BOUNDED_S):
            for subject, task_id in handles.items():
                while True:
                    answer = await _rpc(http, url, "tasks/get", {"taskId": task_id}, task_id)
                    snapshot = answer["result"]
                    if snapshot["status"] not in ("working", "input_required"):
                        break
                    await asyncio.sleep(snapshot.get("pollIntervalMs", 500) / 1000)
                text = snapshot.get("result", {}).get("content", [{}])[0].get("text", "")
                done[subject] = snapshot["status"]
                console.print(f"  tasks/get {task_id[:10]}… → {snapshot['status']}: {text}")
        stats = await _rpc(http, url, "tools/call", {"name": "demo_stats"}, "demo_stats")
    counts = stats["result"].get("structuredContent") or {}
    if isinstance(counts.get("result"), dict):
        counts = counts["result"]
    ran = [counts.get(f"send_email:billing@example.com:{subject}", 0) for subject in handles]
    console.print(f"  upstream's own counter per email: {ran}")
    states = ", ".join(sorted(set(done.values())))
    return DemoRow(
        "tasks + restart",
        f"{len(handles)} task handles at once; SIGKILL while they waited; after the restart: "
        f"{states}",
        f"each email ran {ran} time(s)",
    )
