"""The proxy's own reads of a SQLite ledger, on the stdlib driver: readiness, the entry counts and
oldest waits of the metrics and of `/admin/state`, deferred work's candidates, the schema's
revision.

What a proxy reads all day, without the query toolkit: they run on a thread of their own with
one connection it keeps (opened at the first read, opened again after one that failed), which WAL
lets read while the writer writes. The operator's reads (an entry, its history, lists, task
pages) go through the toolkit (`ledger.reads`, `ledger.deferred`), loaded when first asked.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from ledger import sqlite_connect
from ledger.errors import LedgerUnavailable
from ledger.revisions import VERSION_TABLE
from ledger.sqlite_sql import WAITING
from ledger.views import Candidate
from ledger.writer_thread import WriterThread

__all__ = ["SQLiteReads"]

T = TypeVar("T")
_LOCKED_RETRIES = 6

_PING = "SELECT count(*) FROM ledger_entries WHERE 0"
_BY_STATE = "SELECT state, count(*) FROM ledger_entries GROUP BY state"
_OLDEST_CHANGE = "SELECT min(updated_at) FROM ledger_entries WHERE state = ?"
_HAS_VERSION = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
_VERSION = f"SELECT version_num FROM {VERSION_TABLE}"
# At most `per_group` calls per (tenant, upstream), oldest first: a tenant with a flood of waiting
# work never hides another tenant's.
_CANDIDATES = f"""
SELECT id, tenant, upstream, tool, work_class, run_id, created_at FROM (
    SELECT id, tenant, upstream, tool, work_class, run_id, created_at, row_number() OVER (
        PARTITION BY tenant, upstream ORDER BY created_at, id
    ) AS rank
    FROM ledger_entries WHERE {WAITING}
) WHERE rank <= ? ORDER BY created_at, id LIMIT ?
"""


class SQLiteReads:
    """The reads above on the ledger at `path`. `close` when done."""

    def __init__(self, path: Path, durability: str) -> None:
        self._path = path
        self._durability = durability
        self._conn: sqlite3.Connection | None = None  # only ever touched on the reader's thread
        self._thread: WriterThread | None = None  # started by the first read

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    async def ping(self) -> None:
        """Return if the ledger's table can be read.

        Raises:
            LedgerUnavailable: it cannot.
        """
        await self._read("ping", _ping)

    async def count_by_state(self) -> dict[str, int]:
        """Entry counts by state (only the states that have entries).

        Raises:
            LedgerUnavailable.
        """
        return await self._read("stats", _count_by_state)

    async def oldest_change(self, state: str) -> datetime | None:
        """When the entry in `state` that changed least recently last changed (None: no entry).

        Raises:
            LedgerUnavailable.
        """
        return await self._read("stats", _oldest_change, state)

    async def candidates(self, limit: int, *, per_group: int) -> list[Candidate]:
        """Waiting deferred work, oldest first, at most `per_group` calls per (tenant, upstream).

        Raises:
            LedgerUnavailable.
        """
        return await self._read("candidates", _candidates, limit, per_group)

    async def revision(self) -> str | None:
        """The schema's revision, or None when the database has never been migrated.

        A brand-new file that another replica, starting at the same moment, is switching to
        WAL answers "database is locked" without waiting for the busy timeout; that race is over
        in moments, so the read is tried a few times more.

        Raises:
            LedgerUnavailable: the database cannot be read.
        """
        for attempt in range(_LOCKED_RETRIES):
            try:
                return await self._read("schema check", _revision)
            except LedgerUnavailable as error:
                if "database is locked" not in str(error) or attempt == _LOCKED_RETRIES - 1:
                    raise
            await asyncio.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        """Close the connection and let the thread go (a read after this opens them again)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            await thread.run(self._disconnect)
            thread.stop()

    async def _read(self, what: str, read: Callable[..., T], *args: Any) -> T:
        if self._thread is None:
            self._thread = WriterThread("ledger-reader")
        try:
            return await self._thread.run(self._on_thread, read, args)
        except (sqlite3.Error, OSError) as error:
            detail = str(error).strip() or type(error).__name__
            raise LedgerUnavailable(f"ledger {what} failed: {detail}") from error

    def _on_thread(self, read: Callable[..., T], args: tuple[Any, ...]) -> T:
        if self._conn is None:
            self._conn = sqlite_connect.connect(self._path, self._durability)
        try:
            return read(self._conn, *args)
        except sqlite3.Error:
            self._disconnect()  # the next read starts on a new connection
            raise

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()


def _ping(conn: sqlite3.Connection) -> None:
    conn.execute(_PING).fetchall()


def _count_by_state(conn: sqlite3.Connection) -> dict[str, int]:
    return {str(state): int(n) for state, n in conn.execute(_BY_STATE)}


def _oldest_change(conn: sqlite3.Connection, state: str) -> datetime | None:
    (text,) = conn.execute(_OLDEST_CHANGE, (state,)).fetchone()
    return None if text is None else _time(text)


def _candidates(conn: sqlite3.Connection, limit: int, per_group: int) -> list[Candidate]:
    found = []
    for entry_id, tenant, upstream, tool, work_class, run_id, created in conn.execute(
        _CANDIDATES, (per_group, limit)
    ):
        found.append(
            Candidate(entry_id, tenant, upstream, tool, work_class, run_id, _time(created))
        )
    return found


def _time(text: str) -> datetime:
    """A stored time (UTC text, `ledger.tables.UTCTimestamp`) as an aware datetime."""
    return datetime.fromisoformat(f"{text}+00:00")


def _revision(conn: sqlite3.Connection) -> str | None:
    if conn.execute(_HAS_VERSION, (VERSION_TABLE,)).fetchone() is None:
        return None
    row = conn.execute(_VERSION).fetchone()
    return None if row is None else str(row[0])
