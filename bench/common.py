"""Shared shapes for the benchmarks: every `bench/bench_*.py` returns a list of tables."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
from aiohttp import web

__all__ = [
    "CONNECTIONS_PATH",
    "ROOT",
    "RoundRatios",
    "Table",
    "bench_process",
    "connections_seen",
    "count_connections",
    "cpu_s",
    "free_port",
    "round_ratios",
    "rss_mb",
]


@dataclass
class Table:
    """One printed table of a benchmark."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""


@dataclass(frozen=True)
class RoundRatios:
    """One target's ratio to its baseline in each round, as a table cell and a verdict."""

    ratios: list[float]
    goal: float

    @property
    def text(self) -> str:
        if not self.ratios:
            return "—"
        low, high = min(self.ratios), max(self.ratios)
        return f"{low:.2f}×" if len(self.ratios) == 1 else f"{low:.2f}–{high:.2f}×"

    @property
    def verdict(self) -> str:
        met = sum(ratio <= self.goal for ratio in self.ratios)
        return f"≤{self.goal:g}× in {met} of {len(self.ratios)} rounds"


def round_ratios(
    mine: list[float | None], baseline: list[float | None], *, goal: float
) -> RoundRatios:
    """`mine[i] / baseline[i]` for each round `i` both were measured in (the machine's load
    changes between rounds, so a ratio only pairs figures taken side by side)."""
    ratios = [m / b for m, b in zip(mine, baseline, strict=False) if m is not None and b]
    return RoundRatios(ratios, goal)


_START_TIMEOUT_S = 30.0
ROOT = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def bench_process(
    argv: list[str], ready_url: str, *, start_timeout_s: float = _START_TIMEOUT_S
) -> AsyncIterator[psutil.Process]:
    """A child process (run from the repository root, without the caller's INTERLOCK_* settings),
    yielded once `ready_url` answers below 500 (within `start_timeout_s`); stopped with SIGTERM,
    then SIGKILL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env["INTERLOCK_LOG_LEVEL"] = "ERROR"
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        await _wait_ready(ready_url, proc, start_timeout_s)
        yield psutil.Process(proc.pid)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await asyncio.wait_for(proc.wait(), 5)


async def _wait_ready(url: str, proc: asyncio.subprocess.Process, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                async with session.get(url) as response:
                    if response.status < 500:
                        return
            await asyncio.sleep(0.1)  # polling a starting process, bounded by the deadline
    raise RuntimeError(f"{url} did not become ready within {timeout_s:g} s")


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (every process the benchmarks start listens on loopback)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_SERVE = "import sys; from proxy.ops.cli import main; sys.exit(main())"


def serve_argv(*args: str) -> list[str]:
    """The command line of `interlock serve ARGS` from this checkout (no installed script)."""
    return [sys.executable, "-c", _SERVE, "serve", *args]


def _task_cpu_ns(task: Path) -> int:
    """CPU nanoseconds of one thread (`/proc/PID/task/TID`), from its schedstat."""
    return int((task / "schedstat").read_text().split()[0])


def cpu_s(proc: psutil.Process) -> float:
    """CPU seconds used by all threads of `proc`: nanosecond schedstat on Linux, else psutil.

    psutil's user+system times tick at 10 ms, too coarse for a few hundred calls.
    """
    total_ns = 0
    try:
        for task in Path(f"/proc/{proc.pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total_ns += _task_cpu_ns(task)
    except OSError:
        times = proc.cpu_times()
        return float(times.user + times.system)
    return total_ns / 1e9


def main_thread_cpu_s(proc: psutil.Process) -> float | None:
    """CPU seconds of `proc`'s main thread alone (where `interlock serve` runs its event loop;
    the rest is its other threads: the ledger's writer, the span exporter). None off Linux."""
    try:
        return _task_cpu_ns(Path(f"/proc/{proc.pid}/task/{proc.pid}")) / 1e9
    except OSError:
        return None


def rss_mb(proc: psutil.Process) -> float:
    """Resident memory of `proc` in MB (10^6 bytes)."""
    return float(proc.memory_info().rss) / 1e6


CONNECTIONS_PATH = "/bench/connections"


def count_connections(app: web.Application) -> None:
    """Make an upstream's aiohttp `app` count the client connections that sent it requests.

    `GET /bench/connections` answers `{"connections": n}`: distinct client (address, port) pairs
    seen so far. A benchmark reads it before and after a cell; the difference is how many fresh
    TCP connections the target opened to this upstream (keep-alive reuse shows as few).
    """
    peers: set[object] = set()

    @web.middleware
    async def note(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path != CONNECTIONS_PATH and request.transport is not None:
            peers.add(request.transport.get_extra_info("peername"))
        response: web.StreamResponse = await handler(request)
        return response

    async def answer(_request: web.Request) -> web.Response:
        return web.json_response({"connections": len(peers)})

    app.middlewares.append(note)
    app.router.add_get(CONNECTIONS_PATH, answer)


async def connections_seen(base_url: str) -> int:
    """The upstream's count of distinct client connections so far (see `count_connections`)."""
    timeout = aiohttp.ClientTimeout(total=5)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(base_url + CONNECTIONS_PATH) as answer,
    ):
        return int((await answer.json())["connections"])
