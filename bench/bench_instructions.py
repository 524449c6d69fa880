"""Instructions per MCP `tools/call`: what each proxy process executes, counted, not timed.

CPU time on a shared VM moves by tens of percent from one minute to the next; the count of
instructions a process executes for the same calls does not. Each target runs under valgrind's
callgrind with counting off, is warmed up, counts while it serves the calls (`callgrind_control
-i on`, then `off` and a dump), and the counts of all its threads are summed and divided by the
calls. Targets, in front of the same upstream as `bench_mcp`: the bare pass-through, the
transport (Interlock with the tools/call pipeline swapped for a pass-through) and Interlock
(`serve`, SQLite ledger at `durability: full`, telemetry off), read-only `search_docs` calls at
concurrency 1 and 32. What it leaves out: the kernel's work (system calls, an fsync: a
side-effecting call's durable commits are mostly that) and how fast the instructions run (cache
misses). It needs valgrind (`callgrind_control` beside it); without it the table says so. All
traffic stays on 127.0.0.1; every run is bounded in calls and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from bench import bench_mcp
from bench.common import Table, bench_process, free_port, serve_argv
from bench.mcp_upstream import counted_upstream

__all__ = ["count_of", "per_call", "run"]

_TARGETS = ("bare", "transport", "interlock")
_START_S = 300.0  # a process under valgrind starts several times slower
_TOTALS = re.compile(r"^totals: (\d+)", re.MULTILINE)


def _argv(target: str, port: int, upstream: str, folder: Path) -> tuple[list[str], str]:
    """The target's command line (without valgrind) and the URL its clients post to."""
    if target == "bare":
        argv = [sys.executable, "-m", "bench.bench_mcp", "--bare", str(port), upstream]
        return argv, f"http://127.0.0.1:{port}/mcp"
    config = bench_mcp.interlock_config(folder, port, upstream)
    if target == "transport":
        argv = [sys.executable, "-m", "bench.bench_mcp", "--transport-only", "serve"]
        argv += ["--config", str(config)]
    else:
        argv = serve_argv("--config", str(config))
    return argv, f"http://127.0.0.1:{port}/mcp/up"


def _control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=60)


def count_of(dump: Path) -> int:
    """The instructions one callgrind dump counted (its last `totals:`; 0 if it has none)."""
    found = _TOTALS.findall(dump.read_text(errors="replace"))
    return int(found[-1]) if found else 0


def per_call(busy: int, idle: int, calls: int) -> float:
    """Instructions per call: those counted while the calls ran, less those the same process
    counted idle for as long (its timers and periodic work, which valgrind's slowness would
    otherwise charge to the calls many times over)."""
    return max(busy - idle, 0) / max(1, calls)


@contextlib.asynccontextmanager
async def _counted(target: str, upstream: str, folder: Path) -> AsyncIterator[tuple[str, int]]:
    port = free_port()
    argv, url = _argv(target, port, upstream, folder)
    out = folder / f"{target}.callgrind"
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    valgrind.append(f"--callgrind-out-file={out}")
    ready = f"http://127.0.0.1:{port}/healthz"
    async with bench_process([*valgrind, *argv], ready, start_timeout_s=_START_S) as proc:
        yield url, proc.pid


async def _measure(
    target: str, upstream: str, counter: str, calls: int, concurrency: int
) -> tuple[float, float]:
    """(instructions per call, the idle share of what was counted while the calls ran)."""
    with tempfile.TemporaryDirectory(prefix="interlock-bench-instructions-") as tmp:
        folder = Path(tmp)
        async with _counted(target, upstream, folder) as (url, pid):
            await bench_mcp.list_tools(url)
            await bench_mcp.drive(url, "read-only", 100, concurrency, None, counter)  # warm-up
            started = time.monotonic()
            _control("-i", "on", str(pid))
            result = await bench_mcp.drive(url, "read-only", calls, concurrency, None, counter)
            _control("-i", "off", str(pid))
            busy_s = time.monotonic() - started
            _control("-d", str(pid))  # dump 1: the calls (a dump also sets the counts to zero)
            _control("-i", "on", str(pid))
            await asyncio.sleep(busy_s)
            _control("-i", "off", str(pid))
            _control("-d", str(pid))  # dump 2: as long again, idle
        if result.errors:
            raise RuntimeError(f"{target}: {result.errors} of {calls} calls failed")
        busy, idle = (count_of(folder / f"{target}.callgrind.{n}") for n in (1, 2))
        return per_call(busy, idle, calls), idle / max(1, busy)


async def _run(quick: bool) -> list[Table]:
    calls = 200 if quick else 1000
    rows: list[list[str]] = []
    async with counted_upstream() as (upstream, counter):
        for concurrency in (1, 32):
            counts = {t: await _measure(t, upstream, counter, calls, concurrency) for t in _TARGETS}
            for target in _TARGETS:
                count, idle = counts[target]
                ratio = count / counts["bare"][0]
                cells = [f"{count:,.0f}", f"{ratio:.2f}×", f"{idle:.0%}"]
                rows.append([str(concurrency), target, *cells])
    note = (
        f"{calls} read-only tools/call per cell after a warm-up; instructions the proxy process "
        "executed in user space while serving them (valgrind callgrind, all threads), per call, "
        "less what the same process executed idle for as long right after ('idle share': its "
        "timers and periodic work - a ledger sweep, the deferred-work poll - which valgrind's "
        "slowness would otherwise charge to the calls many times over). A count, not a time: "
        "it shows what a change did when CPU time is too noisy to (what is left of the "
        "periodic work still moves it by a few per cent); it leaves out the kernel's work and "
        "how fast the instructions run. bare = the pass-through floor; transport = Interlock "
        "with the tools/call pipeline swapped for a pass-through."
    )
    return [
        Table(
            title="MCP tools/call: instructions per call (callgrind)",
            columns=["concurrency", "target", "instructions per call", "vs bare", "idle share"],
            rows=rows,
            note=note,
        )
    ]


def run(quick: bool = False) -> list[Table]:
    """Instructions per read-only tools/call of bare, transport and Interlock (needs valgrind)."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        note = "valgrind (with callgrind_control) is not installed: nothing was counted."
        return [Table("MCP tools/call: instructions per call (callgrind)", ["—"], [], note)]
    return asyncio.run(_run(quick))
