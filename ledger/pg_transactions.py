"""The PostgreSQL writer's connection, held across batches (the group-commit writer's backend).

The connection comes from the `write` engine (`ledger.db`) and is held across batches: a pool
checkout and reset per batch would cost two more round trips. A batch that only names rows by id
or key talks to asyncpg directly (`ledger.pg_sql`: four round trips); one that sweeps, purges or
runs deferred work's loaders reads through SQLAlchemy (`ledger.queries.lock_named`, then
`ledger.queries.load_rest`, locked) on the same connection, in the same transaction, and writes
with the same plain statements. Either way the batch's time is read after the row locks it may
have waited for, so a lease that ran out during that wait has run out for its decisions too.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from ledger import pg_sql, queries
from ledger.batch import Needs, OpContext, WorkingSet
from ledger.operations import Operation
from ledger.transactions import (
    Clock,
    ContextAt,
    LostRace,
    TransactionFailed,
    decide,
    in_transaction_async,
    needs_of,
)

if TYPE_CHECKING:  # loaded only for a PostgreSQL ledger: a SQLite proxy never pays for it
    import asyncpg

__all__ = ["PostgresTransactions"]


def _hot(needs: Needs) -> bool:
    """Whether the batch only names rows by id or key (no sweep, purge or loader)."""
    return not needs.loaders and not needs.sweep_limit and needs.purge is None


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
        needs = needs_of(ops)
        if _hot(needs):

            async def hot() -> list[object]:
                ws = WorkingSet()
                now = await pg_sql.load(raw, needs, ws)
                return await self._finish(
                    raw, ops, ws, self._context(self._clock() if self._clock else now)
                )

            return await in_transaction_async(
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

        return await in_transaction_async(begin, full, commit, rollback)

    def _load_full(self, conn: sa.Connection, needs: Needs, ws: WorkingSet) -> OpContext:
        queries.lock_named(conn, needs, ws)
        # After the locks that read may have waited for: a lease that ran out meanwhile has
        # run out for this batch's decisions too. (Always run: with nothing named, this is the
        # first statement, which begins the transaction on the connection.)
        now = queries.database_now(conn)
        ctx = self._context(self._clock() if self._clock else now)
        queries.load_rest(conn, needs, ws, now=ctx.now)
        return ctx

    async def _finish(
        self, raw: asyncpg.Connection, ops: list[Operation[Any]], ws: WorkingSet, ctx: OpContext
    ) -> list[object]:
        results = decide(ops, ws, ctx)
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
