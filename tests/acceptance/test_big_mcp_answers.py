"""An MCP upstream that answers a tools/call with far more than `max_response_bytes`: the caller
gets a clear error (never an out-of-memory proxy), a side effect is recorded `unknown`, and
`interlock serve` does not grow by the size of the answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import psutil
import pytest
from aiohttp import web

from tests.acceptance.test_proxy_crash import _free_port, interlock, proxy_process, write_config
from tests.integration.proxy_harness import serving

SIZE = 64 * 1024 * 1024
MAX_GROWTH = 24 * 1024 * 1024
ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


async def _huge(request: web.Request) -> web.StreamResponse:
    """Answers any tools/call with a result of SIZE bytes of text, as JSON or as one SSE event;
    a resources/read with RELAYED bytes of JSON of a known length."""
    message = await request.json()
    if message.get("method") == "resources/read":
        return await _big_resource(request, message)
    head = json.dumps({"jsonrpc": "2.0", "id": message.get("id")})[:-1].encode()
    head += b',"result":{"content":[{"type":"text","text":"'
    tail = b'"}]}}'
    sse = message.get("params", {}).get("name", "").endswith("_sse")
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream" if sse else "application/json"}
    )
    await response.prepare(request)
    await response.write(b"data: " + head if sse else head)
    chunk = b"x" * (1024 * 1024)
    for _ in range(SIZE // len(chunk)):
        await response.write(chunk)
    await response.write(tail + (b"\n\n" if sse else b""))
    await response.write_eof()
    return response


RELAYED = 48 * 1024 * 1024


async def _big_resource(request: web.Request, message: dict[str, object]) -> web.StreamResponse:
    head = json.dumps({"jsonrpc": "2.0", "id": message.get("id")})[:-1].encode()
    head += b',"result":{"contents":[{"uri":"big://x","text":"'
    tail = b'"}]}}'
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(head) + RELAYED + len(tail)
    await response.prepare(request)
    await response.write(head)
    chunk = b"y" * (1024 * 1024)
    for _ in range(RELAYED // len(chunk)):
        await response.write(chunk)
    await response.write(tail)
    await response.write_eof()
    return response


def _peak_rss(pid: int) -> int:
    """The process's peak resident set so far (VmHWM), in bytes."""
    status = Path(f"/proc/{pid}/status").read_text()
    (line,) = [line for line in status.splitlines() if line.startswith("VmHWM:")]
    return int(line.split()[1]) * 1024


def _config(tmp_path: Path, port: int, upstream: str, more: str = "") -> Path:
    return write_config(tmp_path, port, f'  big: {{mcp: "{upstream}"}}\n', more)


@pytest.fixture
async def upstream() -> AsyncIterator[str]:
    app = web.Application(client_max_size=1024 * 1024)
    app.router.add_post("/mcp", _huge)
    async with serving(app) as base:
        yield f"{base}/mcp"


async def _call(http: aiohttp.ClientSession, port: int, tool: str) -> dict[str, object]:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": {},
            "_meta": {**ENVELOPE, "interlock/idempotency-key": tool},
        },
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    }
    async with http.post(f"http://127.0.0.1:{port}/mcp/big", json=body, headers=headers) as answer:
        text = await answer.text()
    line = [part for part in text.splitlines() if part.startswith(("{", "data: {"))][-1]
    return dict(json.loads(line.removeprefix("data: ")))


@pytest.mark.slow
async def test_an_answer_over_max_response_bytes_is_a_clear_error_and_memory_stays_bounded(
    tmp_path: Path, upstream: str
):
    """64 MB answers (JSON and one SSE event) against an 8 MiB cap: read-only calls get -32055
    response_too_large, the side effect -32053 and an `unknown` entry; RSS grows < 24 MB."""
    port = _free_port()
    config = _config(
        tmp_path,
        port,
        upstream,
        """
max_response_bytes: 8388608
tools:
  - {match: "big/read*", side_effect: false}
  - {match: "big/send*", side_effect: true}
""",
    )
    with proxy_process(config) as process:
        memory = psutil.Process(process.pid)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as warm:
                assert warm.status == 200
            before = memory.memory_info().rss
            answers = {tool: await _call(http, port, tool) for tool in ("read", "read_sse", "send")}
            after = memory.memory_info().rss
    for tool in ("read", "read_sse"):
        error = answers[tool]["error"]
        assert isinstance(error, dict)
        assert error["code"] == -32055, answers[tool]
        assert error["data"]["reason"] == "response_too_large"
    send_error = answers["send"]["error"]
    assert isinstance(send_error, dict)
    assert send_error["code"] == -32053
    assert "max_response_bytes" in send_error["message"]
    entry = json.loads(interlock(config, "ledger", "show", "send", "--json"))
    assert entry["state"] == "unknown"
    assert after - before < MAX_GROWTH, f"RSS grew by {(after - before) / 2**20:.0f} MB"


@pytest.mark.slow
async def test_a_big_relayed_answer_streams_through_without_being_held(
    tmp_path: Path, upstream: str
):
    """Methods the proxy only relays (here resources/read, 48 MB of JSON with a Content-Length)
    reach the client whole, and `interlock serve` never holds the answer: its peak RSS grows by
    less than 24 MB (it read a known-length answer up to 64 MB whole before relaying it)."""
    port = _free_port()
    config = _config(tmp_path, port, upstream)
    body = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "resources/read",
        "params": {"uri": "big://x", "_meta": ENVELOPE},
    }
    headers = {
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "resources/read",
        "Mcp-Name": "big://x",
    }
    with proxy_process(config) as process:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as warm:
                assert warm.status == 200
            before = _peak_rss(process.pid)
            url = f"http://127.0.0.1:{port}/mcp/big"
            async with http.post(url, json=body, headers=headers) as answer:
                assert answer.status == 200
                size = 0
                async for chunk in answer.content.iter_any():
                    size += len(chunk)
                    last = chunk
            peak = _peak_rss(process.pid)
    assert size > RELAYED
    assert last.endswith(b'"}]}}')
    assert peak - before < MAX_GROWTH, f"peak RSS grew by {(peak - before) / 2**20:.0f} MB"
