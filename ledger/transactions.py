"""One batch of operations as one transaction, on each backend (used by `ledger.writer`).

A batch whose operations only name rows by id or by key — claims, finishes, renewals: the hot
path — runs as plain prepared SQL on the driver's own connection (`ledger.sqlite_sql`,
`ledger.pg_sql`), with the transaction begun and committed there too. A batch that also sweeps,
purges or runs an operation's own loader (deferred work) reads through SQLAlchemy
(`ledger.queries.load`) in a SQLAlchemy transaction on the same connection, and writes with the
same plain statements. Either way the callers hear nothing before COMMIT has returned.

SQLite: the connection lives on the writer's own thread and only that thread touches it; a whole
batch (BEGIN IMMEDIATE, reads, writes, COMMIT) is one hop from the event loop. A batch already
handed to that thread runs to its end even when the writer is cancelled. PostgreSQL: the
connection is held across batches (a pool checkout and reset per batch would cost two more round
trips), and the hot path talks to asyncpg directly.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ledger import pg_sql, queries, sqlite_sql
from ledger.batch import Needs, OpContext, WorkingSet
from ledger.errors import LedgerError, LedgerUnavailable
from ledger.faults import describe
from ledger.operations import Operation
from ledger.writer_thread import WriterThread

if TYPE_CHECKING:  # loaded only for a PostgreSQL ledger: a SQLite proxy never pays for it
    import asyncpg

__all__ = [
    "ContextAt",
    "LostRace",
    "PostgresTransactions",
    "SQLiteTransactions",
    "TransactionFailed",
]

T = TypeVar("T")
ContextAt = Callable[[datetime], OpContext]
"""The batch's `OpContext` for the time the batch took from the database."""
Clock = Callable[[], datetime] | None


class LostRace(Exception):
    """Another transaction committed one of this batch's new keys first."""


class TransactionFailed(Exception):
    """A batch's transaction failed; `committing` says whether COMMIT itself raised,
    `connecting` that no connection could be opened (so no statement was sent)."""

    def __init__(self, error: Exception, *, committing: bool, connecting: bool = False) -> None:
        super().__init__(describe(error))
        self.error = error
        self.committing = committing
        self.connecting = connecting


def _needs(ops: list[Operation[Any]]) -> Needs:
    needs = Needs()
    for op in ops:
        op.declare(needs)
    return needs


def _hot(needs: Needs) -> bool:
    """Whether the batch only names rows by id or key (no sweep, purge or loader)."""
    return not needs.loaders and not needs.sweep_limit and needs.purge is None


def _decide(ops: list[Operation[Any]], ws: WorkingSet, ctx: OpContext) -> list[object]:
    results: list[object] = []
    for op in ops:
        try:
            results.append(op.apply(ws, ctx))
        except LedgerError as refused:
            results.append(refused)
    return results


def _in_transaction(
    begin: Callable[[], object],
    body: Callable[[], list[object]],
    commit: Callable[[], object],
    rollback: Callable[[], object],
) -> list[object]:
    """`body` between `begin` and `commit` (synchronous: SQLite's thread).

    Raises:
        LostRace: rolled back; run the batch again.
        TransactionFailed: rolled back (or COMMIT failed): nothing to acknowledge.
    """
    try:
        begin()
        try:
            results = body()
        except BaseException:
            with contextlib.suppress(Exception):
                rollback()
            raise
    except (LostRace, LedgerError):
        raise
    except Exception as error:
        raise TransactionFailed(error, committing=False) from error
    try:
        commit()
    except Exception as error:
        with contextlib.suppress(Exception):
            rollback()
        raise TransactionFailed(error, committing=True) from error
    return results


async def _in_transaction_async(
    begin: Callable[[], Awaitable[object]],
    body: Callable[[], Awaitable[list[object]]],
    commit: Callable[[], Awaitable[object]],
    rollback: Callable[[], Awaitable[object]],
) -> list[object]:
    """`_in_transaction` on the event loop (PostgreSQL)."""
    try:
        await begin()
        try:
            results = await body()
        except BaseException:
            with contextlib.suppress(Exception):
                await rollback()
            raise
    except (LostRace, LedgerError):
        raise
    except Exception as error:
        raise TransactionFailed(error, committing=False) from error
    try:
        await commit()
    except Exception as error:
        with contextlib.suppress(Exception):
            await rollback()
        raise TransactionFailed(error, committing=True) from error
    return results


class SQLiteTransactions:
    """The SQLite writer's connection and thread."""

    def __init__(self, engine: sa.Engine, context: ContextAt, clock: Clock) -> None:
        self._engine = engine
        self._context = context
        self._clock = clock
        self._conn: sa.Connection | None = None  # only ever touched on the worker thread
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

    async def _on_thread(self, fn: Callable[..., T], *args: Any) -> T:
        if self._worker is None:
            raise LedgerUnavailable("the ledger store is closed")
        return await self._worker.run(fn, *args)

    def _transaction(self, ops: list[Operation[Any]]) -> list[object]:
        if self._conn is not None and self._raw().in_transaction:
            self._release()  # an earlier batch's ROLLBACK did not run: start on a clean one
        if self._conn is None:
            try:
                self._conn = self._engine.connect()
            except Exception as error:
                raise TransactionFailed(error, committing=False, connecting=True) from error
        conn = self._conn
        raw = self._raw()
        needs = _needs(ops)
        if _hot(needs):

            def hot() -> list[object]:
                ws = WorkingSet()
                now = self._clock() if self._clock else sqlite_sql.database_now(raw)
                ctx = self._context(now)
                sqlite_sql.load(raw, needs, ws)
                return self._finish(raw, ops, ws, ctx)

            return _in_transaction(
                lambda: sqlite_sql.begin(raw),
                hot,
                lambda: sqlite_sql.commit(raw),
                lambda: sqlite_sql.rollback(raw),
            )
        transaction: list[sa.RootTransaction] = []

        def rollback() -> None:
            if transaction:
                transaction[0].rollback()

        def full() -> list[object]:
            ws = WorkingSet()
            ctx = self._context(self._clock() if self._clock else sqlite_sql.database_now(raw))
            queries.load(conn, needs, ws, now=ctx.now, dialect="sqlite")
            return self._finish(raw, ops, ws, ctx)

        return _in_transaction(
            lambda: transaction.append(conn.begin()),  # BEGIN IMMEDIATE (see `ledger.db`)
            full,
            lambda: transaction[0].commit(),
            rollback,
        )

    @staticmethod
    def _finish(
        raw: sqlite3.Connection, ops: list[Operation[Any]], ws: WorkingSet, ctx: OpContext
    ) -> list[object]:
        results = _decide(ops, ws, ctx)
        if not sqlite_sql.flush(raw, ws):
            raise LostRace
        return results

    def _raw(self) -> sqlite3.Connection:
        assert self._conn is not None
        raw: sqlite3.Connection = self._conn.connection.driver_connection  # type: ignore[assignment]
        return raw

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(exc.DBAPIError, OSError, sqlite3.Error):
                conn.close()  # no pool (`ledger.db`): the connection is closed, rolled back


class PostgresTransactions:
    """The PostgreSQL writer's connection, held across batches."""

    def __init__(self, engine: AsyncEngine, context: ContextAt, clock: Clock) -> None:
        self._engine = engine
        self._context = context
        self._clock = clock
        self._conn: AsyncConnection | None = None
        self._raw: asyncpg.Connection | None = None

    async def run(self, ops: list[Operation[Any]]) -> list[object]:
        """One batch in one transaction; its results (or refusals) in order.

        Raises:
            LostRace: another transaction committed one of the new keys first.
            TransactionFailed: the database (or the driver) refused; nothing to acknowledge.
        """
        if self._raw is not None and (self._raw.is_closed() or self._raw.is_in_transaction()):
            await self.drop()  # an earlier batch's ROLLBACK did not run: start on a clean one
        if self._conn is None or self._raw is None:
            try:
                self._conn = await self._engine.connect()
                raw_fairy = await self._conn.get_raw_connection()
                self._raw = raw_fairy.driver_connection
            except Exception as error:
                raise TransactionFailed(error, committing=False, connecting=True) from error
        conn, raw = self._conn, self._raw
        assert raw is not None
        needs = _needs(ops)
        if _hot(needs):

            async def hot() -> list[object]:
                ws = WorkingSet()
                now = await pg_sql.load(raw, needs, ws)
                return await self._finish(
                    raw, ops, ws, self._context(self._clock() if self._clock else now)
                )

            return await _in_transaction_async(
                lambda: pg_sql.begin(raw),
                hot,
                lambda: pg_sql.commit(raw),
                lambda: pg_sql.rollback(raw),
            )
        transaction: list[Any] = []

        async def full() -> list[object]:
            ws = WorkingSet()
            ctx = await conn.run_sync(self._load_full, needs, ws)
            return await self._finish(raw, ops, ws, ctx)

        async def begin() -> None:
            transaction.append(await conn.begin())

        async def rollback() -> None:
            if transaction:
                await transaction[0].rollback()

        async def commit() -> None:
            await transaction[0].commit()

        return await _in_transaction_async(begin, full, commit, rollback)

    def _load_full(self, conn: sa.Connection, needs: Needs, ws: WorkingSet) -> OpContext:
        # Always run: the first statement is what begins the transaction on the connection.
        now = queries.database_now(conn)
        ctx = self._context(self._clock() if self._clock else now)
        queries.load(conn, needs, ws, now=ctx.now, dialect="postgresql")
        return ctx

    async def _finish(
        self, raw: asyncpg.Connection, ops: list[Operation[Any]], ws: WorkingSet, ctx: OpContext
    ) -> list[object]:
        results = _decide(ops, ws, ctx)
        if not await pg_sql.flush(raw, ws):
            raise LostRace
        return results

    async def drop(self) -> None:
        """Close the connection (a new one is opened by the next batch)."""
        conn, raw, self._conn, self._raw = self._conn, self._raw, None, None
        if conn is None:
            return
        import asyncpg  # already loaded: this connection came from it

        with contextlib.suppress(exc.DBAPIError, OSError, asyncpg.PostgresError):
            # SQLAlchemy did not see the plain statements fail: a connection that died or was
            # left mid-transaction under them must not go back to the pool.
            if raw is None or raw.is_closed() or raw.is_in_transaction():
                await conn.invalidate()
            await conn.close()

    def close(self) -> None:
        """Nothing to release besides the connection (`drop`)."""
