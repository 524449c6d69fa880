"""`GET /metrics`: the Prometheus text exposition of the telemetry handle's registry.

The state gauges (queue depth, oldest wait and running per scope, cooldowns per upstream, ledger
entries by state) are observed at scrape time: the scheduler part from `app[SCHEDULER].snapshot()`,
the ledger part from `store.count_by_state()`, read from the ledger itself (so the counts are right
after a restart) and cached for `ledger_refresh_s` so frequent scrapes stay cheap.

If no telemetry handle is active when the application starts (`configure_telemetry` was not
called, as in most tests), the application makes a metrics-only one for its own lifetime.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from ledger.errors import LedgerError
from proxy.state import CONFIG, LEDGER, SCHEDULER
from proxy.telemetry import metrics
from proxy.telemetry.sdk import TelemetryHandle, active_handle, configure_telemetry

__all__ = ["METRICS", "MetricsState", "setup_metrics"]

log = logging.getLogger("interlock.metrics")

_LEDGER_READ_TIMEOUT_S = 2.0


@dataclass
class _LedgerCounts:
    entries: Mapping[str, int] | None = None
    oldest_unknown_s: float | None = None
    unknown_since: datetime | None = None
    accepted_since: datetime | None = None
    up: bool = False
    read_at: float | None = None


@dataclass
class MetricsState:
    """Per-application metrics state (mutable: the application is frozen once started)."""

    ledger_refresh_s: float = 2.0
    handle: TelemetryHandle | None = None
    ledger: _LedgerCounts = field(default_factory=_LedgerCounts)
    clock: Callable[[], float] = time.monotonic
    _refresh_lock: asyncio.Lock | None = None
    _remove_source: Callable[[], None] | None = None


METRICS = web.AppKey("metrics", MetricsState)


def setup_metrics(app: web.Application, *, ledger_refresh_s: float = 2.0) -> None:
    """Add `GET /metrics` and the scrape-time state gauges of this application."""
    app[METRICS] = MetricsState(ledger_refresh_s=ledger_refresh_s)
    app.router.add_get("/metrics", metrics_endpoint)
    app.cleanup_ctx.append(_metrics_ctx)


async def _metrics_ctx(app: web.Application) -> AsyncIterator[None]:
    state = app[METRICS]
    owned: TelemetryHandle | None = None
    state.handle = active_handle()
    if state.handle is None:
        owned = state.handle = configure_telemetry(
            app[CONFIG].telemetry, enabled=False, set_global=False
        )
    state._refresh_lock = asyncio.Lock()
    state._remove_source = metrics.add_state_source(lambda: _reading(app))
    try:
        yield
    finally:
        state._remove_source()
        if owned is not None:
            owned.shutdown()


async def metrics_endpoint(request: web.Request) -> web.Response:
    """Prometheus text format of every Interlock metric."""
    token = os.environ.get(request.app[CONFIG].telemetry.metrics_token_env)
    if token:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            raise web.HTTPUnauthorized(
                text="a bearer token is required for /metrics\n",
                headers={"WWW-Authenticate": "Bearer"},
            )
    state = request.app[METRICS]
    if state.handle is None:
        raise web.HTTPServiceUnavailable(text="metrics are not set up yet\n")
    await _refresh_ledger_counts(request.app)
    body = generate_latest(state.handle.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _refresh_ledger_counts(app: web.Application) -> None:
    """Re-read the ledger's counts if the cached ones are older than `ledger_refresh_s`."""
    state = app[METRICS]
    if not _stale(state) or state._refresh_lock is None:
        return
    async with state._refresh_lock:
        if not _stale(state):  # another scrape refreshed while this one waited
            return
        counts = state.ledger
        counts.read_at = state.clock()
        store = app[LEDGER].store
        if store is None:
            counts.entries, counts.oldest_unknown_s, counts.up = None, None, False
            return
        try:
            async with asyncio.timeout(_LEDGER_READ_TIMEOUT_S):
                entries = await store.count_by_state()
                since = await _oldest(store, "unknown") if entries.get("unknown") else None
                waiting = await _oldest(store, "accepted") if entries.get("accepted") else None
        except (LedgerError, TimeoutError) as exc:
            log.warning("ledger counts unavailable for /metrics: %s", exc)
            counts.entries, counts.oldest_unknown_s, counts.up = None, None, False
            return
        counts.entries, counts.unknown_since, counts.up = dict(entries), since, True
        counts.accepted_since = waiting


def _stale(state: MetricsState) -> bool:
    read_at = state.ledger.read_at
    return read_at is None or state.clock() - read_at >= state.ledger_refresh_s


async def _oldest(store: Any, state: str) -> datetime | None:
    """When the longest-waiting entry in `state` entered it (its last transition)."""
    oldest: datetime | None = await store.oldest_in_state(state)
    return None if oldest is None else _aware(oldest)


def _aware(stamp: datetime) -> datetime:
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def _reading(app: web.Application) -> metrics.StateReading:
    """The application's current state for the gauges (called by the OTel reader at scrape)."""
    counts = app[METRICS].ledger
    oldest_unknown_s = _age(counts, "unknown", counts.unknown_since)
    oldest_accepted_s = _age(counts, "accepted", counts.accepted_since)
    scheduler = _scheduler_reading(app)
    store = app[LEDGER].store
    return metrics.StateReading(
        queue_depth=scheduler["queued"],
        oldest_wait_s=scheduler["oldest_wait_s"],
        running=scheduler["running"],
        cooldown_remaining_s=scheduler["cooldowns"],
        ledger_entries=counts.entries,
        ledger_oldest_unknown_s=oldest_unknown_s,
        ledger_oldest_accepted_s=oldest_accepted_s,
        ledger_up=counts.up,
        ledger_writer=None if store is None else store.writer_stats,
    )


def _age(counts: _LedgerCounts, state: str, since: datetime | None) -> float | None:
    if since is None or not counts.entries or not counts.entries.get(state):
        return None
    return max(0.0, (datetime.now(UTC) - since).total_seconds())


def _scheduler_reading(app: web.Application) -> dict[str, dict[str, Any]]:
    """Per-scope queued / oldest wait / running and per-upstream cooldowns from the scheduler.

    The global scope and every configured upstream's scope are always reported (0 when idle), so
    their series never vanish; tenant and run scopes appear while they have work.
    """
    config = app[CONFIG]
    always = ["global", *(f"upstream:{name}" for name in config.upstreams)]
    reading: dict[str, dict[str, Any]] = {
        "queued": dict.fromkeys(always, 0),
        "oldest_wait_s": dict.fromkeys(always, 0.0),
        "running": dict.fromkeys(always, 0),
        "cooldowns": dict.fromkeys(config.upstreams, 0.0),
    }
    scheduler = app.get(SCHEDULER)
    if scheduler is None:
        return reading
    snapshot = scheduler.snapshot()
    for name, scope in snapshot.scopes.items():
        reading["queued"][name] = scope.queued
        reading["oldest_wait_s"][name] = scope.oldest_wait_s
        reading["running"][name] = scope.running
    reading["cooldowns"].update(snapshot.cooldowns)
    return reading
