"""One batch of operations as one transaction: what both backends share (used by `ledger.writer`).

A batch whose operations only name rows by id or by key — claims, finishes, renewals: the hot
path — runs as plain prepared SQL on the driver's own connection (`ledger.sqlite_sql`,
`ledger.pg_sql`), with the transaction begun and committed there too; on SQLite so does every
other batch (the lease sweep, the purge, deferred work's loaders). On PostgreSQL a batch that
sweeps, purges or runs a loader reads through SQLAlchemy (`ledger.queries`, locking what it
reads) in the same transaction on the same connection, and writes with the same plain
statements. Either way the callers hear nothing before COMMIT has returned.

Each backend's connection is its own module: `ledger.sqlite_transactions` (the connection lives
on the writer's own thread; a whole batch is one hop from the event loop) and
`ledger.pg_transactions` (the connection is held across batches).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol

from ledger.batch import Needs, OpContext, WorkingSet
from ledger.errors import LedgerError
from ledger.faults import describe
from ledger.operations import Operation

__all__ = [
    "Clock",
    "ContextAt",
    "LostRace",
    "TransactionFailed",
    "Transactions",
    "decide",
    "in_transaction",
    "in_transaction_async",
    "needs_of",
]

ContextAt = Callable[[datetime], OpContext]
"""The batch's `OpContext` for the time the batch took from the database."""
Clock = Callable[[], datetime] | None


class Transactions(Protocol):
    """A backend's connection for the group-commit writer."""

    async def run(self, ops: list[Operation[Any]]) -> list[object]:
        """One batch in one transaction; its results (or refusals) in order.

        Raises:
            LostRace: another transaction committed one of the new keys first.
            TransactionFailed: the database (or the driver) refused; nothing to acknowledge.
        """
        ...

    async def drop(self) -> None:
        """Close the connection (a new one is opened by the next batch)."""
        ...

    def close(self) -> None:
        """Release what is left once the writer stops."""
        ...


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


def needs_of(ops: list[Operation[Any]]) -> Needs:
    """What the batch's operations must have loaded before they decide."""
    needs = Needs()
    for op in ops:
        op.declare(needs)
    return needs


def decide(ops: list[Operation[Any]], ws: WorkingSet, ctx: OpContext) -> list[object]:
    """Apply the batch's operations in order; each one's result, or the `LedgerError` that
    refused it (which fails only its own caller)."""
    results: list[object] = []
    for op in ops:
        try:
            results.append(op.apply(ws, ctx))
        except LedgerError as refused:
            results.append(refused)
    return results


def in_transaction(
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


async def in_transaction_async(
    begin: Callable[[], Awaitable[object]],
    body: Callable[[], Awaitable[list[object]]],
    commit: Callable[[], Awaitable[object]],
    rollback: Callable[[], Awaitable[object]],
) -> list[object]:
    """`in_transaction` on the event loop (PostgreSQL)."""
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
