"""The reads of a SQLite ledger on the stdlib driver, off the event loop: readiness, the entry
counts and oldest waits of `/metrics` and `/admin/stats`, deferred work's candidates and task
lookups, an operator's entries and lists, the schema's revision.

They run on a thread of their own with one connection it keeps (opened at the first read, opened
again after one that failed), which WAL lets read while the writer writes. The statements are
`ledger.sqlite_queries`. It is a SQLite ledger's `ledger.reads.Reads` (a PostgreSQL ledger's is
`ledger.toolkit_reads`), and it also reads the schema's revision when the ledger opens.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from ledger import sqlite_connect, sqlite_queries
from ledger.batch import EntryRow
from ledger.errors import LedgerUnavailable
from ledger.faults import describe
from ledger.views import Candidate, EntryFilter, TransitionView
from ledger.writer_thread import WriterThread

__all__ = ["SQLiteReads"]

T = TypeVar("T")


class SQLiteReads:
    """The reads above on the ledger at `path`. `close` when done."""

    def __init__(self, path: Path, durability: str) -> None:
        self._path = path
        self._durability = durability
        self._conn: sqlite3.Connection | None = None  # only ever touched on the reader's thread
        self._thread: WriterThread | None = None  # started by the first read
        self._closed = False

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    async def ping(self) -> None:
        """Return if the ledger's table can be read.

        Raises:
            LedgerUnavailable: it cannot.
        """
        await self._read("ping", sqlite_queries.ping)

    async def count_by_state(self) -> dict[str, int]:
        """Entry counts by state (only the states that have entries).

        Raises:
            LedgerUnavailable.
        """
        return await self._read("stats", sqlite_queries.count_by_state)

    async def oldest_change(self, state: str) -> datetime | None:
        """When the entry in `state` that changed least recently last changed (None: no entry).

        Raises:
            LedgerUnavailable.
        """
        return await self._read("stats", sqlite_queries.oldest_change, state)

    async def candidates(self, limit: int, *, per_group: int) -> list[Candidate]:
        """Waiting deferred work, oldest first, at most `per_group` calls per (tenant, upstream).

        Raises:
            LedgerUnavailable.
        """
        return await self._read("candidates", sqlite_queries.candidates, limit, per_group)

    async def revision(self) -> str | None:
        """The schema's revision, or None when the database has never been migrated.

        A brand-new file that another replica, starting at the same moment, is switching to
        WAL answers "database is locked" without waiting for the busy timeout; that race is over
        in moments, so the read is tried a few times more.

        Raises:
            LedgerUnavailable: the database cannot be read.
        """
        return await sqlite_connect.retry_while_locked(
            lambda: self._read("schema check", sqlite_queries.revision)
        )

    async def stats(self) -> dict[tuple[str, str], int]:
        """Entry counts by (state, upstream).

        Raises:
            LedgerUnavailable.
        """
        return await self._read("stats", sqlite_queries.stats)

    async def entry(self, reference: str) -> tuple[EntryRow, list[TransitionView]]:
        """The entry an id, an idempotency key or a unique id prefix names, and its history.

        Raises:
            EntryNotFound, AmbiguousReference, LedgerUnavailable.
        """
        return await self._read("read", _entry_and_history, reference)

    async def find_entry(self, reference: str) -> EntryRow:
        """The entry an id, an idempotency key or a unique id prefix names.

        Raises:
            EntryNotFound, AmbiguousReference, LedgerUnavailable.
        """
        return await self._read("lookup", sqlite_queries.find_entry, reference)

    async def list_entries(self, wanted: EntryFilter) -> list[EntryRow]:
        """The entries `wanted` asks for, newest first.

        Raises:
            LedgerUnavailable.
        """
        return await self._read("list", sqlite_queries.list_entries, wanted)

    async def task_owner(self, task_id: str) -> str | None:
        """The tenant whose entry holds task `task_id` (None: no entry does).

        Raises:
            LedgerUnavailable.
        """
        return await self._read("task", sqlite_queries.task_owner, task_id)

    async def find_task(self, task_id: str, tenant: str) -> EntryRow | None:
        """The entry of task `task_id` if tenant `tenant` created it.

        Raises:
            LedgerUnavailable.
        """
        return await self._read("task", sqlite_queries.find_task, task_id, tenant)

    async def list_tasks(
        self, tenant: str, limit: int, before: tuple[datetime, str] | None, upstream: str | None
    ) -> list[EntryRow]:
        """Tenant `tenant`'s own tasks, newest first, created before `before`.

        Raises:
            LedgerUnavailable.
        """
        read = sqlite_queries.list_tasks
        return await self._read("tasks", read, tenant, limit, before, upstream)

    async def close(self) -> None:
        """Close the connection and let the thread go once the reads queued before have run;
        a read after this is refused (`LedgerUnavailable`: the store is closed)."""
        self._closed = True
        thread = self._thread
        if thread is not None:
            try:
                await thread.run(self._disconnect)
            finally:
                thread.stop()

    async def _read(self, what: str, read: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise LedgerUnavailable("the ledger store is closed")
        if self._thread is None:
            self._thread = WriterThread("ledger-reader")
        try:
            return await self._thread.run(self._on_thread, read, args)
        except (sqlite3.Error, OSError) as error:
            raise LedgerUnavailable(f"ledger {what} failed: {describe(error)}") from error

    def _on_thread(self, read: Callable[..., T], args: tuple[Any, ...]) -> T:
        if self._closed:  # queued before the close, run after its disconnect: no new connection
            raise LedgerUnavailable("the ledger store is closed")
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


def _entry_and_history(
    conn: sqlite3.Connection, reference: str
) -> tuple[EntryRow, list[TransitionView]]:
    conn.execute("BEGIN")  # one snapshot: the entry and its history as of the same commit
    try:
        row = sqlite_queries.find_entry(conn, reference)
        return row, sqlite_queries.history(conn, row.id)
    finally:
        conn.execute("COMMIT")
