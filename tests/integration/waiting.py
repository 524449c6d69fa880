"""Bounded waiting for a condition (tests never sleep to synchronise; they poll with a deadline),
and background tasks held no longer than a block."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

__all__ = ["cancelled_at_exit", "wait_until"]


async def wait_until(
    predicate: Callable[[], object],
    timeout_s: float = 10.0,
    *,
    what: str | None = None,
    interval_s: float = 0.01,
) -> None:
    """Poll `predicate` every `interval_s` until it holds; fail after `timeout_s` (the failure
    names `what` when given)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(what or f"condition not met within {timeout_s} s")
        await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def cancelled_at_exit(tasks: list[asyncio.Task[Any]]) -> AsyncIterator[None]:
    """Hold background `tasks` for the block; whatever of them is still running when it ends
    (normally or by a failure) is cancelled and awaited, so no task outlives the test."""
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
