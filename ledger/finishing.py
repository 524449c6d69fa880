"""A finish that cannot be written at once is retried in the background until it lands or the
lease it depends on would lapse (DESIGN.md "Edges — The ledger under faults").

The caller has its answer already: the outcome must not be lost because the ledger was locked for
a moment, or its connection was killed between two batches. Only `LedgerUnavailable` is retried;
a refusal (stale token, illegal transition) is an answer and ends the retries. A finish whose
COMMIT was lost may have landed after all: the retry then finds the entry finished with the same
token, and counts that as landed. One that never lands is logged at ERROR with its entry id; its
lease then lapses and the sweeper makes the entry `unknown` — honest, never lost silently.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ledger.errors import IllegalTransition, LedgerError, LedgerUnavailable
from ledger.views import EntryView

__all__ = ["BackgroundFinishes", "retry_finish", "settle_as"]

T = TypeVar("T")
log = logging.getLogger("interlock.ledger")
_FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0


async def retry_finish(
    attempt: Callable[[], Awaitable[EntryView]],
    landed: Callable[[], Awaitable[EntryView | None]],
    *,
    entry_id: str,
    until: float,
    failed: LedgerUnavailable | None = None,
) -> EntryView:
    """Run `attempt` until it commits, retrying `LedgerUnavailable` with jittered backoff until
    the event loop's time passes `until`. With `failed`, a first try was made already and failed
    so: the retries start from there.

    `landed` says whether an earlier try did commit after all (the entry is finished under the
    same token); it is asked only when a retry is refused as an illegal transition.

    Raises:
        LedgerUnavailable: still not written when `until` passed (logged at ERROR).
        LedgerError: the ledger refused the finish (stale token, illegal transition, …).
    """
    loop = asyncio.get_running_loop()
    tries = 0
    error = failed
    while True:
        if error is None:
            try:
                return await attempt()
            except LedgerUnavailable as unavailable:
                error = unavailable
            except IllegalTransition:
                if tries and (entry := await _landed_quietly(landed)) is not None:
                    return entry
                raise
        tries += 1
        remaining = until - loop.time()
        if remaining <= 0:
            log.error(
                "entry %s: outcome NOT recorded after %d tries (%s); its lease lapses and "
                "it becomes unknown: reconcile it",
                entry_id,
                tries,
                error,
            )
            raise error
        if tries == 1:
            log.warning(
                "entry %s: outcome not recorded yet (%s); retrying until its lease lapses",
                entry_id,
                error,
            )
        backoff = min(_MAX_BACKOFF_S, _FIRST_BACKOFF_S * 2**tries)
        await asyncio.sleep(min(remaining, random.uniform(backoff / 2, backoff)))
        error = None


async def _landed_quietly(landed: Callable[[], Awaitable[EntryView | None]]) -> EntryView | None:
    try:
        return await landed()
    except LedgerError:
        return None


def settle_as(target: asyncio.Future[T], source: asyncio.Future[Any]) -> None:
    """Settle `target` as `source` settled (result, exception or cancellation), unless `target`
    is settled already. `source`'s result must be a `T` (a narrower future does)."""
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


class BackgroundFinishes:
    """The finishes not yet landed, held so that none is garbage-collected mid-flight and the
    store can let them land before it closes."""

    def __init__(self) -> None:
        self._pending: dict[asyncio.Future[EntryView], str] = {}  # each with its name for logs
        # The finishes whose first try is still with the writer (it commits them as it closes).
        self._with_writer: set[asyncio.Future[EntryView]] = set()
        self._drained = False

    def start_after(
        self,
        first: asyncio.Future[EntryView],
        attempt: Callable[[], Awaitable[EntryView]],
        landed: Callable[[], Awaitable[EntryView | None]],
        *,
        entry_id: str,
        until: float,
    ) -> asyncio.Future[EntryView]:
        """The finish whose first try is `first` (already handed to the writer): it settles as
        that try does, unless the try failed for want of the ledger; then `retry_finish` goes on
        from there in a task of its own and the finish settles as that does.

        A finish that lands at once (nearly all) costs no task: only `first` and this future.
        """
        finished: asyncio.Future[EntryView] = asyncio.get_running_loop().create_future()

        def settle(source: asyncio.Future[EntryView]) -> None:
            settle_as(finished, source)

        def first_done(tried: asyncio.Future[EntryView]) -> None:
            self._with_writer.discard(finished)
            error = None if tried.cancelled() else tried.exception()
            if not isinstance(error, LedgerUnavailable):
                settle(tried)
                return
            if self._drained:  # the store is closing: no retry may outlive it
                log.error(
                    "entry %s: outcome NOT recorded at shutdown (%s); its lease lapses and it "
                    "becomes unknown: reconcile it",
                    entry_id,
                    error,
                )
                settle(tried)
                return
            retrying = retry_finish(attempt, landed, entry_id=entry_id, until=until, failed=error)
            task = asyncio.create_task(retrying, name=name)
            task.add_done_callback(settle)
            # From now on the task stands for this finish (it settles `finished`): one entry each.
            self._pending.pop(finished, None)
            self._hold(task, name)

        name = f"ledger-finish-{entry_id}"
        self._hold(finished, name)
        self._with_writer.add(finished)
        first.add_done_callback(first_done)
        return finished

    def _hold(self, future: asyncio.Future[EntryView], name: str) -> None:
        self._pending[future] = name
        future.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Future[EntryView]) -> None:
        self._pending.pop(task, None)
        if not task.cancelled():
            task.exception()  # retrieved: a caller that stopped waiting was answered already

    async def drain(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for the finishes not yet landed (first tries still with the
        writer, retries); then cancel the retries left. A first try still with the writer is
        left to it: the writer's close commits it (or fails it, which is then logged), and no
        retry starts after this."""
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=timeout_s)
        self._drained = True
        # what is pending now: a retry that began during the wait stands for its finish
        for late, name in list(self._pending.items()):
            if not late.done() and late not in self._with_writer:
                log.error("%s: cancelled at shutdown before its outcome was recorded", name)
                late.cancel()
