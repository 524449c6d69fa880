"""The SQLite writer's connection and thread (the group-commit writer's backend on SQLite).

The connection is the stdlib driver's own (`ledger.sqlite_connect`), opened on the writer's thread
and only ever touched there: a whole batch (BEGIN IMMEDIATE, the database's clock, the reads, the
decisions, the writes, COMMIT) is one hop from the event loop, and a batch already handed to that
thread runs to its end even when the writer is cancelled. Every statement is plain SQL
(`ledger.sqlite_sql`): claims, finishes, renewals, the lease sweep, the purge and deferred work's
loaders alike.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

from ledger import sqlite_connect, sqlite_sql, transactions
from ledger.batch import WorkingSet
from ledger.errors import LedgerUnavailable
from ledger.operations import Operation
from ledger.transactions import Clock, ContextAt, LostRace, TransactionFailed, in_transaction
from ledger.writer_thread import WriterThread

__all__ = ["SQLiteTransactions"]

T = TypeVar("T")


class SQLiteTransactions:
    """The SQLite writer's connection and thread."""

    def __init__(self, path: Path, durability: str, context: ContextAt, clock: Clock) -> None:
        self._path = path
        self._durability = durability
        self._context = context
        self._clock = clock
        self._conn: sqlite3.Connection | None = None  # only ever touched on the worker thread
        self._worker: WriterThread | None = WriterThread("ledger-writer")

    async def run(self, ops: list[Operation[Any]]) -> list[object]:
        """One batch in one transaction; its results (or refusals) in order.

        Raises:
            LostRace: another transaction committed one of the new keys first.
            TransactionFailed: the database (or the driver) refused; nothing to acknowledge.
        """
        return await self._on_thread(self._transaction, ops)

    async def drop(self) -> None:
        """Close the connection (a new one is opened by the next batch)."""
        if self._worker is not None:
            await self._on_thread(self._release)

    def close(self) -> None:
        """Let the worker thread go once the jobs queued on it (a release) have run."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.stop()

    def _on_thread(self, fn: Callable[..., T], *args: Any) -> Coroutine[Any, Any, T]:
        """The thread's run of `fn(*args)`, to await (a plain function: no coroutine layer of
        its own between every batch and the thread)."""
        if self._worker is None:
            raise LedgerUnavailable("the ledger store is closed")
        return self._worker.run(fn, *args)

    def _transaction(self, ops: list[Operation[Any]]) -> list[object]:
        if self._conn is not None and self._conn.in_transaction:
            self._release()  # an earlier batch's ROLLBACK did not run: start on a clean one
        if self._conn is None:
            try:
                self._conn = sqlite_connect.connect(self._path, self._durability)
            except Exception as error:
                raise TransactionFailed(error, committing=False, connecting=True) from error
        conn = self._conn
        needs = transactions.needs_of(ops)

        def body() -> list[object]:
            ws = WorkingSet()
            text = sqlite_sql.TimeTexts()  # one per batch: most of its times are its one `now`
            ctx = self._context(self._clock() if self._clock else sqlite_sql.database_now(conn))
            sqlite_sql.load(conn, needs, ws, now=ctx.now, text=text)
            results = transactions.decide(ops, ws, ctx)
            if not sqlite_sql.flush(conn, ws, text):
                raise LostRace
            return results

        return in_transaction(
            lambda: sqlite_sql.begin(conn),
            body,
            lambda: sqlite_sql.commit(conn),
            lambda: sqlite_sql.rollback(conn),
        )

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error, OSError):
                conn.close()  # what it had not committed is rolled back
