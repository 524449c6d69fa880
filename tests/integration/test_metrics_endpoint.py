"""`GET /metrics` scraped and parsed: scheduler gauges, ledger counts read from the ledger."""

from __future__ import annotations

import asyncio
import contextlib
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import ClientSession, web
from prometheus_client.parser import text_string_to_metric_families

from ledger import ClaimRequest, LedgerStore
from policies.admission import AdmissionRequest
from policies.config import parse_config_text
from policies.model import Config
from proxy.runtime.scheduler import Scheduler
from proxy.state import CONFIG, LEDGER, SCHEDULER, LedgerHandle
from proxy.telemetry import metrics
from proxy.telemetry.metrics_route import METRICS, setup_metrics
from tests.clocks import ManualClock
from tests.integration.proxy_harness import running_proxy

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

CONFIG_TEXT = """
    ledger: {url: "sqlite:///ledger.db"}
    limits:
      global: {max_running: 1, max_pending: 4}
    upstreams:
      mail: {mcp: "http://127.0.0.1:9/mcp"}
      files: {mcp: "http://127.0.0.1:9/mcp"}
"""


def load(folder: Path) -> Config:
    return parse_config_text(
        textwrap.dedent(CONFIG_TEXT), str(folder / "i.yaml"), environ={}, base_dir=folder
    )


async def open_store(config: Config) -> LedgerStore:
    return await LedgerStore.open(config.ledger, owner="metrics-test")


@contextlib.asynccontextmanager
async def metrics_app(
    config: Config, store: LedgerStore | None, scheduler: Scheduler | None = None
) -> AsyncIterator[tuple[web.Application, str]]:
    """A minimal application with the real scheduler, the given ledger and `/metrics`."""
    app = web.Application()
    app[CONFIG] = config
    app[SCHEDULER] = scheduler or Scheduler(config)
    app[LEDGER] = LedgerHandle(store=store, error=None if store else "down for the test")
    setup_metrics(app, ledger_refresh_s=0)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield app, f"http://{host}:{port}/metrics"
    finally:
        await runner.cleanup()


async def scrape(url: str) -> Samples:
    async with ClientSession() as session, session.get(url) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def claim_request(key: str) -> ClaimRequest:
    return ClaimRequest(
        tenant="acme",
        upstream="mail",
        tool="send_email",
        idempotency_key=key,
        key_source="explicit",
        fingerprint="f" * 64,
    )


def entries(samples: Samples) -> dict[str, float]:
    return {
        dict(labels)["state"]: value
        for (name, labels), value in samples.items()
        if name == "interlock_ledger_entries"
    }


async def test_ledger_counts_come_from_the_ledger_and_survive_a_restart(tmp_path: Path) -> None:
    """Counts by state are read from the ledger, so a restarted proxy reports the same numbers."""
    config = load(tmp_path)
    store = await open_store(config)
    try:
        running = await store.claim(claim_request("k1"))
        lost = await store.claim(claim_request("k2"))
        await store.mark_unknown(lost.entry.id, lost.entry.fencing_token, reason="test timeout")
        async with metrics_app(config, store) as (_app, url):
            before = await scrape(url)
    finally:
        await store.close()
    assert running.kind == "new"
    assert entries(before)["running"] == 1
    assert entries(before)["unknown"] == 1
    assert entries(before)["blocked"] == 0
    assert before[("interlock_ledger_up", ())] == 1
    assert before[("interlock_ledger_oldest_unknown_age_seconds", ())] >= 0

    reopened = await open_store(config)  # a new process: nothing counted in memory
    try:
        async with metrics_app(config, reopened) as (_app, url):
            after = await scrape(url)
    finally:
        await reopened.close()
    assert entries(after) == entries(before)


async def test_ledger_counts_are_cached_between_refreshes(tmp_path: Path) -> None:
    """Scrapes within `ledger_refresh_s` reuse the last read; the next one after it re-reads."""
    config = load(tmp_path)
    store = await open_store(config)
    clock = ManualClock()
    try:
        async with metrics_app(config, store) as (app, url):
            app[METRICS].ledger_refresh_s = 5.0
            app[METRICS].clock = clock
            assert entries(await scrape(url))["running"] == 0
            await store.claim(claim_request("k1"))
            clock.now += 1
            assert entries(await scrape(url))["running"] == 0
            clock.now += 5
            assert entries(await scrape(url))["running"] == 1
    finally:
        await store.close()


async def test_unreachable_ledger_reports_down_not_zero(tmp_path: Path) -> None:
    """Without a ledger, `interlock_ledger_up` is 0 and no entry counts are invented."""
    async with metrics_app(load(tmp_path), None) as (_app, url):
        samples = await scrape(url)
    assert samples[("interlock_ledger_up", ())] == 0
    assert entries(samples) == {}


async def test_scheduler_gauges_show_running_queue_and_cooldown(tmp_path: Path) -> None:
    """Running, queue depth, oldest wait (per scope) and cooldowns come from the scheduler."""
    config = load(tmp_path)
    clock = ManualClock()
    scheduler = Scheduler(config, clock=clock)
    queued = asyncio.Event()

    async def on_wait(state: str) -> None:
        if state == "queued":
            queued.set()

    first = await scheduler.admit(
        AdmissionRequest("acme", "background", "mail", arrived_at=clock())
    )
    waiter = asyncio.create_task(
        scheduler.admit(
            AdmissionRequest("acme", "background", "mail", arrived_at=clock()), on_wait=on_wait
        )
    )
    try:
        await asyncio.wait_for(queued.wait(), 5)
        clock.now += 7
        scheduler.start_cooldown("files", 30)
        async with metrics_app(config, None, scheduler) as (_app, url):
            samples = await scrape(url)
    finally:
        first.release()
        second = await asyncio.wait_for(waiter, 5)
        second.release()
    assert samples[("interlock_running", (("scope", "global"),))] == 1
    assert samples[("interlock_queue_depth", (("scope", "global"),))] == 1
    assert samples[("interlock_queue_depth", (("scope", "upstream:mail"),))] == 1
    assert samples[("interlock_queue_oldest_wait_seconds", (("scope", "global"),))] == 7
    assert samples[("interlock_queue_depth", (("scope", "upstream:files"),))] == 0
    assert samples[("interlock_upstream_cooldown_active", (("upstream", "files"),))] == 1
    assert samples[("interlock_upstream_cooldown_active", (("upstream", "mail"),))] == 0


async def test_counters_are_scoped_to_the_application(tmp_path: Path) -> None:
    """Without `configure_telemetry`, each application counts from zero for its own lifetime."""
    config = load(tmp_path)
    for expected in (2, 2):
        async with metrics_app(config, None) as (_app, url):
            for _ in range(expected):
                metrics.refusal("overloaded", "global", "mail")
            samples = await scrape(url)
        labels = (("reason", "overloaded"), ("scope", "global"), ("upstream", "mail"))
        assert samples[("interlock_admission_refusals_total", labels)] == expected


async def test_metrics_token_is_required_when_its_variable_is_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`/metrics` lists tenant and run names: with the token variable set it answers 401
    without the bearer token and 200 with it; without the variable it stays open."""
    config = """
        ledger: {url: "sqlite:///ledger.db"}
        telemetry: {metrics_token_env: INTERLOCK_TEST_METRICS_TOKEN}
        upstreams:
          up: {mcp: "http://127.0.0.1:9/mcp"}
    """
    monkeypatch.setenv("INTERLOCK_TEST_METRICS_TOKEN", "scrape-me")
    async with running_proxy(config, tmp_path) as proxy, aiohttp.ClientSession() as http:
        async with http.get(f"{proxy.base}/metrics") as answer:
            assert answer.status == 401
        right = {"Authorization": "Bearer scrape-me"}
        async with http.get(f"{proxy.base}/metrics", headers=right) as answer:
            assert answer.status == 200
    monkeypatch.delenv("INTERLOCK_TEST_METRICS_TOKEN")
    async with (
        running_proxy(config, tmp_path) as proxy,
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.base}/metrics") as answer,
    ):
        assert answer.status == 200


async def test_waiting_deferred_work_is_counted_with_its_oldest_age(tmp_path: Path) -> None:
    """Deferred work waiting to start shows as `accepted` entries, with the age of the oldest;
    with none waiting the age series is absent."""
    config = load(tmp_path)
    store = await open_store(config)
    try:
        async with metrics_app(config, store) as (_app, url):
            idle = await scrape(url)
            for key in ("d1", "d2"):
                result = await store.deferred.defer(
                    claim_request(key), b"{}", max_per_tenant=10, max_per_upstream=10
                )
                assert result.kind == "accepted"
            waiting = await scrape(url)
    finally:
        await store.close()
    assert entries(idle)["accepted"] == 0
    assert ("interlock_ledger_oldest_accepted_age_seconds", ()) not in idle
    assert entries(waiting)["accepted"] == 2
    assert waiting[("interlock_ledger_oldest_accepted_age_seconds", ())] >= 0


def group_commits(samples: Samples) -> tuple[float, float] | None:
    """(commits, operations they carried) as scraped; None when neither is exported."""
    commits = samples.get(("interlock_ledger_commits_total", ()))
    operations = samples.get(("interlock_ledger_committed_operations_total", ()))
    if commits is None and operations is None:
        return None
    assert commits is not None, "operations counted without commits"
    assert operations is not None, "commits counted without operations"
    return commits, operations


async def test_group_commits_are_counted_with_the_operations_they_carried(tmp_path: Path) -> None:
    """An SRE reads the ledger's batching as operations per commit: writes one at a time take a
    commit each, writes that arrive together share one; both counters only ever grow."""
    config = load(tmp_path)
    store = await open_store(config)
    try:
        async with metrics_app(config, store) as (_app, url):
            start = group_commits(await scrape(url))
            assert start is not None
            for n in range(3):  # one at a time: three commits
                await store.claim(claim_request(f"alone-{n}"))
            alone = group_commits(await scrape(url))
            together = await asyncio.gather(
                *(store.claim(claim_request(f"t-{n}")) for n in range(8))
            )
            shared = group_commits(await scrape(url))
            stats = store.writer_stats
    finally:
        await store.close()
    assert alone is not None
    assert shared is not None
    assert (alone[0] - start[0], alone[1] - start[1]) == (3, 3)
    assert all(result.kind == "new" for result in together)
    assert shared[1] - alone[1] == 8
    assert 1 <= shared[0] - alone[0] < 8  # arriving in one loop turn, they shared commits
    assert shared == (stats.batches, stats.operations)  # what the writer itself counted


async def test_group_commits_are_absent_without_a_ledger(tmp_path: Path) -> None:
    """No ledger, no commit counters (never a zero that reads as 'nothing was written')."""
    async with metrics_app(load(tmp_path), None) as (_app, url):
        assert group_commits(await scrape(url)) is None
