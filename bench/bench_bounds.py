"""What one abusive client costs `interlock serve` (its own process): memory and file descriptors
before and after a huge answer, a huge batch, and a flood of idle connections.

- a side-effecting HTTP call answered with 300 MB: streamed to the caller while hashed (the ledger
  keeps the sha256 only);
- an MCP `tools/call` answered with 300 MB of JSON: refused `response_too_large` past
  `max_response_bytes` (16 MiB), never held;
- one POST with a batch of 10,000 pings: refused whole past `max_batch`;
- 3,000 connections that send nothing, against `max_connections: 1024`: the rest are answered 503.

All traffic stays on 127.0.0.1; every case is bounded in size and time (`--quick`: smaller).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.common import Table, bench_process, free_port

__all__ = ["run"]

_MB = 1024 * 1024
_MODERN = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}


def _upstream_app(size: int) -> web.Application:
    """One app for both upstreams: `POST /export` (HTTP, side effect) and `POST /mcp` (MCP)."""
    chunk = b"x" * _MB

    async def stream(request: web.Request, head: bytes, tail: bytes) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):  # the proxy stops reading past its cap
            await response.write(head)
            for _ in range(size // _MB):
                await response.write(chunk)
            await response.write(tail)
            await response.write_eof()
        return response

    async def export(request: web.Request) -> web.StreamResponse:
        return await stream(request, b'{"data":"', b'"}')

    async def mcp(request: web.Request) -> web.StreamResponse:
        message = await request.json()
        head = b'{"jsonrpc":"2.0","id":%d,"result":{"content":[{"type":"text","text":"' % int(
            message.get("id") or 0
        )
        return await stream(request, head, b'"}]}}')

    app = web.Application()
    app.router.add_post("/export", export)
    app.router.add_post("/mcp", mcp)
    return app


@contextlib.asynccontextmanager
async def _upstream(size: int) -> AsyncIterator[str]:
    runner = web.AppRunner(_upstream_app(size), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _mb(value: int) -> str:
    return f"{value / _MB:.0f}"


async def _drain(response: aiohttp.ClientResponse) -> int:
    total = 0
    async for chunk in response.content.iter_any():
        total += len(chunk)
    return total


async def _run(quick: bool) -> list[Table]:
    size = (64 if quick else 300) * _MB
    flood = 1500 if quick else 3000
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    table = Table(
        title="Bounds: what one abusive client costs interlock serve",
        columns=[
            "case",
            "what the client got",
            "RSS MB before → after",
            "open fds before → after (flood: peak)",
        ],
    )
    async with _upstream(size) as upstream:
        with tempfile.TemporaryDirectory() as folder:
            config = Path(folder) / "interlock.yaml"
            config.write_text(
                textwrap.dedent(
                    f"""
                    listen: "127.0.0.1:{port}"
                    ledger: {{url: "sqlite:///ledger.db"}}
                    max_connections: 1024
                    upstreams:
                      api: {{http: "{upstream}"}}
                      big: {{mcp: "{upstream}/mcp"}}
                    tools:
                      - {{match: "big/*", side_effect: false}}
                    """
                )
            )
            argv = [sys.executable, "-m", "proxy", "serve", "--config", str(config)]
            async with bench_process(argv, f"{base}/healthz") as proxy:
                async with aiohttp.ClientSession() as http:
                    rss, fds = proxy.memory_info().rss, proxy.num_fds()
                    async with http.post(
                        f"{base}/http/api/export", headers={"Idempotency-Key": "bench-big"}
                    ) as answer:
                        got = await _drain(answer)
                    table.rows.append(
                        [
                            f"HTTP side effect answered {_mb(size)} MB",
                            f"{answer.status}, {_mb(got)} MB streamed",
                            f"{_mb(rss)} → {_mb(proxy.memory_info().rss)}",
                            f"{fds} → {proxy.num_fds()}",
                        ]
                    )
                    rss = proxy.memory_info().rss
                    call = {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "method": "tools/call",
                        "params": {"name": "read", "arguments": {}, "_meta": _MODERN},
                    }
                    headers = {
                        "Accept": "application/json, text/event-stream",
                        "MCP-Protocol-Version": "2026-07-28",
                        "Mcp-Method": "tools/call",
                        "Mcp-Name": "read",
                    }
                    async with http.post(f"{base}/mcp/big", json=call, headers=headers) as answer:
                        text = await answer.text()
                    reason = json.loads(text).get("error", {}).get("data", {}).get("reason")
                    table.rows.append(
                        [
                            f"MCP tools/call answered {_mb(size)} MB",
                            f"{answer.status}, {reason}",
                            f"{_mb(rss)} → {_mb(proxy.memory_info().rss)}",
                            f"{proxy.num_fds()}",
                        ]
                    )
                    rss, fds = proxy.memory_info().rss, proxy.num_fds()
                    pings = [{"jsonrpc": "2.0", "id": i, "method": "ping"} for i in range(10_000)]
                    legacy = {"Accept": "application/json", "MCP-Protocol-Version": "2025-06-18"}
                    async with http.post(f"{base}/mcp/big", json=pings, headers=legacy) as answer:
                        status = answer.status
                    table.rows.append(
                        [
                            "one POST of 10,000 pings",
                            f"{status}, nothing sent",
                            f"{_mb(rss)} → {_mb(proxy.memory_info().rss)}",
                            f"{fds} → {proxy.num_fds()}",
                        ]
                    )
                rss, fds = proxy.memory_info().rss, proxy.num_fds()
                opened = await asyncio.gather(
                    *(asyncio.open_connection("127.0.0.1", port) for _ in range(flood))
                )
                await asyncio.sleep(2)  # let the proxy accept (and refuse) them all
                peak = proxy.num_fds()

                async def fate(reader: asyncio.StreamReader) -> str:
                    try:
                        head = await asyncio.wait_for(reader.read(12), 5)
                    except TimeoutError:
                        return "held"
                    except ConnectionError:
                        return "reset"
                    return "503" if head.startswith(b"HTTP/1.1 503") else "closed"

                fates = await asyncio.gather(*(fate(r) for r, _ in opened))
                refused = fates.count("503")
                others = ", ".join(
                    f"{fates.count(kind)} {kind}" for kind in ("held", "closed", "reset")
                )
                held = [writer for _, writer in opened]
                table.rows.append(
                    [
                        f"{flood} idle connections (max_connections 1024)",
                        f"{refused} answered 503 + Retry-After ({others})",
                        f"{_mb(rss)} → {_mb(proxy.memory_info().rss)}",
                        f"{fds} → {peak}",
                    ]
                )
                for writer in held:
                    writer.close()
    table.note = (
        "RSS and open files of the interlock serve process (psutil); 'before → after' brackets one "
        "case. The MCP answer is refused past max_response_bytes (16 MiB) without being held. Idle "
        "connections: 'held' are accepted ones waiting for a request head (closed after "
        "client_header_timeout_s) or still in the kernel's accept queue; the proxy's descriptors "
        "stay at max_connections plus its own."
    )
    return [table]


def run(quick: bool = False) -> list[Table]:
    """Memory and descriptors of the proxy under a huge answer, a huge batch, an idle flood."""
    return asyncio.run(_run(quick))
