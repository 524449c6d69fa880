"""Group commit: one writer task turns every queued write into one transaction and one fsync.

Callers enqueue an operation and wait on a future. The writer takes everything queued (up to
`max_batch`), loads the rows those operations need, applies them in order, writes the result and
commits; only then does it resolve the futures, so a caller never hears "done" before its write
is durable. An operation the ledger refuses (stale token, illegal transition) fails only its own
caller; a database failure fails the whole batch, none of which was committed. With
`max_batch=1` this is one commit per write, the baseline the benchmark compares against.

A connection lost during COMMIT leaves the outcome unknown to the writer; its callers get
`LedgerUnavailable` either way. The proxy then fails closed, and a claim that did commit is found
by the sweeper when its lease expires: the ledger errs towards `unknown`, never towards a repeat.

A caller that is cancelled before the writer reaches its operation is skipped. One cancelled after
that may still be committed: for a claim, the entry is then running with nobody behind it, and its
lease expiry makes it `unknown` — never silently lost, never silently repeated.

On SQLite a whole batch (BEGIN IMMEDIATE, reads, writes, COMMIT) is one call on the writer's own
thread, over a synchronous connection that only that thread ever touches: one hop from the event
loop per batch rather than one per statement. A batch already handed to that thread runs to its
end even when the writer is cancelled; its callers get `LedgerUnavailable` all the same. On
PostgreSQL the same synchronous batch runs on the async connection through `run_sync`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy import exc
from sqlalchemy.ext.asyncio import AsyncConnection

from ledger import queries
from ledger.batch import Needs, OpContext, WorkingSet
from ledger.db import Engines, is_retryable, translate_errors
from ledger.errors import LedgerError, LedgerUnavailable
from ledger.operations import Operation

__all__ = ["GroupCommitWriter", "WriterStats"]

T = TypeVar("T")
_log = logging.getLogger(__name__)
_MAX_TRIES = 5  # a batch rerun after losing a key race or a deadlock; each rerun sees more rows


@dataclass(frozen=True, slots=True)
class WriterStats:
    """How much the writer has committed: `operations / batches` is the mean batch size."""

    batches: int
    operations: int


@dataclass(frozen=True, slots=True)
class _Pending:
    op: Operation[Any]
    future: asyncio.Future[Any]


class _LostRace(Exception):
    """Another transaction committed one of this batch's new keys first."""


class GroupCommitWriter:
    """The single writer of one `LedgerStore`."""

    def __init__(
        self, engines: Engines, context: Callable[[], OpContext], *, max_batch: int
    ) -> None:
        self._engines = engines
        self._context = context
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Pending | None] = asyncio.Queue()
        self._closed = False
        self._conn: AsyncConnection | None = None  # PostgreSQL
        self._sync_conn: sa.Connection | None = None  # SQLite: only ever on the worker thread
        self._worker: ThreadPoolExecutor | None = None
        if engines.write_sync is not None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-writer")
        self._batches = 0
        self._operations = 0
        self._task = asyncio.create_task(self._run(), name="ledger-group-commit")

    async def submit(self, op: Operation[T]) -> T:
        """Run `op` in the next batch and return its result once that batch is committed.

        Raises:
            LedgerUnavailable: the batch could not be committed, or the writer is closed.
            LedgerError: the operation itself was refused.
        """
        if self._closed:
            raise LedgerUnavailable("the ledger store is closed")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(op, future))
        return await future

    @property
    def stats(self) -> WriterStats:
        """Committed batches and the operations in them, since the writer started."""
        return WriterStats(self._batches, self._operations)

    async def close(self) -> None:
        """Commit what is queued, then stop: release the connection and the worker thread."""
        if not self._closed:
            self._closed = True
            self._queue.put_nowait(None)
        try:
            await self._task
        finally:
            try:
                await self._drop_connection()
            finally:
                worker, self._worker = self._worker, None
                if worker is not None:
                    # Jobs already queued (the connection's release) still run on it.
                    worker.shutdown(wait=False)

    async def _run(self) -> None:
        stopping = False
        while not stopping:
            item = await self._queue.get()
            # Let callers whose previous write just committed enqueue their next one first.
            await asyncio.sleep(0)
            batch: list[_Pending] = []
            while item is not None:
                if not item.future.cancelled():
                    batch.append(item)
                if len(batch) >= self._max_batch or self._queue.empty():
                    break
                item = self._queue.get_nowait()
            stopping = item is None
            if batch:
                await self._commit_guarded(batch)

    async def _commit_guarded(self, batch: list[_Pending]) -> None:
        try:
            await self._commit(batch)
        except asyncio.CancelledError:
            _fail(batch, LedgerUnavailable("the ledger writer was cancelled"))
            raise
        except Exception as error:  # noqa: BLE001 - the writer must outlive a bug in one batch
            _log.exception("ledger batch failed unexpectedly")
            _fail(batch, LedgerUnavailable(f"ledger write failed unexpectedly: {error!r}"))

    async def _commit(self, batch: list[_Pending]) -> None:
        ops = [pending.op for pending in batch]
        for _ in range(_MAX_TRIES):
            try:
                with translate_errors("write"):
                    results = await self._transaction(ops, self._context())
            except _LostRace:
                continue
            except LedgerUnavailable as error:
                await self._drop_connection()
                cause = error.__cause__
                if isinstance(cause, exc.DBAPIError) and is_retryable(cause):
                    continue
                _fail(batch, error)
                return
            self._batches += 1
            self._operations += len(batch)
            for pending, result in zip(batch, results, strict=True):
                if pending.future.done():
                    continue
                if isinstance(result, LedgerError):
                    pending.future.set_exception(result)
                else:
                    pending.future.set_result(result)
            return
        _fail(
            batch, LedgerUnavailable(f"ledger write gave up after {_MAX_TRIES} conflicting tries")
        )

    async def _transaction(self, ops: list[Operation[Any]], ctx: OpContext) -> list[object]:
        """Run one batch in one transaction; its results (or refusals) in order."""
        engine = self._engines.write_sync
        if engine is not None:
            if self._worker is None:
                raise LedgerUnavailable("the ledger store is closed")
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._worker, self._sqlite_transaction, engine, ops, ctx
            )
        # Held across batches: a pool checkout and reset per batch would cost two more round
        # trips to the server.
        if self._conn is None:
            self._conn = await self._engines.write.connect()
        async with self._conn.begin():
            return await self._conn.run_sync(_apply, ops, ctx, self._engines.dialect)

    def _sqlite_transaction(
        self, engine: sa.Engine, ops: list[Operation[Any]], ctx: OpContext
    ) -> list[object]:
        # On the worker thread only. The connection is held across batches, as on PostgreSQL.
        if self._sync_conn is None:
            self._sync_conn = engine.connect()
        with self._sync_conn.begin():
            return _apply(self._sync_conn, ops, ctx, "sqlite")

    def _release_sync_connection(self) -> None:
        # On the worker thread only.
        conn, self._sync_conn = self._sync_conn, None
        if conn is not None:
            with contextlib.suppress(exc.DBAPIError, OSError):
                conn.close()

    async def _drop_connection(self) -> None:
        if self._worker is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._worker, self._release_sync_connection)
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(exc.DBAPIError, OSError):
                await conn.close()


def _apply(
    conn: sa.Connection, ops: list[Operation[Any]], ctx: OpContext, dialect: str
) -> list[object]:
    """Load what `ops` need, apply them in order and write the result (inside a transaction).

    Raises:
        _LostRace: another transaction committed one of the new keys first; roll back, rerun.
    """
    needs = Needs()
    for op in ops:
        op.declare(needs)
    ws = WorkingSet()
    queries.load(conn, needs, ws, now=ctx.now, dialect=dialect)
    results: list[object] = []
    for op in ops:
        try:
            results.append(op.apply(ws, ctx))
        except LedgerError as refused:
            results.append(refused)
    if not queries.flush(conn, ws, dialect=dialect):
        raise _LostRace
    return results


def _fail(batch: list[_Pending], error: LedgerUnavailable) -> None:
    for pending in batch:
        if not pending.future.done():
            copy = LedgerUnavailable(*error.args)
            copy.__cause__ = error.__cause__
            pending.future.set_exception(copy)
