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


CONFIG = web.AppKey("config", Config)
SCHEDULER: web.AppKey[Scheduler] = web.AppKey("scheduler")
LEDGER = web.AppKey("ledger", LedgerHandle)
REPLICA_ID = web.AppKey("replica_id", str)
RUNTIME = web.AppKey("runtime", Runtime)
RETRY_BUDGETS = web.AppKey("retry_budgets", RetryBudgets)
TOOL_CLASSIFIER = web.AppKey("tool_classifier", ToolClassifier)
