"""Ledger write throughput: begin (claim) + finish pairs per second, and the floor under a pair.

Each writer claims a fresh key, then finishes it with a small outcome, as fast as it can, for a
fixed time. Configurations: SQLite with `synchronous=FULL` and one commit per write (the
baseline, `max_batch=1`), SQLite FULL with group commit, SQLite NORMAL with group commit, and
PostgreSQL with and without group commit; each at 1 and 64 concurrent writers, on a fresh database
(a temporary folder, or a temporary database on `INTERLOCK_BENCH_PG_URL` / `INTERLOCK_TEST_PG_URL`,
dropped afterwards). The 64-writer cells, where the goals are, run in three rounds interleaved
across the configurations; the table shows the best round and the range. Everything stays on this
machine.

Beside the rate, the benchmark process's CPU per pair at 1 and 64 writers (`time.process_time`: the
SQLite writer thread and the calling tasks), and the local PostgreSQL server's (its processes in
/proc): what the ledger costs a proxied call, against the floor of a bare aiohttp pass-through
(about 500-1,000 µs CPU per call).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import asyncpg
from sqlalchemy.engine import make_url

from bench.common import Table
from bench.ledger_floor import measure_floor
from ledger import ClaimRequest, LedgerStore, LedgerUnavailable
from policies.model import LedgerSettings

__all__ = ["rate_goal", "run"]

_WRITERS = (1, 64)
_DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True, slots=True)
class _Config:
    label: str
    backend: str
    durability: Literal["full", "normal"]
    group_commit: bool
    goal: float | None = None
    """Pairs per second wanted at 64 writers (issue 13), if any."""


_CONFIGS = (
    _Config("SQLite FULL, one commit per write", "sqlite", "full", False),
    _Config("SQLite FULL, group commit", "sqlite", "full", True, goal=10_000),
    _Config("SQLite NORMAL, group commit", "sqlite", "normal", True),
    _Config("PostgreSQL, one commit per write", "postgresql", "full", False),
    _Config("PostgreSQL, group commit", "postgresql", "full", True, goal=5_000),
)
_BASELINES = {  # each group-commit configuration against one commit per write, same backend
    _CONFIGS[1].label: _CONFIGS[0].label,
    _CONFIGS[2].label: _CONFIGS[0].label,
    _CONFIGS[4].label: _CONFIGS[3].label,
}


@dataclass(frozen=True, slots=True)
class _Result:
    pairs_per_s: float
    mean_batch: float
    cpu_us_per_pair: float
    """This process's CPU (all threads) per pair, in microseconds."""
    server_us_per_pair: float | None = None
    """The local PostgreSQL server's CPU (all its processes) per pair, when it can be read."""


def _pg_server() -> str:
    url = os.environ.get("INTERLOCK_BENCH_PG_URL") or os.environ.get("INTERLOCK_TEST_PG_URL")
    return make_url(url or _DEFAULT_PG).set(drivername="postgresql").render_as_string(False)


@asynccontextmanager
async def _sqlite_database() -> AsyncIterator[str]:
    with tempfile.TemporaryDirectory(prefix="interlock-bench-") as folder:
        yield f"sqlite:///{folder}/ledger.db"


@asynccontextmanager
async def _pg_database() -> AsyncIterator[str]:
    """A temporary database on the PostgreSQL server, dropped afterwards."""
    server = _pg_server()
    name = f"interlock_bench_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(server, timeout=5)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield make_url(server).set(database=name).render_as_string(False)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def _measure(config: _Config, url: str, writers: int, seconds: float) -> _Result:
    """Pairs per second on `url`, with keys no other measurement uses."""
    settings = LedgerSettings(
        url=url, durability=config.durability, group_commit=config.group_commit
    )
    store = await LedgerStore.open(settings, owner="bench")
    try:
        keys = fresh_keys()
        await _pairs(store, keys, writers, time.perf_counter() + min(0.3, seconds / 4))  # warm-up
        before = store.writer_stats
        server_before = _server_cpu_s() if config.backend == "postgresql" else None
        cpu_before = time.process_time()
        started = time.perf_counter()
        pairs = await _pairs(store, keys, writers, started + seconds)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu_before
        server_after = _server_cpu_s() if server_before is not None else None
        after = store.writer_stats
    finally:
        await store.close()
    batches = max(1, after.batches - before.batches)
    pairs = max(1, pairs)
    mean_batch = (after.operations - before.operations) / batches
    server = None
    if server_before is not None and server_after is not None:
        server = (server_after - server_before) / pairs * 1e6
    return _Result(pairs / elapsed, mean_batch, cpu / pairs * 1e6, server)


def _server_cpu_s() -> float | None:
    """CPU seconds used so far by every process named postgres on this machine (None when
    there is none to read: the server runs elsewhere)."""
    total, seen = 0, False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        if name.startswith("postgres"):
            seen = True
            utime, stime = fields.split()[11:13]
            total += int(utime) + int(stime)
    return total / os.sysconf("SC_CLK_TCK") if seen else None


def fresh_keys() -> Iterator[str]:
    """Idempotency keys no other measurement uses."""
    return (f"{secrets.token_hex(4)}-{n}" for n in itertools.count())


async def _pairs(store: LedgerStore, keys: Iterator[str], writers: int, deadline: float) -> int:
    async def writer() -> int:
        done = 0
        while time.perf_counter() < deadline:
            req = ClaimRequest("bench", "mail", "send", next(keys), "explicit", "f" * 64)
            claimed = await store.claim(req)
            entry = claimed.entry
            await store.finish(entry.id, entry.fencing_token, state="succeeded", outcome=b"ok")
            done += 1
        return done

    return sum(await asyncio.gather(*(writer() for _ in range(writers))))


async def _run(seconds: float, rounds: int) -> list[Table]:
    # (configuration, writers) -> one result per round
    results: dict[tuple[str, int], list[_Result | str]] = {}
    async with contextlib.AsyncExitStack() as databases:
        pg_url: str | None = None

        async def database(config: _Config) -> str:
            nonlocal pg_url
            if config.backend == "sqlite":  # a fresh file for every cell
                return await databases.enter_async_context(_sqlite_database())
            if pg_url is None:  # one temporary database for every PostgreSQL cell
                pg_url = await databases.enter_async_context(_pg_database())
            return pg_url

        for config, writers in _schedule(rounds):
            try:
                got: _Result | str = await _measure(
                    config, await database(config), writers, seconds
                )
            except (OSError, asyncpg.PostgresError, LedgerUnavailable) as error:
                got = f"unavailable ({type(error).__name__})"
            results.setdefault((config.label, writers), []).append(got)
    table = Table(
        title="ledger: claim + finish pairs per second (each pair = 2 durable writes)",
        columns=["configuration", *(f"{w} writer{'s' * (w > 1)}" for w in _WRITERS),
                 "64 writers, each round", "vs one commit per write", "goal at 64",
                 "CPU per pair at 1 writer", "CPU per pair at 64", "mean batch at 64"],
    )  # fmt: skip
    for config in _CONFIGS:
        cells = [_best(results[config.label, w]) for w in _WRITERS]
        at64 = cells[-1]
        rates = [
            r.pairs_per_s for r in results[config.label, _WRITERS[-1]] if isinstance(r, _Result)
        ]
        base_label = _BASELINES.get(config.label)
        base = _best(results[base_label, _WRITERS[-1]]) if base_label else None
        ratio = "-"
        if isinstance(at64, _Result) and isinstance(base, _Result):
            ratio = f"{at64.pairs_per_s / base.pairs_per_s:.1f}×"
        table.rows.append(
            [
                config.label,
                *(f"{c.pairs_per_s:,.0f}" if isinstance(c, _Result) else c for c in cells),
                f"{min(rates):,.0f}–{max(rates):,.0f}" if len(rates) > 1 else "-",
                ratio,
                "-" if config.goal is None else rate_goal(rates, config.goal),
                _cpu_cell(cells[0]),
                _cpu_cell(at64),
                f"{at64.mean_batch:.1f} ops" if isinstance(at64, _Result) else "-",
            ]
        )
    with tempfile.TemporaryDirectory(prefix="bench-ledger-floor-") as tmp:
        for floor in await measure_floor(Path(tmp), seconds):
            rate, cpu = f"{floor.pairs_per_s:,.0f}", f"{floor.cpu_us_per_pair:,.0f} µs"
            if floor.pairs_per_commit == 1:  # one caller at a time: the 1-writer columns
                table.rows.append([floor.label, rate, "-", "-", "-", "-", cpu, "-", "-"])
            else:  # as many pairs per commit as the 64 writers' batches: the 64 columns
                batch = f"{floor.pairs_per_commit} pairs"
                table.rows.append([floor.label, "-", rate, "-", "-", "-", "-", cpu, batch])
    table.note = (
        "Ratios against one commit per write (max_batch=1) on the same backend, measured in this "
        "run. CPU per pair: this process (the writer and the 64 calling tasks), + the local "
        "PostgreSQL server's; a bare aiohttp pass-through costs about 500-1,000 µs per call. "
        f"{seconds:g} s per cell; a fresh SQLite file per cell, one temporary PostgreSQL database. "
        f"The 64-writer cells run in {rounds} interleaved round(s) (the machine's load changes "
        "between rounds): the 64 writers column, its ratio and its CPU are the best round's, "
        "'each round' is the lowest and highest rate, and the goal says in how many rounds it "
        "was met. "
        "The floor rows (bench/ledger_floor.py) run the same two commits as bare SQL on the "
        "ledger's own schema: one caller at a time, in the caller's thread and through the writer "
        "thread the ledger uses (what is left of a 1-writer pair without the ledger's logic), and "
        "64 pairs per commit in the caller's thread (what SQLite itself allows at 64 writers: the "
        "rest of the 64-writer row's CPU is the ledger's logic and its event loop). The "
        "synchronous=OFF row is not durable and never what the ledger does: beside the first "
        "floor row it shows how much of a lone pair's CPU is the kernel's work for two fsyncs."
    )
    return [table]


def _schedule(rounds: int) -> Iterator[tuple[_Config, int]]:
    """The cells in the order they run: every configuration at 1 and 64 writers, then `rounds`
    - 1 more rounds of the 64-writer cells (where the goals are), interleaved."""
    for round_number in range(rounds):
        for config in _CONFIGS:
            for writers in _WRITERS if round_number == 0 else _WRITERS[-1:]:
                yield config, writers


def _best(results: list[_Result | str]) -> _Result | str:
    """The round with the highest rate (the least disturbed), or why none could be measured."""
    measured = [r for r in results if isinstance(r, _Result)]
    return max(measured, key=lambda r: r.pairs_per_s) if measured else results[0]


def rate_goal(rates: list[float], goal: float) -> str:
    """The goal cell: met when the best round reaches `goal`, and in how many rounds it did."""
    if not rates:
        return f"≥ {goal:,.0f} (not measured)"
    reached = sum(rate >= goal for rate in rates)
    verdict = "met" if reached else "NOT met"
    return f"≥ {goal:,.0f} ({verdict}; in {reached} of {len(rates)} rounds)"


def _cpu_cell(result: _Result | str) -> str:
    if not isinstance(result, _Result):
        return "-"
    cell = f"{result.cpu_us_per_pair:,.0f} µs"
    if result.server_us_per_pair is not None:
        cell += f" + server {result.server_us_per_pair:,.0f} µs"
    return cell


def run(quick: bool = False) -> list[Table]:
    """Measure every configuration; `quick` runs each cell for 0.3 s instead of 3 s."""
    seconds = 0.3 if quick else 3.0
    return asyncio.run(_run(seconds, 1 if quick else 3))


if __name__ == "__main__":
    import sys

    for result_table in run(quick="--quick" in sys.argv):
        print(result_table.title)
        print(" | ".join(result_table.columns))
        for row in result_table.rows:
            print(" | ".join(row))
        print(result_table.note)
