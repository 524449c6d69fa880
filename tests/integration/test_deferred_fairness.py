"""Fairness with deferred work, counted (never timed): a flood of deferred bulk jobs takes only
what the interactive band's share and critical's reserve leave, so interactive calls that arrive
meanwhile are all admitted up to their share."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp

from proxy.runtime.deferred import DEFERRED
from tests.integration import fake_provider
from tests.integration.fake_provider import FakeProvider, wait_until
from tests.integration.proxy_harness import running_proxy
from tests.integration.waiting import cancelled_at_exit

BOUNDED_S = 15.0
FLOOD = 30
provider = fake_provider.provider


def _config(provider: FakeProvider) -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db"}}
        deferred: {{poll_interval_s: 0.05}}
        defaults: {{timeout_s: 30, deadline_s: 60}}
        limits:
          tenant: {{max_running: 100, max_pending: 100}}
        upstreams:
          fake:
            http: "{provider.url}"
            limits: {{max_running: 10}}
            retry: {{max_attempts: 1}}
        """


async def _post(
    http: aiohttp.ClientSession, url: str, key: str, headers: dict[str, str]
) -> tuple[int, Any]:
    async with asyncio.timeout(BOUNDED_S):
        async with http.post(
            url, json={"k": key}, headers={"Idempotency-Key": key, **headers}
        ) as r:
            return r.status, await r.json()


def _started(provider: FakeProvider, prefix: str) -> int:
    return sum(n for key, n in provider.executions.items() if key.startswith(prefix))


async def test_a_flood_of_deferred_bulk_jobs_leaves_interactive_calls_their_share(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """Upstream limit 10: thirty deferred bulk jobs start 3 (10 minus interactive's 6 and
    critical's 1) and no more while they run; six interactive calls then all start at once
    (none refused), and a seventh is refused since the upstream is full — the jobs never took
    the interactive share."""
    provider.gates = {name: asyncio.Event() for name in ("live-", "job-", "int-")}
    async with running_proxy(_config(provider), tmp_path) as proxy, aiohttp.ClientSession() as http:
        url = f"{proxy.base}/http/fake/v1/actions"
        tenant = {"X-Interlock-Tenant": "acme"}
        live = [
            asyncio.create_task(
                _post(http, url, f"live-{i}", {**tenant, "X-Interlock-Class": "critical"})
            )
            for i in range(10)
        ]
        calls: list[asyncio.Task[Any]] = list(live)
        async with cancelled_at_exit(calls):
            await wait_until(lambda: _started(provider, "live-") == 10, BOUNDED_S)
            bulk = {**tenant, "X-Interlock-Class": "bulk", "Prefer": "respond-async"}
            for i in range(FLOOD):
                status, _ = await _post(http, url, f"job-{i:02d}", bulk)
                assert status == 202
            provider.gates["live-"].set()
            await asyncio.gather(*live)
            await wait_until(lambda: _started(provider, "job-") == 3, BOUNDED_S)
            waiting, running = proxy.app[DEFERRED].in_hand
            assert running == 3
            assert waiting >= 1  # more jobs wait in the scheduler, and do not start
            interactive = {**tenant, "X-Interlock-Class": "interactive"}
            admitted = [
                asyncio.create_task(_post(http, url, f"int-{i}", interactive)) for i in range(6)
            ]
            calls.extend(admitted)
            await wait_until(lambda: _started(provider, "int-") == 6, BOUNDED_S)
            status, body = await _post(http, url, "int-extra", interactive)
            assert status == 429
            assert body["error"]["reason"] == "overloaded"
            assert _started(provider, "job-") == 3
            provider.gates["int-"].set()
            assert [(await task)[0] for task in admitted] == [201] * 6
            provider.gates["job-"].set()
            await wait_until(lambda: _started(provider, "job-") == FLOOD, BOUNDED_S)
