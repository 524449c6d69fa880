"""Shared shapes for the benchmarks: every `bench/bench_*.py` returns a list of tables."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import psutil

__all__ = ["ROOT", "Table", "bench_process"]


@dataclass
class Table:
    """One printed table of a benchmark."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    note: str = ""


_START_TIMEOUT_S = 30.0
ROOT = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def bench_process(argv: list[str], ready_url: str) -> AsyncIterator[psutil.Process]:
    """A child process (run from the repository root, without the caller's INTERLOCK_* settings),
    yielded once `ready_url` answers below 500; stopped with SIGTERM, then SIGKILL."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INTERLOCK_")}
    env["INTERLOCK_LOG_LEVEL"] = "ERROR"
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        await _wait_ready(ready_url, proc)
        yield psutil.Process(proc.pid)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await asyncio.wait_for(proc.wait(), 5)


async def _wait_ready(url: str, proc: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
            with contextlib.suppress(OSError, asyncio.TimeoutError):
                async with session.get(url) as response:
                    if response.status < 500:
                        return
            await asyncio.sleep(0.1)  # polling a starting process, bounded by the deadline
    raise RuntimeError(f"{url} did not become ready within {_START_TIMEOUT_S} s")
