"""Deferred work across a crash, with real processes: twenty background jobs accepted, the proxy
SIGKILLed while some run and the others wait; after a restart on the same ledger the waiting ones
run exactly once each, and the interrupted ones are `unknown` and refused on resend until an
operator resolves them."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.acceptance.test_proxy_crash import _free_port, interlock, proxy_process
from tests.integration.fake_provider import FakeProvider, running_provider
from tests.integration.waiting import cancelled_at_exit, wait_until

pytestmark = pytest.mark.slow
JOBS = 20
BOUNDED_S = 30.0
HEADERS = {"X-Interlock-Tenant": "acme", "X-Interlock-Class": "background"}


def _config(folder: Path, port: int, upstream: str) -> Path:
    path = folder / "interlock.yaml"
    path.write_text(
        f"""
listen: "127.0.0.1:{port}"
ledger: {{url: "sqlite:///ledger.db", lease_s: 1, sweep_interval_s: 0.2}}
deferred: {{poll_interval_s: 0.1}}
defaults: {{timeout_s: 60, deadline_s: 120}}
upstreams:
  pay:
    http: "{upstream}"
    limits: {{max_running: 4}}
    retry: {{max_attempts: 1}}
"""
    )
    return path


async def _post(
    http: aiohttp.ClientSession, url: str, key: str, extra: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Idempotency-Key": key, **HEADERS, **(extra or {})}
    async with asyncio.timeout(BOUNDED_S):
        async with http.post(url, json={"key": key}, headers=headers) as answer:
            return answer.status, dict(answer.headers), await answer.read()


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with asyncio.timeout(BOUNDED_S), http.get(url, headers=HEADERS) as answer:
        return answer.status, await answer.read()


async def _until(predicate: Any, what: str) -> None:
    await wait_until(predicate, BOUNDED_S, what=what, interval_s=0.05)


def _entries(config: Path, state: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = json.loads(
        interlock(config, "ledger", "list", "--state", state, "--json")
    )
    return listed


async def test_jobs_survive_a_sigkill_waiting_ones_run_once_interrupted_ones_are_unknown(
    tmp_path: Path,
) -> None:
    """Four live calls hold the upstream; twenty background calls with `Prefer: respond-async`
    are accepted (202). The live calls end, two jobs start (deferred work leaves the interactive
    share free) and hang at the upstream: SIGKILL. After a restart the eighteen waiting jobs run
    exactly once each (the upstream's own count) and answer their jobs; the two interrupted ones
    become `unknown`, are refused on resend (409, needs reconciliation) and resolved by an
    operator are no longer refused as such."""
    port = _free_port()
    provider = FakeProvider()
    provider.gates = {"live-": asyncio.Event(), "job-": asyncio.Event()}
    keys = [f"job-{i:02d}" for i in range(JOBS)]
    async with running_provider(provider), aiohttp.ClientSession() as http:
        config = _config(tmp_path, port, provider.url)
        base = f"http://127.0.0.1:{port}"
        url = f"{base}/http/pay/v1/actions"
        with proxy_process(config) as first:
            live = [asyncio.create_task(_post(http, url, f"live-{i}")) for i in range(4)]
            async with cancelled_at_exit(live):
                await _until(lambda: sum(provider.executions.values()) == 4, "live calls hold")
                locations = {}
                for key in keys:
                    status, headers, _ = await _post(http, url, key, {"Prefer": "respond-async"})
                    assert status == 202, key
                    locations[key] = headers["Location"]
                assert not any(provider.executions[key] for key in keys)
                provider.gates["live-"].set()
                await asyncio.gather(*live)
                await _until(
                    lambda: sum(provider.executions[key] for key in keys) == 2, "two jobs start"
                )
            interrupted = [key for key in keys if provider.executions[key]]
            first.send_signal(signal.SIGKILL)
            first.wait(timeout=10)
        provider.gates["job-"].set()  # the upstream finishes what it had; nobody hears it
        waiting = [key for key in keys if key not in interrupted]
        assert len(_entries(config, "accepted")) == len(waiting)

        with proxy_process(config) as second:
            for key in waiting:
                status, body = await _until_done(http, base + locations[key])
                assert status == 201, (key, body)
                assert body == provider.answers[key]
            assert {key: provider.executions[key] for key in keys} == dict.fromkeys(keys, 1)
            await _until(lambda: len(_entries(config, "unknown")) == 2, "leases expire")
            for key in interrupted:
                status, body = await _get(http, base + locations[key])
                assert status == 504
                assert json.loads(body)["error"]["state"] == "unknown"
                status, _, body = await _post(http, url, key)
                assert status == 409
                assert json.loads(body)["error"]["reason"] == "needs_reconciliation"
            first_interrupted = interrupted[0]
            interlock(config, "ledger", "resolve", first_interrupted, "--as", "succeeded")
            status, _, body = await _post(http, url, first_interrupted)
            assert status == 409
            assert json.loads(body)["error"]["reason"] == "outcome_not_retained"
            assert provider.executions[first_interrupted] == 1
            second.send_signal(signal.SIGTERM)
            assert second.wait(timeout=20) == 0


async def _until_done(http: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    deadline = time.monotonic() + BOUNDED_S
    while True:
        status, body = await _get(http, url)
        if status != 202:
            return status, body
        assert time.monotonic() < deadline, f"{url} never finished"
        await asyncio.sleep(0.1)
