"""Typed application state keys shared by the proxy's route modules."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aiohttp import web

from policies.budget import RetryBudgets
from policies.classify import ToolClassifier
from policies.model import Config

if TYPE_CHECKING:
    from ledger import LedgerStore
    from proxy.runtime.scheduler import Scheduler

__all__ = [
    "CONFIG",
    "LEDGER",
    "REPLICA_ID",
    "RETRY_BUDGETS",
    "RUNTIME",
    "SCHEDULER",
    "TOOL_CLASSIFIER",
    "CallInFlight",
    "LedgerHandle",
    "Runtime",
]


@dataclass
class LedgerHandle:
    """The ledger as the proxy sees it: open, or down with the reason (side effects fail closed)."""

    store: LedgerStore | None = None
    error: str | None = "ledger not opened yet"
    migrate_in_child: bool = False
    """Open the ledger with `LedgerStore.open(migrate_in_child=True)` (`interlock serve`)."""


@dataclass
class Runtime:
    """Process-wide flags: shutdown in progress, in-flight calls to drain."""

    shutting_down: bool = False
    in_flight: set[asyncio.Task[Any]] = field(default_factory=set)

    def call_in_flight(self) -> CallInFlight:
        """`with runtime.call_in_flight():` lists the running task in `in_flight` for the block,
        so that shutdown waits for it (and cancels it after the grace period)."""
        return CallInFlight(self.in_flight)


class CallInFlight:
    """The context manager `Runtime.call_in_flight` returns (a class, not a generator: it is on
    every proxied call's path)."""

    __slots__ = ("_calls", "_task")
    _task: asyncio.Task[Any]

    def __init__(self, calls: set[asyncio.Task[Any]]) -> None:
        self._calls = calls

    def __enter__(self) -> None:
        task = asyncio.current_task()
        assert task is not None  # its callers are request handlers, each in its own task
        self._task = task
        self._calls.add(task)

    def __exit__(self, *exc_info: object) -> None:
        self._calls.discard(self._task)


CONFIG = web.AppKey("config", Config)
SCHEDULER: web.AppKey[Scheduler] = web.AppKey("scheduler")
LEDGER = web.AppKey("ledger", LedgerHandle)
REPLICA_ID = web.AppKey("replica_id", str)
RUNTIME = web.AppKey("runtime", Runtime)
RETRY_BUDGETS = web.AppKey("retry_budgets", RetryBudgets)
TOOL_CLASSIFIER = web.AppKey("tool_classifier", ToolClassifier)
