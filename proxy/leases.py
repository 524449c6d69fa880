"""Keep a running entry's lease alive while its call is in flight."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from ledger import LedgerError, LedgerStore

__all__ = ["keep_lease"]

log = logging.getLogger("interlock.leases")


async def _renew_forever(store: LedgerStore, entry_id: str, token: int, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        try:
            if not await store.renew(entry_id, token):
                log.warning("entry %s: lease lost (token %d is no longer current)", entry_id, token)
                return
        except LedgerError as exc:
            # The sweeper will mark the entry unknown if the lease really runs out: safe side.
            log.error("entry %s: lease renewal failed: %s", entry_id, exc)


@contextlib.asynccontextmanager
async def keep_lease(
    store: LedgerStore, entry_id: str, token: int, lease_s: float
) -> AsyncIterator[None]:
    """Renew the lease every third of its length until the block ends."""
    task = asyncio.create_task(
        _renew_forever(store, entry_id, token, max(lease_s / 3.0, 0.05)),
        name=f"lease-{entry_id}",
    )
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
