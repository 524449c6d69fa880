"""Shared by the MCP and HTTP pipelines: a ledger write that records what a call did runs to its
end even when the call's task is cancelled meanwhile (shutdown drain, a caller that went away).

`asyncio.shield` alone keeps the write running but lets the cancelled task end at once; at
shutdown the drain then closes the ledger under the write, and an answered side effect is left
`running`, to expire into `unknown`. `until_written` waits for the write first and delivers the
cancellation after it, so the drain's wait covers it. The wait is bounded by the write itself
(the ledger fails fast when it cannot write)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["until_written"]

T = TypeVar("T")
log = logging.getLogger("interlock.ledger")


async def until_written(write: Awaitable[T]) -> T:
    """Await `write` to its end; if this task is cancelled meanwhile, re-raise the cancellation
    only once the write has landed (or failed)."""
    task = asyncio.ensure_future(write)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("a ledger write failed while its call was being cancelled: %s", error)
        raise
