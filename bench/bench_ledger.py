"""Ledger write throughput: begin (claim) + finish pairs per second.

Each writer claims a fresh key, then finishes it with a small outcome, as fast as it can, for a
fixed time. Configurations: SQLite with `synchronous=FULL` and one commit per write (the
baseline), SQLite FULL with group commit, SQLite NORMAL with group commit, and PostgreSQL with
and without group commit; each at 1 and 64 concurrent writers, on a fresh database (a temporary
folder, or a temporary database on `INTERLOCK_BENCH_PG_URL` / `INTERLOCK_TEST_PG_URL`, dropped
afterwards). Everything stays on this machine.
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
from typing import Literal

import asyncpg
from sqlalchemy.engine import make_url

from bench.common import Table
from ledger import ClaimRequest, LedgerStore, LedgerUnavailable
from policies.model import LedgerSettings

__all__ = ["run"]

_WRITERS = (1, 64)
_DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


@dataclass(frozen=True, slots=True)
class _Config:
    label: str
    backend: str
    durability: Literal["full", "normal"]
    group_commit: bool


_CONFIGS = (
    _Config("SQLite FULL, one commit per write", "sqlite", "full", False),
    _Config("SQLite FULL, group commit", "sqlite", "full", True),
    _Config("SQLite NORMAL, group commit", "sqlite", "normal", True),
    _Config("PostgreSQL, one commit per write", "postgresql", "full", False),
    _Config("PostgreSQL, group commit", "postgresql", "full", True),
)


@dataclass(frozen=True, slots=True)
class _Result:
    pairs_per_s: float
    mean_batch: float


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
        keys = (f"{secrets.token_hex(4)}-{n}" for n in itertools.count())
        await _pairs(store, keys, writers, time.perf_counter() + min(0.3, seconds / 4))  # warm-up
        before = store.writer_stats
        started = time.perf_counter()
        pairs = await _pairs(store, keys, writers, started + seconds)
        elapsed = time.perf_counter() - started
        after = store.writer_stats
    finally:
        await store.close()
    batches = max(1, after.batches - before.batches)
    return _Result(pairs / elapsed, (after.operations - before.operations) / batches)


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


async def _run(seconds: float) -> list[Table]:
    results: dict[tuple[str, int], _Result | str] = {}
    async with contextlib.AsyncExitStack() as databases:
        pg_url: str | None = None
        for config in _CONFIGS:
            for writers in _WRITERS:
                try:
                    if config.backend == "sqlite":  # a fresh file for every cell
                        url = await databases.enter_async_context(_sqlite_database())
                    else:  # one temporary database for every PostgreSQL cell
                        if pg_url is None:
                            pg_url = await databases.enter_async_context(_pg_database())
                        url = pg_url
                    results[config.label, writers] = await _measure(config, url, writers, seconds)
                except (OSError, asyncpg.PostgresError, LedgerUnavailable) as error:
                    results[config.label, writers] = f"unavailable ({type(error).__name__})"
    table = Table(
        title="ledger: claim + finish pairs per second (each pair = 2 durable writes)",
        columns=["configuration", *(f"{w} writer{'s' * (w > 1)}" for w in _WRITERS),
                 "mean batch at 64"],
    )  # fmt: skip
    for config in _CONFIGS:
        cells = [results[config.label, w] for w in _WRITERS]
        batch = cells[-1]
        table.rows.append(
            [
                config.label,
                *(f"{c.pairs_per_s:,.0f}" if isinstance(c, _Result) else c for c in cells),
                f"{batch.mean_batch:.1f} ops" if isinstance(batch, _Result) else "-",
            ]
        )
    base = results[_CONFIGS[0].label, 64]
    grouped = results[_CONFIGS[1].label, 64]
    if isinstance(base, _Result) and isinstance(grouped, _Result):
        table.note = (
            f"SQLite FULL at 64 writers: group commit {grouped.pairs_per_s:,.0f} pairs/s vs "
            f"{base.pairs_per_s:,.0f} with one commit per write = "
            f"{grouped.pairs_per_s / base.pairs_per_s:.1f}× (goal ≥ 10×, and ≥ 5,000 pairs/s). "
            f"{seconds:g} s per cell; a fresh SQLite file per cell, "
            "one temporary PostgreSQL database."
        )
    return [table]


def run(quick: bool = False) -> list[Table]:
    """Measure every configuration; `quick` runs each cell for 0.3 s instead of 3 s."""
    seconds = 0.3 if quick else 3.0
    return asyncio.run(_run(seconds))


if __name__ == "__main__":
    import sys

    for result_table in run(quick="--quick" in sys.argv):
        print(result_table.title)
        print(" | ".join(result_table.columns))
        for row in result_table.rows:
            print(" | ".join(row))
        print(result_table.note)
