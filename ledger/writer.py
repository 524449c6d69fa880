"""Group commit: one writer task turns every queued write into one transaction and one fsync.

Callers enqueue an operation and wait on a future. The writer takes everything queued (up to
`max_batch`), begins a transaction, takes the batch's time from the database (after the write lock
is held), loads the rows those operations need, applies them in order, writes the result and
commits; only then does it resolve the futures, so a caller never hears "done" before its write
is durable. With `max_batch=1` this is one commit per write, the baseline the benchmark compares
against.

An operation the ledger refuses (stale token, illegal transition) fails only its own caller. A
failed transaction is rerun as `ledger.faults` classifies it: whole after a transient error (a
few times, with backoff), in halves when one operation's values were refused (so only that one
fails), never after a connection lost during COMMIT (its callers get `LedgerUnavailable`; a claim
that did commit is found by the sweeper when its lease expires: `unknown`, never a repeat).

With a commit delay (`ledger.commit_delay_ms`), a batch that finds other calls in flight (their
claims committed, their outcomes not yet queued) waits for their writes before it begins: until
every call in flight has queued its write, the batch is full, or the delay has passed. A write
with no other call in flight never waits. It trades a bounded wait for fewer fsyncs per call.

A caller that is cancelled before the writer reaches its operation is skipped. One cancelled after
that may still be committed: for a claim, the entry is then running with nobody behind it, and its
lease expiry makes it `unknown` — never silently lost, never silently repeated. If the writer task
itself dies, every caller waiting on it gets `LedgerUnavailable` at once, and the next write starts
a new writer.

How a batch becomes one transaction on each backend (plain prepared SQL on the driver's own
connection for claims, finishes and renewals; one thread for SQLite) is `ledger.transactions`,
`ledger.sqlite_transactions` and `ledger.pg_transactions`.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ledger.errors import LedgerError, LedgerUnavailable
from ledger.faults import Fault, classify
from ledger.operations import Operation
from ledger.transactions import LostRace, TransactionFailed, Transactions

__all__ = ["GroupCommitWriter", "WriterStats"]

T = TypeVar("T")
_log = logging.getLogger(__name__)
_MAX_LOST_RACES = 5  # a batch rerun after losing a key race; each rerun sees more rows
_TRANSIENT_TRIES = 4  # one try and three reruns after a transient error
_BACKOFF_S = 0.05  # first backoff; doubled per try, with full jitter
_MAX_BATCH_BYTES = 64 * 1024 * 1024
"""What one batch's operations may carry (outcomes, requests, arguments: an operation's
`payload_bytes`, 0 if it has none), unless a single operation carries more. A batch's writes are
one statement on PostgreSQL, whose messages stop at 1 GB: 256 outcomes or deferred requests of
4 MB (`max_outcome_bytes`, `deferred.max_request_bytes` raised) would pass it, and fail together
every time they were rerun."""


@dataclass(frozen=True, slots=True)
class WriterStats:
    """How much the writer has committed: `operations / batches` is the mean batch size."""

    batches: int
    operations: int


@dataclass(frozen=True, slots=True)
class _Pending:
    op: Operation[Any]
    future: asyncio.Future[Any]


class _BatchFailed(Exception):
    def __init__(self, fault: Fault, error: LedgerUnavailable) -> None:
        super().__init__(str(error))
        self.fault = fault
        self.error = error


class GroupCommitWriter:
    """The single writer of one `LedgerStore`, running its batches on `transactions` (the
    backend's connection).

    `in_flight` counts the calls whose next write is still to come (for the commit delay; None:
    no call is ever waited for).
    """

    def __init__(
        self,
        transactions: Transactions,
        *,
        max_batch: int,
        commit_delay_s: float = 0.0,
        in_flight: Callable[[], int] | None = None,
    ) -> None:
        self._max_batch = max_batch
        self._delay_s = commit_delay_s
        self._in_flight = in_flight
        self._gathering: asyncio.Future[None] | None = None
        # The writes waiting for a batch (None: close), and the future the writer waits on
        # while there are none: a deque and one future, not an asyncio.Queue's Python layers.
        self._queue: deque[_Pending | None] = deque()
        self._arrival: asyncio.Future[None] | None = None
        self._closed = False
        self._transactions = transactions
        self._batches = 0
        self._operations = 0
        self._restarts = 0
        self._task = self._start()

    def _start(self) -> asyncio.Task[None]:
        task = asyncio.create_task(self._run(), name="ledger-group-commit")
        task.add_done_callback(self._stopped)
        return task

    async def submit(self, op: Operation[T]) -> T:
        """Run `op` in the next batch and return its result once that batch is committed.

        Raises:
            LedgerUnavailable: the batch could not be committed, the writer is closed, or it
                died while `op` waited (a new writer takes the next write).
            LedgerError: the operation itself was refused.
        """
        return await self.enqueue(op)

    def enqueue(self, op: Operation[T]) -> asyncio.Future[T]:
        """Queue `op` for the next batch; its future settles as `submit` returns or raises
        (already failed with `LedgerUnavailable` when the writer is closed).

        Nobody's cancellation reaches the future (unless its holder cancels it: then the op is
        skipped if its batch has not begun), so a write that must land does without a task
        of its own.
        """
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        if self._closed:
            future.set_exception(LedgerUnavailable("the ledger store is closed"))
            return future
        if self._task.done():
            self._restarts += 1
            _log.error("ledger writer restarted (it had stopped)")
            self._task = self._start()
        self._push(_Pending(op, future))
        if self._gathering is not None and self._gathered():
            self._wake()
        return future

    @property
    def stats(self) -> WriterStats:
        """Committed batches and the operations in them, since the writer started."""
        return WriterStats(self._batches, self._operations)

    @property
    def restarts(self) -> int:
        """How many times a writer that had died was started again."""
        return self._restarts

    async def close(self) -> None:
        """Commit what is queued, then stop: release the connection and the worker thread."""
        if not self._closed:
            self._closed = True
            self._push(None)
            self._wake()
        try:
            if not self._task.done():
                await self._task
        finally:
            self._fail_queued(LedgerUnavailable("the ledger store is closed"))
            try:
                await self._drop_connection()
            finally:
                self._transactions.close()

    def _stopped(self, task: asyncio.Task[None]) -> None:
        """The writer task ended: a clean close, or a death that must not strand its callers."""
        error = asyncio.CancelledError() if task.cancelled() else task.exception()
        if error is None and self._closed:
            return
        why = "the ledger writer stopped" if error is None else _death(error)
        if task is not self._task:
            # A write made since (a caller the dead writer had failed, writing again at once)
            # started a new writer, which holds the queue now: nothing here is stranded.
            _log.error("%s; a new writer has taken over the waiting writes", why)
            return
        if not self._closed:
            _log.error("%s; waiting writes fail, the next write starts a new writer", why)
        self._fail_queued(LedgerUnavailable(why))

    def _fail_queued(self, error: LedgerUnavailable) -> None:
        while self._queue:
            item = self._queue.popleft()
            if item is not None:
                _fail([item], error)

    async def _run(self) -> None:
        await self._drop_connection()  # a writer that died may have left one mid-transaction
        stopping = False
        while not stopping:
            waited = not self._queue
            item = await self._next()
            try:
                # Let callers whose previous write just committed enqueue their next one first
                # (a writer that waited for this write has let every one of them run already).
                if not waited:
                    await asyncio.sleep(0)
                if item is not None and self._delay_s and not self._gathered():
                    await self._gather()
            except BaseException as error:
                if item is not None:
                    _fail([item], LedgerUnavailable(_death(error)))
                raise
            batch: list[_Pending] = []
            carried = 0
            size = 0 if item is None else getattr(item.op, "payload_bytes", 0)
            while item is not None:
                if not item.future.cancelled():
                    batch.append(item)
                    carried += size
                if len(batch) >= self._max_batch or not self._queue:
                    break
                upcoming = self._queue[0]
                size = 0 if upcoming is None else getattr(upcoming.op, "payload_bytes", 0)
                if carried + size > _MAX_BATCH_BYTES:
                    break  # it begins the next batch
                item = self._queue.popleft()
            stopping = item is None
            if batch:
                await self._commit_guarded(batch)

    def _push(self, item: _Pending | None) -> None:
        self._queue.append(item)
        arrival = self._arrival
        if arrival is not None and not arrival.done():
            arrival.set_result(None)

    async def _next(self) -> _Pending | None:
        """The oldest queued write, once there is one."""
        while not self._queue:
            self._arrival = asyncio.get_running_loop().create_future()
            try:
                await self._arrival
            finally:
                self._arrival = None
        return self._queue.popleft()

    def _gathered(self) -> bool:
        """Whether the batch should begin now: the writer is closing, no call in flight has a
        write still to come, or the queue (with the write in hand) fills a batch."""
        return (
            self._closed
            or self._in_flight is None
            or self._in_flight() == 0
            or len(self._queue) + 1 >= self._max_batch
        )

    async def _gather(self) -> None:
        """Wait for the writes of the calls in flight, at most the commit delay."""
        loop = asyncio.get_running_loop()
        self._gathering = loop.create_future()
        deadline = loop.call_later(self._delay_s, self._wake)
        try:
            await self._gathering
        finally:
            deadline.cancel()
            self._gathering = None

    def _wake(self) -> None:
        if self._gathering is not None and not self._gathering.done():
            self._gathering.set_result(None)

    async def _commit_guarded(self, batch: list[_Pending]) -> None:
        try:
            await self._commit(batch)
        except Exception as error:  # noqa: BLE001 - the writer must outlive a bug in one batch
            _log.exception("ledger batch failed unexpectedly")
            _fail(batch, LedgerUnavailable(f"ledger write failed unexpectedly: {error!r}"))
        except BaseException as error:  # cancelled, or dying: this batch's callers hear why
            _fail(batch, LedgerUnavailable(_death(error)))
            raise

    async def _commit(self, batch: list[_Pending]) -> None:
        """Commit `batch`; when one operation's values make the database refuse it, commit the
        rest without it (halving the batch until that operation stands alone)."""
        try:
            results = await self._run_batch([pending.op for pending in batch])
        except _BatchFailed as failed:
            if failed.fault is Fault.ISOLATE and len(batch) > 1:
                half = len(batch) // 2
                await self._commit(batch[:half])
                await self._commit(batch[half:])
            else:
                _fail(batch, failed.error)
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

    async def _run_batch(self, ops: list[Operation[Any]]) -> list[object]:
        """One batch in one transaction, rerun after a lost key race or a transient error.

        Raises:
            _BatchFailed: it could not be committed; its fault says whether to isolate.
        """
        lost_races = tries = 0
        while True:
            try:
                return await self._transactions.run(ops)
            except LostRace:
                lost_races += 1
                if lost_races >= _MAX_LOST_RACES:
                    message = f"ledger write gave up after {lost_races} conflicting tries"
                    raise _BatchFailed(Fault.UNAVAILABLE, LedgerUnavailable(message)) from None
                continue
            except TransactionFailed as failed:
                tries += 1
                fault = (
                    Fault.RETRY
                    if failed.connecting
                    else classify(failed.error, committing=failed.committing)
                )
                if fault is not Fault.ISOLATE:
                    await self._drop_connection()
                if fault is Fault.RETRY and tries < _TRANSIENT_TRIES:
                    _log.warning("ledger write retried after: %s", failed)
                    await asyncio.sleep(random.uniform(0, _BACKOFF_S * 2**tries))
                    continue
                unavailable = LedgerUnavailable(f"ledger write failed: {failed}")
                unavailable.__cause__ = failed.error
                raise _BatchFailed(fault, unavailable) from failed.error

    async def _drop_connection(self) -> None:
        await self._transactions.drop()


def _death(error: BaseException) -> str:
    """Why the writer stopped, as its waiting callers are told."""
    if isinstance(error, asyncio.CancelledError):
        return "the ledger writer was cancelled"
    return f"the ledger writer died: {error!r}"


def _fail(batch: list[_Pending], error: LedgerUnavailable) -> None:
    for pending in batch:
        if not pending.future.done():
            copy = LedgerUnavailable(*error.args)
            copy.__cause__ = error.__cause__
            pending.future.set_exception(copy)
