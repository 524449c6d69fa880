"""The `tools/call` pipeline alone: CPU per call in-process, with an upstream that answers at once.

`bench_mcp` measures whole processes, where the kernel, the sockets and the HTTP server are most of
a call's CPU. This isolates what the pipeline itself adds (classification, admission, the server
span, the ledger's claim and outcome for a side-effecting call): the application is built by
`proxy.app.create_app` on a SQLite ledger at `durability: full` (opened as `interlock serve` opens
it), and `handle_tools_call` is called directly with a `send_upstream` that returns a result at
once; on the event loop `serve` runs (uvloop where installed), telemetry configured off as in
the benchmarks of whole processes. Reported: this process's CPU per call (`time.process_time`:
the event loop and the ledger's writer thread) at concurrency 1 and 32, and the event loop's own
share (`time.thread_time` of the loop's thread), beside the ledger's floor (`bench.ledger_floor`:
the same two commits as bare SQL through the writer thread) measured in the same run. Per-call
work that grew with the number in flight would show as a c=32 figure above the c=1 one. A third
kind sends a side-effecting call with a 1 MiB string argument (an attachment, say): what its key,
its fingerprint and its stored (capped) text cost when the arguments are large.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from bench.common import Table
from bench.ledger_floor import measure_floor
from policies.config import parse_config_text
from policies.model import Config, TelemetrySettings
from proxy.app import create_app
from proxy.mcp.pipeline.tools_call import McpCallContext, handle_tools_call
from proxy.ops.cli import loop_factory
from proxy.runtime.client_gone import ClientGone
from proxy.runtime.heap import settle_after_start
from proxy.state import CONFIG
from proxy.telemetry.sdk import configure_telemetry

__all__ = [
    "KINDS",
    "drive",
    "pipeline_app",
    "pipeline_caller",
    "pipeline_config",
    "run",
    "run_as_serve",
]

T = TypeVar("T")

_MODERN = "2026-07-28"
_HEADERS = CIMultiDictProxy(
    CIMultiDict(
        {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": _MODERN,
            "Mcp-Method": "tools/call",
        }
    )
)
_RESULT = {"content": [{"type": "text", "text": "ok"}], "isError": False}
_LARGE = "side-effecting, 1 MiB argument"
KINDS = {"read-only": "search_docs", "side-effecting": "send_email", _LARGE: "send_email"}
_MIB_TEXT = "x" * (1 << 20)


def pipeline_config(folder: Path) -> Config:
    return parse_config_text(
        f"""
        listen: "127.0.0.1:1"
        ledger: {{url: "sqlite:///{folder}/ledger.db", durability: full}}
        telemetry: {{enabled: false}}
        limits:
          global: {{max_running: 256, max_pending: 1024}}
          tenant: {{max_running: 64, max_pending: 256}}
        upstreams:
          up: {{mcp: "http://127.0.0.1:9/mcp", timeout_s: 30}}
        tools:
          - {{match: "up/send_email", side_effect: true}}
          - {{match: "up/search_docs", side_effect: false}}
        """
    )


async def _answer(request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    del timeout_s
    return {"jsonrpc": "2.0", "id": request["id"], "result": _RESULT}


async def _notify(note: dict[str, Any]) -> None:
    del note


def pipeline_caller(app: web.Application, kind: str) -> Callable[[], Awaitable[None]]:
    upstream = app[CONFIG].upstreams["up"]
    numbers = itertools.count(1)
    tool = KINDS[kind]

    async def call() -> None:
        n = next(numbers)
        arguments: dict[str, Any] = {"subject": f"s{n}"}
        if kind == "read-only":
            arguments = {"query": "backpressure"}
        elif kind == _LARGE:  # an attachment, say: its key, fingerprint and stored text
            arguments["body"] = _MIB_TEXT
        request = {
            "jsonrpc": "2.0",
            "id": n,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments, "_meta": {}},
        }
        ctx = McpCallContext(
            app, upstream, headers=_HEADERS, protocol_version=_MODERN, client_gone=ClientGone()
        )
        response = await handle_tools_call(ctx, request, _answer, _notify)
        if "result" not in response:
            raise RuntimeError(f"the pipeline refused a benchmark call: {response}")

    return call


async def drive(call: Callable[[], Awaitable[None]], calls: int, concurrency: int) -> None:
    remaining = iter(range(calls))

    async def worker() -> None:
        for _ in remaining:
            await call()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


@contextlib.asynccontextmanager
async def pipeline_app(folder: Path) -> AsyncIterator[web.Application]:
    """The application on `pipeline_config(folder)`, its ledger open as `interlock serve` opens
    it and the heap as `serve` leaves it before its first call; closed on the way out."""
    app = create_app(pipeline_config(folder))
    runner = web.AppRunner(app)
    await runner.setup()
    thresholds = gc.get_threshold()
    settle_after_start()
    try:
        yield app
    finally:
        gc.set_threshold(*thresholds)
        gc.unfreeze()
        await runner.cleanup()


def run_as_serve(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`main()` on the event loop `serve` runs (uvloop where installed), telemetry configured
    off as `serve` configures it when disabled."""
    telemetry = configure_telemetry(TelemetrySettings(), enabled=False)
    try:
        with asyncio.Runner(loop_factory=loop_factory("auto")) as runner:
            return runner.run(main())
    finally:
        telemetry.shutdown()


async def _measure(quick: bool) -> tuple[dict[tuple[str, int], tuple[float, float]], float]:
    calls = {
        "read-only": 2000 if quick else 20000,
        "side-effecting": 500 if quick else 4000,
        _LARGE: 100 if quick else 400,
    }
    results: dict[tuple[str, int], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        async with pipeline_app(Path(tmp)) as app:
            for kind, count in calls.items():
                call = pipeline_caller(app, kind)
                for concurrency in (1, 32):
                    await drive(call, max(200, count // 10), concurrency)  # warm-up
                    cpu, loop_cpu = time.process_time(), time.thread_time()
                    await drive(call, count, concurrency)
                    cpu = time.process_time() - cpu
                    loop_cpu = time.thread_time() - loop_cpu
                    results[kind, concurrency] = (cpu / count * 1e6, loop_cpu / count * 1e6)
        floors = await measure_floor(Path(tmp), 0.5 if quick else 2.0)
    handed = next(f for f in floors if f.through_thread and f.pairs_per_commit == 1)
    return results, handed.cpu_us_per_pair


def run(quick: bool = False) -> list[Table]:
    """CPU per `tools/call` through the pipeline alone, read-only and side-effecting."""
    results, floor = run_as_serve(lambda: _measure(quick))
    table = Table(
        title="tools/call pipeline alone: CPU per call in-process (upstream answers at once)",
        columns=["call", "concurrency", "CPU µs/call", "event loop's share µs", "c=32 vs c=1"],
    )
    for kind in KINDS:
        for concurrency in (1, 32):
            cpu, loop_cpu = results[kind, concurrency]
            ratio = "" if concurrency == 1 else f"{cpu / results[kind, 1][0]:.2f}×"
            table.rows.append([kind, str(concurrency), f"{cpu:.0f}", f"{loop_cpu:.0f}", ratio])
    table.note = (
        "SQLite ledger at durability full; CPU is this process's (the event loop and the ledger's "
        "writer thread). The floor under a side-effecting call's two durable commits, as bare "
        f"SQL through the writer thread one at a time, measured in this run: {floor:.0f} µs. "
        "A read-only call is classification, admission and the server span; a side-effecting one "
        "adds its key, the write-ahead claim and the recorded outcome; with a 1 MiB argument it "
        "hashes that MiB twice (key and fingerprint) and stores the first "
        "`ledger.max_argument_bytes` of it."
    )
    return [table]
