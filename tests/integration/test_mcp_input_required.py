"""2026-07-28 elicitation: a side-effecting tool that answers `input_required` has not acted; the
client's re-send with the answers must reach the upstream (the next attempt), not be replayed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.state import LEDGER
from tests.integration.mcp_proxy_harness import (
    ENVELOPE,
    MODERN,
    http_upstream,
    running_proxy,
    serving_mcp,
)

HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": MODERN,
    "Mcp-Method": "tools/call",
    "Mcp-Name": "send_email",
}


@pytest.fixture
async def asking_upstream() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A minimal stateless MCP endpoint whose send_email first asks for confirmation."""
    received: list[dict[str, Any]] = []

    async def mcp(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("method") != "tools/call":  # e.g. the proxy listing tools: not offered here
            error = {"code": -32601, "message": "method not found"}
            return web.json_response({"jsonrpc": "2.0", "id": body.get("id"), "error": error})
        params = body["params"]
        received.append(params)
        if "inputResponses" in params:
            result = {"resultType": "complete", "content": [{"type": "text", "text": "sent"}]}
        else:
            ask = {"method": "elicitation/create", "params": {"message": "Send it?"}}
            result = {
                "resultType": "input_required",
                "inputRequests": {"confirm": ask},
                "requestState": "state-1",
            }
        return web.json_response({"jsonrpc": "2.0", "id": body["id"], "result": result})

    async with serving_mcp(mcp) as url:
        yield url, received


async def test_resend_with_input_responses_runs_as_the_next_attempt(
    asking_upstream: tuple[str, list[dict[str, Any]]], tmp_path: Path
):
    """First send → input_required (entry released, not succeeded); the re-send runs upstream."""
    url, received = asking_upstream
    first = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "send_email", "arguments": {"to": "bob"}, "_meta": dict(ENVELOPE)},
    }
    answers = {"confirm": {"action": "accept", "content": {}}}
    second = {
        **first,
        "id": 2,
        "params": {**first["params"], "inputResponses": answers, "requestState": "state-1"},
    }
    upstreams = {"up": http_upstream("up", url)}
    async with (
        running_proxy(upstreams, tmp_path, read_only=False) as proxy,
        aiohttp.ClientSession() as http,
    ):
        replies = []
        for message in (first, second):
            async with http.post(proxy.mcp_url("up"), json=message, headers=HEADERS) as answer:
                replies.append(await answer.json())
        store = proxy.app[LEDGER].store
        assert store is not None
        entries = await store.list_entries()
    assert replies[0]["result"]["resultType"] == "input_required"
    assert replies[1]["result"]["content"][0]["text"] == "sent"
    assert "interlock/replayed" not in (replies[1]["result"].get("_meta") or {})
    assert len(received) == 2
    assert [(e.state, e.attempt) for e in entries] == [("succeeded", 2)]
