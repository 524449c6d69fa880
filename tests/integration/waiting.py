"""Bounded waiting for a condition (tests never sleep to synchronise; they poll with a deadline)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["wait_until"]


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
