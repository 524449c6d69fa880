"""The proxy learns tool annotations by itself, over HTTP and stdio alike: a tool it was never
shown in a `tools/list` is still classified by its `readOnlyHint` (real stdio MCPServer)."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from policies.model import LedgerSettings
from proxy.mcp.catalog import tool_annotations
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import RawMcp, running_proxy, stdio_upstream

http = mcp_proxy_harness.http

DOWN = LedgerSettings(url="postgresql+asyncpg://postgres@127.0.0.1:9/none")


async def test_a_stdio_tool_never_listed_is_classified_by_its_annotations(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """With the ledger down, a read-only stdio tool the client never listed still runs (the
    proxy listed it itself), while an unannotated one is refused -32054 (fail closed)."""
    upstreams = {"st": stdio_upstream("st", timeout_s=10)}
    async with running_proxy(upstreams, tmp_path, read_only=False, ledger=DOWN) as proxy:
        raw = RawMcp(http, proxy.mcp_url("st"))
        await raw.initialize()
        read = await raw.post(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "search_docs", "arguments": {"query": "q"}},
            }
        )
        send = await raw.post(
            {
                "jsonrpc": "2.0",
                "id": 2,
                "method": "tools/call",
                "params": {"name": "charge", "arguments": {"amount": 1}},
            }
        )
        assert tool_annotations(proxy.app, "st", "search_docs") == {"readOnlyHint": True}
    assert read.last["result"]["content"][0]["text"] == "3 results for 'q'"
    assert send.last["error"]["code"] == -32054
