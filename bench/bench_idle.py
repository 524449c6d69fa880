"""Idle memory of `interlock serve`: resident set size at start and after a run of calls.

Targets, each its own process, measured in the same run:

- floor: a bare aiohttp pass-through (`bench.bench_http`'s): what Python, aiohttp and an empty
  application hold;
- interlock: `interlock serve` with a SQLite ledger, one MCP upstream (the test suite's real
  `MCPServer`) and one model-API upstream (the fake provider), telemetry disabled; started on a
  new ledger (migrated by a child process `serve` starts), then restarted on it;
- dependencies alone: a process that imports every module the restarted `interlock serve` had
  loaded when it stopped (the standard library's and the third-party packages' DESIGN chose:
  aiohttp, OpenTelemetry, ...), none of Interlock's own, and then serves an empty aiohttp
  application. It holds no Interlock code and no data: what is left of serve's figure once it is
  subtracted is Interlock's own. (The ledger's query toolkit, SQLAlchemy with SQLModel and
  aiosqlite, is not among them: a proxy on a SQLite ledger never loads it; nor is what validates
  the configuration, pydantic and PyYAML: serve leaves that to a child process. A last row
  imports the toolkit beside them, with pydantic, which SQLModel needs, for what a PostgreSQL
  ledger or an in-process migration adds.)

RSS is read once the process answers, then after a run of calls (MCP read-only `tools/call`s and
chat completions, JSON and streamed, at concurrency 32) and a short idle pause. Goal: Interlock
≤ 60 MB idle after the run. All traffic stays on 127.0.0.1.
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

import psutil

from bench import bench_http, bench_mcp
from bench.common import Table, bench_process, free_port, rss_mb
from bench.mcp_upstream import counted_upstream

__all__ = ["SERVE_LISTING", "run"]

_GOAL_MB = 60.0
_SETTLE_S = 1.0  # idle pause before each reading: let the loop finish closing what the run left
_CONCURRENCY = 32
_OURS = "proxy,ledger,policies,__main__,__mp_main__"  # Interlock's own (the launchers are `-c`)
_TOOLKIT = (  # the query toolkit (a PostgreSQL ledger's engines, a migration in-process)
    "pydantic",  # SQLModel's models are pydantic's
    "sqlalchemy",
    "sqlalchemy.ext.asyncio",
    "sqlalchemy.dialects.sqlite.aiosqlite",
    "sqlmodel",
    "aiosqlite",
)
_KIT = "sqlalchemy,sqlmodel,aiosqlite,greenlet,pydantic,pydantic_core"  # the toolkit's packages
# Both processes are started with `python -c` so that neither loads anything of the benchmark's.
# `interlock serve`, writing the names of the modules it has loaded to argv[1] as it exits:
SERVE_LISTING = textwrap.dedent(
    """
    import atexit, sys
    listing = sys.argv.pop(1)
    def dump():
        with open(listing, "w") as out:
            out.write("\\n".join(sys.modules))
    atexit.register(dump)
    from proxy.ops.cli import main
    sys.exit(main())
    """
)
# Import every module argv[1] names but those whose package is in argv[3] (comma-separated),
# write how many could not be imported to argv[4], then serve an empty aiohttp application on
# port argv[2] (its readiness answer).
_IMPORT_LISTED = textwrap.dedent(
    """
    import importlib, sys
    listing, port, left_out, skipped_to = sys.argv[1:5]
    left_out = set(left_out.split(","))
    skipped = 0
    for name in open(listing).read().split():
        if name.partition(".")[0] in left_out or name in sys.modules:
            continue
        try:
            importlib.import_module(name)
        except Exception:
            skipped += 1
    with open(skipped_to, "w") as out:
        out.write(str(skipped))
    from aiohttp import web
    web.run_app(web.Application(), host="127.0.0.1", port=int(port), print=None, access_log=None)
    """
)


def _config(folder: Path, port: int, mcp: str, provider: str) -> Path:
    path = folder / "interlock.yaml"
    text = f"""
        listen: "127.0.0.1:{port}"
        ledger: {{url: "sqlite:///ledger.db", durability: normal}}
        telemetry: {{enabled: false}}
        limits:
          global: {{max_running: 256, max_pending: 1024}}
          tenant: {{max_running: 64, max_pending: 256}}
        upstreams:
          up: {{mcp: "{mcp}", timeout_s: 30}}
          llm: {{http: "{provider}", kind: openai}}
    """
    path.write_text(textwrap.dedent(text))
    return path


@contextlib.asynccontextmanager
async def _provider() -> AsyncIterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "bench.bench_http", "--provider", str(port)]
    async with bench_process(argv, f"{url}/v1/models"):
        yield url


async def _load(
    proc: psutil.Process, chat_url: str, mcp_url: str | None, counter: str, calls: int
) -> None:
    bodies = (json.dumps(bench_http._CHAT).encode(), json.dumps(bench_http._STREAM).encode())
    for body in bodies:
        await bench_http._drive(chat_url, body, _CONCURRENCY, calls / 1000, proc, counter)
    if mcp_url is not None:
        await bench_mcp.list_tools(mcp_url)
        await bench_mcp.drive(mcp_url, "read-only", calls, _CONCURRENCY, proc, counter)


async def _measure(
    proc: psutil.Process, chat_url: str, mcp_url: str | None, counter: str, calls: int
) -> tuple[float, float]:
    await asyncio.sleep(_SETTLE_S)
    start = rss_mb(proc)
    await _load(proc, chat_url, mcp_url, counter, calls)
    await asyncio.sleep(_SETTLE_S)
    return start, rss_mb(proc)


async def _run(quick: bool) -> list[Table]:
    calls = 300 if quick else 1000
    rows: list[list[str]] = []
    async with counted_upstream() as (mcp, mcp_base), _provider() as provider:
        port = free_port()
        floor_argv = [sys.executable, "-m", "bench.bench_http", "--bare", str(port), provider]
        async with bench_process(floor_argv, f"http://127.0.0.1:{port}/v1/models") as floor:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            start, after = await _measure(floor, url, None, provider, calls)
            rows.append(["floor (bare aiohttp)", f"{start:.1f}", f"{after:.1f}", "—"])
        with tempfile.TemporaryDirectory(prefix="interlock-bench-idle-") as tmp:
            port = free_port()
            config = _config(Path(tmp), port, mcp, provider)
            listing = Path(tmp) / "modules.txt"
            argv = [sys.executable, "-c", SERVE_LISTING, str(listing)]
            argv += ["serve", "--config", str(config)]
            # First start (the new ledger is migrated), then a restart on the migrated ledger.
            for label in ("interlock serve (first start)", "interlock serve (restart)"):
                async with bench_process(argv, f"http://127.0.0.1:{port}/healthz") as proc:
                    base = f"http://127.0.0.1:{port}"
                    chat, mcp_url = f"{base}/http/llm/v1/chat/completions", f"{base}/mcp/up"
                    start, after = await _measure(proc, chat, mcp_url, mcp_base, calls)
                    verdict = "meets" if after <= _GOAL_MB else "misses"
                    rows.append([label, f"{start:.1f}", f"{after:.1f}", verdict])
            # The restart's modules (its exit wrote them), imported by an otherwise empty process.
            with listing.open("a") as more:  # and the query toolkit, for the last row
                more.write("\n" + "\n".join(_TOOLKIT))
            for label, left_out in (
                ("dependencies alone (what serve loaded, none of Interlock)", f"{_OURS},{_KIT}"),
                (
                    "the same and the query toolkit (SQLAlchemy, SQLModel, pydantic, aiosqlite)",
                    _OURS,
                ),
            ):
                port, skipped = free_port(), Path(tmp) / "skipped.txt"
                argv = [sys.executable, "-c", _IMPORT_LISTED, str(listing), str(port)]
                argv += [left_out, str(skipped)]
                async with bench_process(argv, f"http://127.0.0.1:{port}/") as proc:
                    await asyncio.sleep(_SETTLE_S)
                    start = rss_mb(proc)
                if (missed := int(skipped.read_text())) > 0:  # a floor short of what serve held
                    label += f" ({missed} modules would not import)"
                verdict = "under the goal" if start <= _GOAL_MB else "over the goal"
                rows.append([label, f"{start:.1f}", "—", verdict])
    note = (
        f"RSS in MB (10^6 bytes), read {_SETTLE_S:g} s after start and {_SETTLE_S:g} s after a run "
        f"of {calls} calls per kind at concurrency {_CONCURRENCY} (chat JSON, chat SSE; and MCP "
        f"read-only tools/call for Interlock). Goal: interlock serve ≤ {_GOAL_MB:g} MB after the "
        "run; the floor is a bare aiohttp pass-through measured in the same run. 'Dependencies "
        "alone' imports every module the restarted serve had loaded except Interlock's own, and "
        "holds no data: the goal is out of reach while that row is over it. The last row adds "
        "the query toolkit, which a PostgreSQL ledger (or a migration in-process) loads."
    )
    return [
        Table(
            title="Idle memory of interlock serve (RSS)",
            columns=["process", "RSS at start MB", "RSS after the run MB", f"≤ {_GOAL_MB:g} MB"],
            rows=rows,
            note=note,
        )
    ]


def run(quick: bool = False) -> list[Table]:
    """RSS of `interlock serve` at start and after a run, beside a bare aiohttp floor."""
    return asyncio.run(_run(quick))
