"""What `interlock serve` does to its heap once it is listening (`proxy.runtime.heap`).

Checked in a fresh interpreter (the collector's settings are the whole process's): the application
is built and opened as `serve` opens it, the heap is settled as `serve` settles it, and then
side-effecting `tools/call`s run through the pipeline, 32 at a time, while `gc.callbacks` counts
the collections. A young-generation collection walks every young object still alive: at 32 calls
in flight that is their whole working state (futures, entries, pending ledger writes), so a
threshold below it made the collector run every few calls and walk all of that each time (about
4 % of a side-effecting call's instructions through `serve`, measured with callgrind).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

_PROGRAM = textwrap.dedent(
    """
    import asyncio, gc, itertools, sys
    from aiohttp import web
    from multidict import CIMultiDict, CIMultiDictProxy
    from policies.config import parse_config_text
    from proxy.app import create_app
    from proxy.mcp.pipeline.tools_call import McpCallContext, handle_tools_call
    from proxy.runtime.client_gone import ClientGone
    from proxy.runtime.heap import settle_after_start
    from proxy.state import CONFIG

    config = parse_config_text('''
    listen: "127.0.0.1:1"
    ledger: {url: "sqlite:///%s/ledger.db", durability: normal}
    telemetry: {enabled: false}
    limits:
      global: {max_running: 256, max_pending: 1024}
      tenant: {max_running: 64, max_pending: 256}
    upstreams:
      up: {mcp: "http://127.0.0.1:9/mcp"}
    tools:
      - {match: "up/send_email", side_effect: true}
    ''')
    HEADERS = CIMultiDictProxy(CIMultiDict({"MCP-Protocol-Version": "2025-11-25"}))
    numbers = itertools.count(1)
    collections = {0: 0, 1: 0, 2: 0}

    def counted(phase, info):
        if phase == "stop":
            collections[info["generation"]] += 1

    async def answer(request, timeout_s):
        return {"jsonrpc": "2.0", "id": request["id"], "result": {"content": [], "isError": False}}

    async def notify(message):
        pass

    async def main():
        app = create_app(config)
        runner = web.AppRunner(app)
        await runner.setup()
        upstream = app[CONFIG].upstreams["up"]

        async def calls(count):
            for _ in range(count):
                n = next(numbers)
                request = {"jsonrpc": "2.0", "id": n, "method": "tools/call",
                           "params": {"name": "send_email", "arguments": {"to": f"u{n}"}}}
                ctx = McpCallContext(app, upstream, headers=HEADERS,
                                     protocol_version="2025-11-25", client_gone=ClientGone())
                response = await handle_tools_call(ctx, request, answer, notify)
                assert "result" in response, response

        try:
            settle_after_start()
            gc.callbacks.append(counted)
            await asyncio.gather(*(calls(20) for _ in range(32)))
            gc.callbacks.remove(counted)
        finally:
            await runner.cleanup()
        print(collections[0], collections[1], collections[2], gc.get_freeze_count())

    asyncio.run(main())
    """
)


def test_calls_in_flight_do_not_make_the_collector_walk_them_every_few_calls(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM % tmp_path],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    young, middle, full, frozen = map(int, done.stdout.split())
    assert frozen > 10_000, "what start-up built was not moved out of the collector's way"
    # 640 side-effecting calls at concurrency 32: at the interpreter's default threshold (700)
    # the young generation is collected about 40 times (and the middle one with it), at 2,000
    # about 4 times.
    assert young <= 8, f"{young} young, {middle} middle, {full} full collections"
