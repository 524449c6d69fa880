"""The aiohttp application: wiring of configuration, scheduler, ledger and the route modules."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator

from aiohttp import web

from ledger import LedgerError, LedgerStore
from policies.budget import RetryBudgets
from policies.classify import ToolClassifier
from policies.model import Config
from proxy.http.deferred_run import register_http_runner
from proxy.http.jobs import setup_jobs
from proxy.http.routes import setup_http
from proxy.listener import setup_body_watch
from proxy.mcp import catalog
from proxy.mcp.tasks.runner import register_mcp_runner
from proxy.mcp.transport.routes import setup_mcp
from proxy.ops import admin, health
from proxy.runtime.deferred import DEFERRED, Dispatcher
from proxy.runtime.rejections import REJECTIONS, RejectionRecorder
from proxy.runtime.scheduler import Scheduler
from proxy.state import (
    CONFIG,
    LEDGER,
    REPLICA_ID,
    RETRY_BUDGETS,
    RUNTIME,
    SCHEDULER,
    TOOL_CLASSIFIER,
    LedgerHandle,
    Runtime,
)
from proxy.telemetry.metrics_route import setup_metrics

__all__ = ["create_app"]

log = logging.getLogger("interlock")

_LEDGER_RETRY_S = 2.0
_REJECTIONS_DRAIN_S = 10.0  # how long shutdown lets refusal records written behind land


def default_replica_id() -> str:
    """A replica id that is unique per process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def create_app(config: Config, *, replica_id: str | None = None) -> web.Application:
    """Build the proxy application for `config` (nothing is opened until the app starts)."""
    app = web.Application(client_max_size=config.max_body_bytes)  # no middleware: `guarded`
    app[CONFIG] = config
    app[REPLICA_ID] = replica_id or default_replica_id()
    app[RUNTIME] = Runtime()
    app[SCHEDULER] = Scheduler(config)
    app[LEDGER] = LedgerHandle()
    app[REJECTIONS] = RejectionRecorder(app[LEDGER])
    app[RETRY_BUDGETS] = RetryBudgets(config.upstreams, clock=time.monotonic)
    app[TOOL_CLASSIFIER] = ToolClassifier(config)
    app.cleanup_ctx.append(_ledger_ctx)
    app.on_shutdown.append(_begin_shutdown)
    catalog.setup(app)
    setup_body_watch(app)
    health.setup(app)
    admin.setup(app)
    setup_metrics(app)
    setup_mcp(app)
    setup_http(app)
    app[DEFERRED] = Dispatcher(app)
    setup_jobs(app)
    register_http_runner(app)
    register_mcp_runner(app)
    app.cleanup_ctx.append(_deferred_ctx)  # last: it needs the ledger and the upstream sessions
    return app


async def _begin_shutdown(app: web.Application) -> None:
    """SIGTERM: stop admitting (queued calls are refused); in-flight calls get the grace period."""
    app[RUNTIME].shutting_down = True
    app[SCHEDULER].stop_admitting()
    log.info("shutting down: no new calls admitted")


async def _open_ledger(app: web.Application) -> None:
    handle = app[LEDGER]
    try:
        handle.store = await LedgerStore.open(
            app[CONFIG].ledger, owner=app[REPLICA_ID], migrate_in_child=handle.migrate_in_child
        )
        handle.error = None
    except LedgerError as exc:
        handle.error = str(exc)
        log.error("ledger unavailable, side-effecting calls will be refused: %s", exc)


async def _ledger_maintenance(app: web.Application) -> None:
    """Reopen a ledger that was down, sweep expired leases into `unknown`, purge old keys."""
    settings = app[CONFIG].ledger
    handle = app[LEDGER]
    while True:
        store = handle.store
        if store is None:
            await asyncio.sleep(_LEDGER_RETRY_S)
            await _open_ledger(app)
            continue
        try:
            swept = await store.sweep_expired()
            if swept:
                log.warning("%d expired lease(s) marked unknown", swept)
            await store.purge()
        except LedgerError as exc:
            log.error("ledger maintenance failed: %s", exc)
        await asyncio.sleep(settings.sweep_interval_s)


async def _drain_in_flight(app: web.Application) -> None:
    """Calls still running after the server stopped get the grace period to finish; the rest are
    cancelled and awaited, so each records `unknown` while the ledger is still open."""
    tasks = set(app[RUNTIME].in_flight)
    if not tasks:
        return
    _done, pending = await asyncio.wait(tasks, timeout=app[CONFIG].shutdown_grace_s)
    for task in pending:
        task.cancel()
    if pending:
        log.warning("%d call(s) still in flight at shutdown were cancelled", len(pending))
        await asyncio.wait(pending, timeout=5.0)


async def _deferred_ctx(app: web.Application) -> AsyncIterator[None]:
    """Deferred work runs while the application does; at shutdown it gets the grace period."""
    dispatcher = app[DEFERRED]
    dispatcher.start()
    yield
    await dispatcher.stop(app[CONFIG].shutdown_grace_s)


async def _ledger_ctx(app: web.Application) -> AsyncIterator[None]:
    await _open_ledger(app)
    task = asyncio.create_task(_ledger_maintenance(app), name="ledger-maintenance")
    yield
    await _drain_in_flight(app)
    # refusals answered meanwhile (queued calls refused at shutdown too) are written before close
    await app[REJECTIONS].drain(_REJECTIONS_DRAIN_S)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    store = app[LEDGER].store
    if store is not None:
        await store.close()
