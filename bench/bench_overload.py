"""Overload: offered load 10× an MCP upstream's capacity; does useful work still get done?

One side-effecting tool of 50 ms (the test suite's real `MCPServer`, its `hold` tool, as a
subprocess) behind `interlock serve` with `max_running: 4, max_pending: 8` on that upstream and a
SQLite ledger at `durability: full`. Capacity is calibrated in the same run: 4 closed-loop clients
(never refused) through Interlock give completions/s = max_running / measured service time.

Then 48 clients offer 10× that rate for 30 s (`--quick`: 8 s), paced as one schedule shared by all
(a client whose call is still running does not send; no catch-up bursts). They ignore
`retry_after`: a refused client sends again at its next slot, every send with a new idempotency
key and new arguments. 40 clients are `interactive` (refused at once when no slot is free), 8 are
`background` (they queue, up to `max_pending`). Reported: goodput (completions/s against the
calibrated capacity), refusal latency p50/p99 seen by the client, latency of completed calls per
class and the queue wait it implies (latency − calibrated service time), Interlock's RSS before
and after the overload, its CPU, and that the refused calls never ran (the upstream's started
tags against the refused ones: disjoint) and were recorded `rejected` (read from the ledger file
after a graceful stop). Goals: goodput ≥ 90 %, refusal p99 ≤ 5 ms, RSS flat ±10 %.
All traffic stays on 127.0.0.1; every phase is bounded in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import textwrap
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import ClientSession, ClientTimeout, TCPConnector

from bench.bench_mcp import _cpu_s, _free_port
from bench.common import Table, bench_process

__all__ = ["run"]

_MODERN = "2026-07-28"
_ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": _MODERN,
    "io.modelcontextprotocol/clientInfo": {"name": "bench-overload", "version": "1"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": _MODERN,
    "Mcp-Method": "tools/call",
    "Mcp-Name": "hold",
}
_SERVICE_S = 0.05
_MAX_RUNNING = 4
_CLIENTS = 48
_BACKGROUND = 8  # of the clients; the rest are interactive
_OVERLOAD = 10.0
_CALL_TIMEOUT_S = 60.0
_REFUSED = -32050


@dataclass
class Outcomes:
    """What the clients saw, by outcome and class."""

    sent: int = 0
    completed: dict[str, list[float]] = field(default_factory=dict)  # class → latencies
    refused_latency_s: list[float] = field(default_factory=list)
    refused_tags: set[str] = field(default_factory=set)
    completed_tags: set[str] = field(default_factory=set)
    other: dict[str, int] = field(default_factory=dict)

    @property
    def completions(self) -> int:
        return sum(len(v) for v in self.completed.values())


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


_tags = itertools.count(1)


async def _send(session: ClientSession, url: str, work_class: str, seen: Outcomes) -> None:
    number = next(_tags)
    tag = f"t{number}"
    meta = dict(_ENVELOPE)
    meta["interlock/idempotency-key"] = f"k-{number}"
    meta["interlock/class"] = work_class
    body = {
        "jsonrpc": "2.0",
        "id": number,
        "method": "tools/call",
        "params": {"name": "hold", "arguments": {"seconds": _SERVICE_S, "tag": tag}, "_meta": meta},
    }
    seen.sent += 1
    started = time.perf_counter()
    try:
        async with session.post(url, data=json.dumps(body), headers=_HEADERS) as response:
            data = await response.read()
            status = response.status
    except (TimeoutError, OSError) as exc:
        kind = type(exc).__name__
        seen.other[kind] = seen.other.get(kind, 0) + 1
        return
    elapsed = time.perf_counter() - started
    kind = _kind(status, data)
    if kind == "ok":
        seen.completed.setdefault(work_class, []).append(elapsed)
        seen.completed_tags.add(tag)
    elif kind == "refused":
        seen.refused_latency_s.append(elapsed)
        seen.refused_tags.add(tag)
    else:
        seen.other[kind] = seen.other.get(kind, 0) + 1


def _kind(status: int, data: bytes) -> str:
    if status != 200:
        return f"http {status}"
    text = data.decode(errors="replace")
    if text.startswith(("event:", ":")):
        text = next((line[5:] for line in text.splitlines() if line.startswith("data:")), "{}")
    try:
        message = json.loads(text)
    except ValueError:
        return "unparsed"
    if "result" in message and not message["result"].get("isError"):
        return "ok"
    code = message.get("error", {}).get("code")
    return "refused" if code == _REFUSED else f"error {code}"


async def _closed_loop(url: str, clients: int, duration_s: float) -> Outcomes:
    """`clients` callers, each sending its next call when the last one is answered."""
    seen = Outcomes()
    end = time.monotonic() + duration_s

    async def client(session: ClientSession) -> None:
        while time.monotonic() < end:
            await _send(session, url, "interactive", seen)

    async with _session(clients) as session:
        await asyncio.gather(*(client(session) for _ in range(clients)))
    return seen


async def _paced(url: str, rate_per_s: float, duration_s: float) -> tuple[Outcomes, float]:
    """48 clients sharing one send schedule at `rate_per_s`; returns what they saw and the wall
    time until the last answer."""
    seen = Outcomes()
    started = time.monotonic()
    end = started + duration_s
    gap = 1.0 / rate_per_s
    next_slot = started

    async def client(session: ClientSession, work_class: str) -> None:
        nonlocal next_slot
        while True:
            now = time.monotonic()
            slot = next_slot = max(next_slot, now) + gap  # no catch-up burst after a lag
            if slot >= end:
                return
            if slot > now:
                await asyncio.sleep(slot - now)
            await _send(session, url, work_class, seen)

    classes = ["background"] * _BACKGROUND + ["interactive"] * (_CLIENTS - _BACKGROUND)
    async with _session(_CLIENTS) as session:
        await asyncio.gather(*(client(session, c) for c in classes))
    return seen, time.monotonic() - started


@contextlib.asynccontextmanager
async def _session(limit: int) -> AsyncIterator[ClientSession]:
    connector = TCPConnector(limit=limit)
    timeout = ClientTimeout(total=_CALL_TIMEOUT_S)
    async with ClientSession(connector=connector, timeout=timeout) as session:
        yield session


@contextlib.contextmanager
def _upstream() -> Iterator[Any]:
    from tests.integration.mcp_servers import running_upstream

    with running_upstream() as upstream:
        yield upstream


def _config(folder: Path, port: int, upstream_url: str) -> Path:
    path = folder / "interlock.yaml"
    text = f"""
        listen: "127.0.0.1:{port}"
        ledger: {{url: "sqlite:///ledger.db", durability: full}}
        telemetry: {{enabled: false}}
        limits:
          global: {{max_running: 256, max_pending: 1024}}
          tenant: {{max_running: 256, max_pending: 1024}}
        upstreams:
          up:
            mcp: "{upstream_url}"
            timeout_s: 30
            limits: {{max_running: {_MAX_RUNNING}, max_pending: 8}}
        tools:
          - match: "up/hold"
            side_effect: true
    """
    path.write_text(textwrap.dedent(text))
    return path


@dataclass
class Measured:
    calibration: Outcomes
    calibration_s: float
    overload: Outcomes
    overload_s: float
    rss_start: int
    rss_end: int
    cpu_s: float
    executed_tags: set[str]
    upstream_max_running: int
    rejected_rows: int
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]


async def _measure(quick: bool) -> Measured:
    calibrate_s = 3.0 if quick else 6.0
    overload_s = 8.0 if quick else 30.0
    load_before = os.getloadavg()
    with _upstream() as upstream, tempfile.TemporaryDirectory(prefix="bench-overload-") as tmp:
        port = _free_port()
        config = _config(Path(tmp), port, upstream.url)
        program = "import sys; from proxy.ops.cli import main; sys.exit(main())"
        args = [sys.executable, "-c", program, "serve", "--config", str(config)]
        url = f"http://127.0.0.1:{port}/mcp/up"
        async with bench_process(args, f"http://127.0.0.1:{port}/healthz") as proc:
            await _closed_loop(url, _MAX_RUNNING, 1.0)  # warm-up
            calibration = await _closed_loop(url, _MAX_RUNNING, calibrate_s)
            capacity = calibration.completions / calibrate_s
            rss_start = proc.memory_info().rss
            cpu_before = _cpu_s(proc)
            overload, wall = await _paced(url, _OVERLOAD * capacity, overload_s)
            cpu = _cpu_s(proc) - cpu_before
            rss_end = proc.memory_info().rss
            stats = upstream.stats()
        # stopped gracefully (SIGTERM): the refusals' records are written before the ledger closes
        rejected = _rejected_rows(Path(tmp) / "ledger.db")
    return Measured(
        calibration,
        calibrate_s,
        overload,
        wall,
        rss_start,
        rss_end,
        cpu,
        set(stats["started"]),
        int(stats["max_running"]),
        rejected,
        load_before,
        os.getloadavg(),
    )


def _rejected_rows(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        row = db.execute("SELECT count(*) FROM ledger_entries WHERE state = 'rejected'").fetchone()
    return int(row[0])


def _tables(m: Measured) -> list[Table]:
    calib = m.calibration
    calib_latencies = calib.completed.get("interactive", [])
    service_s = statistics.mean(calib_latencies) if calib_latencies else float("nan")
    capacity = calib.completions / m.calibration_s
    seen = m.overload
    goodput = seen.completions / m.overload_s
    refused = seen.refused_latency_s
    rss_change = (m.rss_end - m.rss_start) / m.rss_start * 100
    overlap = seen.refused_tags & m.executed_tags
    summary = Table(
        title="Overload: 10× offered load on a 50 ms side-effecting MCP tool (max_running 4)",
        columns=["figure", "measured", "goal", "met"],
    )
    rows = [
        ["capacity (calibrated, 4 closed-loop clients)", f"{capacity:.1f} calls/s", "", ""],
        ["service time through Interlock (mean)", f"{service_s * 1000:.1f} ms", "", ""],
        [
            "offered (sent/s) vs capacity",
            f"{seen.sent / m.overload_s:.0f}/s = {seen.sent / m.overload_s / capacity:.1f}×",
            f"{_OVERLOAD:.0f}×",
            "",
        ],
        [
            "goodput (completions/s) vs capacity",
            f"{goodput:.1f}/s = {goodput / capacity * 100:.1f} %",
            "≥ 90 %",
            _yes(goodput / capacity >= 0.9),
        ],
        ["refusal latency p50", f"{_pct(refused, 0.5) * 1000:.2f} ms", "", ""],
        [
            "refusal latency p99",
            f"{_pct(refused, 0.99) * 1000:.2f} ms",
            "≤ 5 ms",
            _yes(_pct(refused, 0.99) <= 0.005),
        ],
        [
            "Interlock RSS start → end",
            f"{m.rss_start / 2**20:.1f} → {m.rss_end / 2**20:.1f} MiB ({rss_change:+.1f} %)",
            "±10 %",
            _yes(abs(rss_change) <= 10),
        ],
        [
            "Interlock CPU during the overload",
            f"{m.cpu_s:.1f} s of {m.overload_s:.1f} s "
            f"({m.cpu_s / max(1, seen.sent) * 1e6:.0f} µs per call sent)",
            "",
            "",
        ],
        [
            "refused calls that executed (refused ∩ upstream started)",
            f"{len(overlap)} of {len(seen.refused_tags)} refused ({len(m.executed_tags)} executed)",
            "0",
            _yes(not overlap),
        ],
        [
            "rejected records in the ledger after a graceful stop",
            f"{m.rejected_rows} (refused: {len(seen.refused_tags)})",
            "= refused",
            _yes(m.rejected_rows == len(seen.refused_tags)),
        ],
        ["upstream concurrency seen by the upstream (max)", str(m.upstream_max_running), "≤ 4", ""],
        ["other answers", _others(seen.other), "", ""],
    ]
    summary.rows = rows
    summary.note = (
        f"Overload {m.overload_s:.1f} s, {_CLIENTS} clients ({_BACKGROUND} background) ignoring "
        "retry_after, every send a new key and arguments; SQLite ledger, durability full. "
        f"Load average before {_load(m.load_before)}, after {_load(m.load_after)} (shared machine: "
        "the load generator runs on the same cores)."
    )
    per_class = Table(
        title="Completed calls per class during the overload",
        columns=["class", "completed", "latency p50 ms", "latency p99 ms", "queue wait p99 ms"],
    )
    for work_class in ("interactive", "background"):
        latencies = seen.completed.get(work_class, [])
        wait_p99 = max(0.0, _pct(latencies, 0.99) - service_s) * 1000 if latencies else 0.0
        per_class.rows.append(
            [
                work_class,
                str(len(latencies)),
                f"{_pct(latencies, 0.5) * 1000:.1f}",
                f"{_pct(latencies, 0.99) * 1000:.1f}",
                f"{wait_p99:.1f}",
            ]
        )
    per_class.note = (
        "Queue wait is inferred: a completed call's latency minus the calibrated service time "
        "(interactive work never queues: patience 0; background waits up to max_pending 8)."
    )
    return [summary, per_class]


def _yes(ok: bool) -> str:
    return "yes" if ok else "NO"


def _others(other: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(other.items())) or "none"


def _load(values: tuple[float, float, float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def run(quick: bool = False) -> list[Table]:
    """Goodput, refusal latency, memory and refusal correctness under 10× overload."""
    return _tables(asyncio.run(_measure(quick)))
