"""The physical floor under the ledger's claim + finish pair on SQLite FULL, measured on the real
schema (every index the ledger keeps) with none of the ledger's own logic.

A pair here is what the ledger must do at the least for one side-effecting call: a durable commit
that inserts the entry and its first transition, then a durable commit that records the outcome
and its transition. Three variants:

- in the caller's thread, one pair at a time: the commits alone (what SQLite and the disk cost);
- through the writer thread (`ledger.writer_thread.WriterThread`, as the ledger runs them), one
  pair at a time: the commits plus two hand-offs between the event loop and the thread;
- in the caller's thread, 64 pairs per commit (as the ledger's group commit batches 64 writers):
  the same statements, each run once per batch with all its rows (`executemany`).

The difference between these and the ledger's own 1-writer and 64-writer rows is what the
ledger's logic adds; the second variant is the least a side-effecting call can cost on top of its
transport, the third the most pairs per second SQLite gives this schema on this machine.

A fourth row runs the first variant with `synchronous=OFF`: not durable, never what the ledger
does, it shows how much of a lone pair's CPU is the kernel's work for the two fsyncs.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from ledger import LedgerStore
from ledger.writer_thread import WriterThread
from policies.model import LedgerSettings

__all__ = ["FloorResult", "measure_floor"]

_INSERT_ENTRY = (
    "INSERT INTO ledger_entries (id, tenant, upstream, tool, idempotency_key, key_source, "
    "fingerprint, arguments, state, attempt, owner, lease_expires_at, fencing_token, work_class, "
    "created_at, updated_at, started_at, outcome_retained) "
    "VALUES (?, 'bench', 'mail', 'send', ?, 'explicit', ?, '{}', 'running', 1, 'bench', ?, 1, "
    "'interactive', ?, ?, ?, 0)"
)
_FINISH_ENTRY = (
    "UPDATE ledger_entries SET state = 'succeeded', outcome = ?, outcome_hash = ?, "
    "outcome_retained = 1, lease_expires_at = NULL, updated_at = ?, finished_at = ? "
    "WHERE id = ? AND fencing_token = 1"
)
_INSERT_TRANSITION = (
    "INSERT INTO ledger_transitions (entry_id, from_state, to_state, at, actor, reason, attempt, "
    "fencing_token) VALUES (?, ?, ?, ?, 'bench', 'floor', 1, 1)"
)


GROUP = 64  # pairs per commit of the grouped variant: the ledger bench's 64 writers


@dataclass(frozen=True, slots=True)
class FloorResult:
    label: str
    pairs_per_s: float
    cpu_us_per_pair: float
    pairs_per_commit: int = 1
    through_thread: bool = False


async def measure_floor(folder: Path, seconds: float) -> list[FloorResult]:
    """Both variants on a fresh ledger file in `folder` (migrated by the ledger itself)."""
    path = folder / "floor.db"
    settings = LedgerSettings(url=f"sqlite:///{path}", durability="full")
    store = await LedgerStore.open(settings, owner="bench")  # the real schema, then closed
    await store.close()
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        pair = _Pair(conn)
        inline_result = await _timed(seconds, lambda: _inline(pair))
        thread = WriterThread("bench-floor")
        try:
            handed_result = await _timed(seconds, lambda: _handed(thread, pair))
        finally:
            thread.stop()
        grouped_pairs, grouped_cpu = await _timed(seconds, lambda: _grouped(pair))
        conn.execute("PRAGMA synchronous=OFF")  # last: what the same commits cost unsynced
        unsynced_result = await _timed(seconds, lambda: _inline(pair))
    finally:
        conn.close()
    return [
        FloorResult("SQLite FULL, bare SQL in the caller's thread (floor)", *inline_result),
        FloorResult(
            "SQLite FULL, bare SQL through the writer thread (floor)",
            *handed_result,
            through_thread=True,
        ),
        FloorResult(
            f"SQLite FULL, bare SQL, {GROUP} pairs per commit (floor)",
            grouped_pairs * GROUP,
            grouped_cpu / GROUP,
            pairs_per_commit=GROUP,
        ),
        FloorResult(
            "SQLite synchronous=OFF, bare SQL in the caller's thread (not durable: the same "
            "commits without their fsyncs)",
            *unsynced_result,
        ),
    ]


class _Pair:
    """The two commits of one pair, on one connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._numbers = itertools.count()

    def claim(self) -> str:
        n = next(self._numbers)
        entry, now = f"floor{n:027d}", _now()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_INSERT_ENTRY, (entry, f"key-{n}", "f" * 64, now, now, now, now))
        conn.execute(_INSERT_TRANSITION, (entry, None, "running", now))
        conn.execute("COMMIT")
        return entry

    def finish(self, entry: str) -> None:
        now = _now()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_FINISH_ENTRY, (b"ok", "0" * 64, now, now, entry))
        conn.execute(_INSERT_TRANSITION, (entry, "running", "succeeded", now))
        conn.execute("COMMIT")

    def claim_many(self, count: int) -> list[str]:
        now = _now()
        entries = [f"floor{next(self._numbers):027d}" for _ in range(count)]
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            _INSERT_ENTRY, [(e, f"key-{e}", "f" * 64, now, now, now, now) for e in entries]
        )
        conn.executemany(_INSERT_TRANSITION, [(e, None, "running", now) for e in entries])
        conn.execute("COMMIT")
        return entries

    def finish_many(self, entries: list[str]) -> None:
        now = _now()
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(_FINISH_ENTRY, [(b"ok", "0" * 64, now, now, e) for e in entries])
        conn.executemany(_INSERT_TRANSITION, [(e, "running", "succeeded", now) for e in entries])
        conn.execute("COMMIT")


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S.000000", time.gmtime())


async def _inline(pair: _Pair) -> None:
    pair.finish(pair.claim())


async def _grouped(pair: _Pair) -> None:
    pair.finish_many(pair.claim_many(GROUP))


async def _handed(thread: WriterThread, pair: _Pair) -> None:
    entry = await thread.run(pair.claim)
    await thread.run(pair.finish, entry)


async def _timed(seconds: float, one: Callable[[], Awaitable[None]]) -> tuple[float, float]:
    """(pairs per second, CPU µs per pair) of `one` run back to back for `seconds`."""
    deadline = time.perf_counter() + min(0.3, seconds / 4)
    while time.perf_counter() < deadline:  # warm-up
        await one()
    pairs = 0
    cpu_before = time.process_time()
    started = time.perf_counter()
    deadline = started + seconds
    while time.perf_counter() < deadline:
        await one()
        pairs += 1
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_before
    pairs = max(1, pairs)
    return pairs / elapsed, cpu / pairs * 1e6


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for result in asyncio.run(measure_floor(Path(tmp), 2.0)):
            print(f"{result.label}: {result.pairs_per_s:,.0f} pairs/s, "
                  f"{result.cpu_us_per_pair:,.0f} µs CPU per pair")  # fmt: skip
