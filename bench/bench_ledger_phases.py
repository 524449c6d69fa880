"""Where a claim+finish pair's CPU goes in the SQLite ledger at 64 writers (durability full).

`bench_ledger` gives the rate and the CPU per pair. This splits that CPU by thread and, on the
writer's thread, by step of a batch: BEGIN IMMEDIATE, the database's clock, reading the rows the
batch names, the operations' decisions, writing the rows (flush), COMMIT, and the rest of the
job. Each step is timed with `time.thread_time_ns` around the ledger's own functions
(`ledger.sqlite_sql`'s `begin`, `database_now`, `load`, `flush`, `commit`, `ledger.transactions`'
`decide`, and `SQLiteTransactions._transaction` for the whole job), wrapped for the measurement
and restored after it; the event loop's share is its own thread's CPU. A step the ledger no
longer calls through those names fails the benchmark instead of printing a zero.

The 64 writers are the ledger bench's: each claims a fresh key, then finishes it, in a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from bench.bench_ledger import _pairs, _sqlite_database, fresh_keys
from bench.common import Table
from ledger import LedgerStore, sqlite_sql, sqlite_transactions, transactions
from policies.model import LedgerSettings

__all__ = ["PhaseRound", "measure", "run"]

_WRITERS = 64
_STEPS: tuple[tuple[Any, str, str, str], ...] = (
    # (where the ledger looks it up, its name there, the step, what the table calls it)
    (sqlite_sql, "begin", "begin", "BEGIN IMMEDIATE"),
    (sqlite_sql, "database_now", "database_now", "the database's clock"),
    (sqlite_sql, "load", "load", "read the rows the batch names"),
    (transactions, "decide", "decide", "the operations' decisions"),
    (sqlite_sql, "flush", "flush", "write rows and history (flush)"),
    (sqlite_sql, "commit", "commit", "COMMIT (fsync)"),
)
JOB = "job"
"""The writer thread's whole job for one batch (`SQLiteTransactions._transaction`)."""
_WRAPPED = (*_STEPS, (sqlite_transactions.SQLiteTransactions, "_transaction", JOB, ""))


@dataclass(frozen=True)
class PhaseRound:
    """One measured round: pairs, wall time, and CPU nanoseconds per step and thread."""

    pairs: int
    wall_s: float
    process_ns: int
    loop_ns: int
    steps_ns: dict[str, int]
    calls: dict[str, int]

    @property
    def pairs_per_s(self) -> float:
        return self.pairs / self.wall_s if self.wall_s else 0.0

    def per_pair_us(self, ns: int) -> float:
        return ns / 1e3 / max(1, self.pairs)


class _Timer:
    """CPU time of the calling thread spent in each wrapped function, and how often it ran."""

    def __init__(self) -> None:
        self.ns: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time_ns()
            try:
                return fn(*args, **kwargs)
            finally:
                self.ns[name] += time.thread_time_ns() - started
                self.calls[name] += 1

        return timed


@contextlib.contextmanager
def _timed_ledger(timer: _Timer) -> Iterator[None]:
    """Wrap the ledger's steps for the block; the originals are back afterwards."""
    originals = [(owner, name, getattr(owner, name)) for owner, name, _, _ in _WRAPPED]
    try:
        for owner, name, step, _ in _WRAPPED:
            setattr(owner, name, timer.wrap(step, getattr(owner, name)))
        yield
    finally:
        for owner, name, fn in originals:
            setattr(owner, name, fn)


async def measure(seconds: float, rounds: int) -> list[PhaseRound]:
    """`rounds` rounds of `seconds` each, after a warm-up, on one fresh SQLite ledger."""
    timer = _Timer()
    results: list[PhaseRound] = []
    async with _sqlite_database() as url:
        settings = LedgerSettings(url=url, durability="full", group_commit=True)
        with _timed_ledger(timer):
            store = await LedgerStore.open(settings, owner="bench")
            try:
                keys = fresh_keys()
                await _pairs(store, keys, _WRITERS, time.perf_counter() + min(0.3, seconds))
                for _ in range(rounds):
                    timer.ns.clear()
                    timer.calls.clear()
                    cpu, loop = time.process_time_ns(), time.thread_time_ns()
                    started = time.perf_counter()
                    pairs = await _pairs(store, keys, _WRITERS, started + seconds)
                    wall = time.perf_counter() - started
                    cpu, loop = time.process_time_ns() - cpu, time.thread_time_ns() - loop
                    results.append(
                        PhaseRound(pairs, wall, cpu, loop, dict(timer.ns), dict(timer.calls))
                    )
            finally:
                await store.close()
    steps = [step for _, _, step, _ in _WRAPPED]
    missing = [step for step in steps if not any(r.calls.get(step) for r in results)]
    if missing:
        raise RuntimeError(
            f"the ledger never called {', '.join(missing)} through the names this benchmark "
            "wraps: bench/bench_ledger_phases.py no longer matches ledger/sqlite_transactions.py"
        )
    return results


def _table(best: PhaseRound, rounds: int) -> Table:
    table = Table(
        title=f"ledger: where a claim+finish pair's CPU goes (SQLite FULL, {_WRITERS} writers)",
        columns=["thread", "step", "CPU µs per pair", "share of the pair"],
    )
    total = best.process_ns

    def row(thread: str, step: str, ns: int) -> None:
        share = f"{ns / total:.0%}" if total else "-"
        table.rows.append([thread, step, f"{best.per_pair_us(ns):.1f}", share])

    steps = best.steps_ns
    job = steps.get(JOB, 0)
    for _, _, step, label in _STEPS:
        row("ledger writer", label, steps.get(step, 0))
    timed = sum(steps.get(step, 0) for _, _, step, _ in _STEPS)
    row("ledger writer", "the rest of the job", job - timed)
    row("event loop", "the 64 callers, the group-commit task, futures", best.loop_ns)
    row("(rest)", "hand-offs between batches, other threads", total - job - best.loop_ns)
    row("process", "all", total)
    table.note = (
        f"The least disturbed of {rounds} round(s): {best.pairs:,} pairs in {best.wall_s:.1f} s "
        f"({best.pairs_per_s:,.0f} pairs/s, {best.per_pair_us(total):.0f} µs of CPU per pair). "
        "Each step is the writer thread's CPU time inside the ledger function that does it "
        f"(ledger.sqlite_sql, ledger.transactions); {best.calls.get(JOB, 0):,} batches, "
        f"{2 * best.pairs / max(1, best.calls.get(JOB, 0)):.1f} operations each (a claim or a "
        "finish), one COMMIT per batch. Both threads hold the GIL for their "
        "Python, so the rate is bounded by about 1 / (CPU per pair); compare the ledger "
        "table's floor row 'bare SQL, 64 pairs per commit' for what SQLite itself costs."
    )
    return table


def run(quick: bool = False) -> list[Table]:
    """Split the SQLite ledger's CPU per pair at 64 writers by thread and by step."""
    rounds = 1 if quick else 3
    results = asyncio.run(measure(0.5 if quick else 3.0, rounds))
    return [_table(max(results, key=lambda r: r.pairs_per_s), rounds)]
