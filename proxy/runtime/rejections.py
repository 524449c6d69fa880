"""Refusals of side-effecting calls, recorded behind the answer (shared by the MCP and HTTP paths).

A refused call was not executed, so nothing waits on its `rejected` record: the caller is answered
at once and the record goes into a bounded backlog. One task lets records gather (up to
`_LINGER_S`, or a full batch) and submits them to the ledger together, so the group-commit writer
folds a burst of refusals into one transaction (and one fsync) beside the claims of useful work,
instead of one wait per refusal.

The backlog is bounded: when it is full (or after `drain()`) a record is dropped (counted in
`interlock.ledger.rejections_unrecorded{why="dropped"}`, logged at most once a second) and the
answer is never held up. A record the ledger fails to write, or that finds no ledger open, is
counted with `why="failed"`.
`drain()` (graceful shutdown, before the ledger closes) writes what is still pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from ledger import ClaimRequest, LedgerError
from policies.admission import Refusal
from proxy.state import LedgerHandle
from proxy.telemetry import metrics

__all__ = ["REJECTIONS", "RejectionRecorder"]

log = logging.getLogger("interlock.ledger")

_BACKLOG = 10_000  # records waiting to be written; past this a refusal goes unrecorded
_BATCH = 64  # records handed to the ledger at once
# A record waits up to this long for others to share its transaction: a ledger batch costs about
# 1 ms of CPU and an fsync on top of ~0.1 ms per record, so batches of a few dozen halve what the
# records cost the writer (and the useful work queued behind it) against batches of a few.
_LINGER_S = 0.1
_LOG_EVERY_S = 1.0  # a burst of drops or failures is one log line per second, with its count


@dataclass(frozen=True, slots=True)
class _Rejection:
    req: ClaimRequest
    refusal: Refusal
    entry_id: str | None


class RejectionRecorder:
    """Write-behind `rejected` records: `record()` never waits; `drain()` writes the rest.

    Records are written in the order they were refused, a batch at a time."""

    def __init__(
        self,
        ledger: LedgerHandle,
        *,
        backlog: int = _BACKLOG,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ledger = ledger
        self._clock = clock  # paces the log lines about unrecorded refusals
        self._pending: deque[_Rejection] = deque()
        self._backlog = backlog
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._unlogged = {"dropped": 0, "failed": 0}
        self._logged_at = {"dropped": float("-inf"), "failed": float("-inf")}

    @property
    def pending(self) -> int:
        """Records not yet handed to the ledger."""
        return len(self._pending)

    def record(self, req: ClaimRequest, refusal: Refusal) -> str | None:
        """Queue the refusal's record; never blocks and never raises for the ledger's sake.

        Returns the id the record's entry will have when the answer may name it: only for a call
        without a key (its record is always a new entry) and only once queued. A keyed call's
        key may already name an entry, which keeps its own id: the key, not an id, names it.
        Nothing is queued without an open ledger, with the backlog full, or after `drain()`.
        """
        store = self._ledger.store
        if store is None:
            self._unrecorded("failed", 1, "the ledger is not open")
            return None
        if self._closed or len(self._pending) >= self._backlog:
            why = "the ledger is closing" if self._closed else "the backlog is full"
            self._unrecorded("dropped", 1, why)
            return None
        entry_id = None if req.idempotency_key is not None else store.new_entry_id()
        pending = self._pending
        pending.append(_Rejection(req, refusal, entry_id))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="rejection-recorder"
            )
        if len(pending) == 1 or len(pending) >= _BATCH:  # the first one, or a full batch
            self._wake.set()
        return entry_id

    async def drain(self, timeout_s: float) -> None:
        """Stop taking records and write the pending ones (bounded by `timeout_s`)."""
        self._closed = True
        self._wake.set()
        task = self._task
        if task is None:
            return
        _done, late = await asyncio.wait({task}, timeout=timeout_s)
        if late:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._pending:
            self._unrecorded("dropped", len(self._pending), "shutdown came first")
            self._pending.clear()

    async def _run(self) -> None:
        pending = self._pending
        while True:
            if not pending:
                if self._closed:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if len(pending) < _BATCH and not self._closed:  # let a batch form
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_LINGER_S):
                        await self._wake.wait()
            batch = [pending.popleft() for _ in range(min(_BATCH, len(pending)))]
            await self._write(batch)

    async def _write(self, batch: list[_Rejection]) -> None:
        store = self._ledger.store
        if store is None:
            self._unrecorded("failed", len(batch), "the ledger is not open")
            return
        writes = [
            store.record_rejection(
                r.req,
                reason=r.refusal.reason,
                scope=r.refusal.scope,
                retry_after_s=r.refusal.retry_after_s,
                entry_id=r.entry_id,
            )
            for r in batch
        ]
        # gathered, the writes are queued together: the writer commits them as one batch
        results = await asyncio.gather(*writes, return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        for error in failed:
            if not isinstance(error, LedgerError):
                raise error
        if failed:
            self._unrecorded("failed", len(failed), str(failed[0]))

    def _unrecorded(self, why: str, count: int, cause: str) -> None:
        metrics.rejection_unrecorded(why, count)
        self._unlogged[why] += count
        now = self._clock()
        if now - self._logged_at[why] >= _LOG_EVERY_S:
            log.warning("%d refusal record(s) %s, not written: %s", self._unlogged[why], why, cause)
            self._unlogged[why] = 0
            self._logged_at[why] = now


REJECTIONS = web.AppKey("rejections", RejectionRecorder)
