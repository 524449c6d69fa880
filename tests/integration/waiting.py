"""Bounded waiting for a condition (tests never sleep to synchronise; they poll with a deadline)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

__all__ = ["wait_until"]


async def wait_until(predicate: Callable[[], object], timeout_s: float = 10.0) -> None:
    """Poll `predicate` every 10 ms until it holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(0.01)
