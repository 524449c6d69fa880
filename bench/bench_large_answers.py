"""Large MCP answers through Interlock vs the bare pass-through: what relaying costs per byte.

A read-only `tools/call` whose answer is large: 1 MiB of text (`big_text`: 2.5 MB on the wire,
the SDK sends it twice, as `content` and as `structuredContent`, its non-ASCII escaped), or
10,000 structured rows (`rows`: about 1.7 MB, as `structuredContent` and as indented JSON text).
The bare pass-through forwards the bytes; Interlock reads the answer once, to its envelope
(whether it is a result or an error is the call's outcome; the tool's output is scanned, not
parsed) and relays the upstream's own bytes, so what it adds over bare is that scan, growing
with the answer's size and its shape (many small values cost more than one long string). Same
processes and CPU accounting as `bench_mcp`: the proxy process's CPU only, best of interleaved
rounds.
"""

from __future__ import annotations

import asyncio
import statistics

from bench.bench_mcp import Result, bare_proxy, drive, interlock_proxy, list_tools
from bench.common import Table
from bench.mcp_upstream import counted_upstream

__all__ = ["run"]

_KINDS = ("text 1 MiB", "10k rows")
_CONCURRENCY = (1, 8)


async def _run(quick: bool) -> list[Table]:
    calls = 10 if quick else 30
    rounds = 1 if quick else 2
    results: dict[tuple[str, str, int], Result] = {}
    async with counted_upstream() as (upstream, counter):
        for _ in range(rounds):
            for target in ("bare", "interlock"):
                opened = bare_proxy(upstream) if target == "bare" else interlock_proxy(upstream)
                async with opened as (url, proc):
                    await list_tools(url)
                    for kind in _KINDS:
                        for concurrency in _CONCURRENCY:
                            await drive(url, kind, 2 * concurrency, concurrency, proc, counter)
                            got = await drive(url, kind, calls, concurrency, proc, counter)
                            cell = (target, kind, concurrency)
                            best = results.get(cell)
                            if best is None or (got.cpu_s or 0.0) < (best.cpu_s or 0.0):
                                results[cell] = got
    return [_table(results, calls, rounds)]


def _table(results: dict[tuple[str, str, int], Result], calls: int, rounds: int) -> Table:
    rows: list[list[str]] = []
    for kind in _KINDS:
        for concurrency in _CONCURRENCY:
            bare = results[("bare", kind, concurrency)].cpu_per_call_us
            for target in ("bare", "interlock"):
                r = results[(target, kind, concurrency)]
                cpu = r.cpu_per_call_us
                extra = f"{cpu - bare:.0f}" if cpu is not None and bare is not None else "—"
                ratio = f"{cpu / bare:.2f}×" if cpu is not None and bare else "—"
                rows.append(
                    [
                        kind,
                        str(concurrency),
                        target,
                        str(r.calls),
                        str(r.errors),
                        "—" if cpu is None else f"{cpu:.0f}",
                        extra if target != "bare" else "",
                        ratio,
                        f"{statistics.median(r.latencies_s) * 1000:.2f}",
                    ]
                )
    note = (
        f"{calls} stateless (2026-07-28) read-only tools/call per cell after a warm-up, best of "
        f"{rounds} interleaved round(s); CPU is the proxy process's (all threads). text 1 MiB = "
        "big_text (2.5 MB on the wire); 10k rows = rows(10000) (1.7 MB: structuredContent and its "
        "text copy). "
        "'µs over bare' is what Interlock adds per call: for an answer it only relays, one read "
        "of its envelope (a scan that checks the whole answer is JSON)."
    )
    return Table(
        title="MCP large answers: Interlock vs bare pass-through",
        columns=[
            "answer",
            "concurrency",
            "target",
            "calls",
            "errors",
            "CPU µs/call",
            "µs over bare",
            "vs bare",
            "p50 ms",
        ],
        rows=rows,
        note=note,
    )


def run(quick: bool = False) -> list[Table]:
    """Proxy CPU per call for large read-only answers, Interlock against bare."""
    return asyncio.run(_run(quick))
