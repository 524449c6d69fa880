"""Third-party MCP clients and servers see the same thing through the proxy as directly.

- the TypeScript SDK's client (pinned in tests/conformance/package-lock.json, run by node);
- Pydantic AI's MCP toolset (an agent framework's client, built on FastMCP);
- the real stdio server `mcp-server-time`: its answers through the proxy are the very bytes it
  writes when talked to directly.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pydantic_ai.mcp import MCPToolset

from tests.conformance import processes
from tests.conformance.suite import SuiteTools, find_tools
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    RawMcp,
    RunningProxy,
    http_upstream,
    running_proxy,
    stdio_upstream,
)

http = mcp_proxy_harness.http
TIME_SERVER = (sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC")


@pytest.fixture(scope="module")
def reference_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("reference") / "reference.log"
    with processes.reference_http(log) as url:
        yield url


@pytest.fixture
async def proxy(tmp_path: Path, reference_url: str) -> AsyncIterator[RunningProxy]:
    upstreams = {
        "ref": http_upstream("ref", reference_url, timeout_s=20),
        "time": stdio_upstream("time", TIME_SERVER, timeout_s=20),
    }
    async with running_proxy(upstreams, tmp_path) as running:
        yield running


@pytest.fixture(scope="module")
def tools() -> SuiteTools:
    found = find_tools()
    if isinstance(found, str):
        if os.environ.get("CI") == "true":
            pytest.fail(f"the TypeScript client must run in CI: {found}")
        pytest.skip(found)
    return found


def _typescript_client(tools: SuiteTools, url: str) -> dict[str, Any]:
    script = tools.packages / "ts_client.mjs"
    shutil.copyfile(Path(__file__).with_name("ts_client.mjs"), script)
    done = subprocess.run(
        [str(tools.node_dir / "node"), str(script), url],
        cwd=tools.packages,
        env=tools.env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def test_the_typescript_sdk_client_gets_the_same_tools_and_results(
    tools: SuiteTools, proxy: RunningProxy, reference_url: str
) -> None:
    """The TypeScript SDK lists the same tools and gets the same results through the proxy."""
    direct = await asyncio.to_thread(_typescript_client, tools, reference_url)
    proxied = await asyncio.to_thread(_typescript_client, tools, proxy.mcp_url("ref"))
    assert proxied == direct
    assert direct["text"]["content"][0]["text"] == "This is a simple text response for testing."
    assert direct["failing"]["isError"] is True


async def _pydantic_ai(url: str) -> dict[str, Any]:
    async with MCPToolset(url, tool_error_behavior="error") as toolset:
        listed = await toolset.list_tools()
        text = await toolset.direct_call_tool("test_simple_text", {})
        mixed = await toolset.direct_call_tool("test_multiple_content_types", {})
    return {
        "tools": [tool.model_dump(by_alias=True, exclude_none=True) for tool in listed],
        "text": text,
        "mixed": repr(mixed),
    }


async def test_pydantic_ai_gets_the_same_tools_and_results(
    proxy: RunningProxy, reference_url: str
) -> None:
    """Pydantic AI's MCP toolset lists the same tools and gets the same results via the proxy."""
    direct = await _pydantic_ai(reference_url)
    proxied = await _pydantic_ai(proxy.mcp_url("ref"))
    assert proxied == direct
    assert direct["text"] == "This is a simple text response for testing."


_INIT = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "matrix", "version": "1"},
    },
}
_REQUESTS = [
    {"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
    {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {
            "name": "convert_time",
            "arguments": {
                "source_timezone": "UTC",
                "time": "12:00",
                "target_timezone": "Asia/Tokyo",
            },
        },
    },
    {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/call",
        "params": {"name": "convert_time", "arguments": {"source_timezone": "Nowhere/Else"}},
    },
]


async def _direct_answers() -> list[bytes]:
    """The lines `mcp-server-time` writes for the requests (in request order: it answers
    concurrently), talked to over its own stdio."""
    process = await asyncio.create_subprocess_exec(
        *TIME_SERVER,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    assert process.stdin is not None
    assert process.stdout is not None
    lines: dict[int, bytes] = {}
    try:
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        for message in [_INIT, initialized, *_REQUESTS]:
            process.stdin.write(json.dumps(message).encode() + b"\n")
        await process.stdin.drain()
        async with asyncio.timeout(30):
            while len(lines) < 1 + len(_REQUESTS):
                line = (await process.stdout.readline()).rstrip(b"\n")
                if b'"id"' in line:
                    lines[json.loads(line)["id"]] = line
    finally:
        process.kill()
        await process.wait()
    return [lines[request["id"]] for request in _REQUESTS]


async def test_mcp_server_time_answers_through_the_proxy_byte_for_byte(
    proxy: RunningProxy, http: aiohttp.ClientSession
) -> None:
    """mcp-server-time over stdio: each answer through the proxy is the line it wrote directly."""
    expected = await _direct_answers()
    raw = RawMcp(http, proxy.mcp_url("time"))
    await raw.initialize()
    answers = [(await raw.post(request)).body for request in _REQUESTS]
    for answer, line in zip(answers, expected, strict=True):
        assert answer == line
    assert b"Asia/Tokyo" in expected[1]
