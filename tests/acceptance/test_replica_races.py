"""Two `interlock serve` processes on one ledger (SQLite file and PostgreSQL) receive the same
keys at the same moment, for keys that are `rejected` (their previous call certainly did not run)
and `accepted` (an operator retried them): a counting upstream sees each key's next attempt
executed exactly once."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from ledger import EntryState, LedgerStore
from policies.model import LedgerSettings
from tests import ledger_fixtures
from tests.acceptance.test_proxy_crash import _free_port, proxy_process
from tests.integration.fake_provider import FakeProvider, running_provider

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url

pytestmark = pytest.mark.slow
KEYS = 60
BOUNDED_S = 60.0


def _config(folder: Path, port: int, ledger: str, upstream: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "interlock.yaml"
    path.write_text(
        f"""
listen: "127.0.0.1:{port}"
ledger: {{url: "{ledger}", lease_s: 10}}
defaults: {{timeout_s: 0.5, deadline_s: 10}}
limits:
  global: {{max_running: 512, max_pending: 1024}}
  tenant: {{max_running: 512, max_pending: 1024}}
upstreams:
  pay:
    http: "{upstream}"
    limits: {{max_running: 512, max_pending: 1024}}
    retry: {{max_attempts: 1}}
"""
    )
    return path


@contextlib.contextmanager
def _two_replicas(tmp_path: Path, ledger: str, upstream: str) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        urls = []
        for name in ("a", "b"):
            port = _free_port()
            stack.enter_context(proxy_process(_config(tmp_path / name, port, ledger, upstream)))
            urls.append(f"http://127.0.0.1:{port}/http/pay/v1/actions")
        yield urls


async def _post(http: aiohttp.ClientSession, url: str, key: str) -> int:
    async with http.post(
        url, json={"amount": 1, "key": key}, headers={"Idempotency-Key": key}
    ) as r:
        await r.read()
        return r.status


async def test_two_replicas_racing_rejected_and_retried_keys_execute_each_once(
    ledger_backend: ledger_fixtures.LedgerBackend, ledger_url: str, tmp_path: Path
) -> None:
    """Sixty keys refused (an upstream 429: rejected) and sixty whose call timed out and an
    operator retried (accepted) are each sent to both replicas at once: every key's next attempt
    runs exactly once at the upstream."""
    rejected = [f"rej-{i}" for i in range(KEYS)]
    retried = [f"acc-{i}" for i in range(KEYS)]
    provider = FakeProvider(keep_received=False)
    async with running_provider(provider), aiohttp.ClientSession() as http:
        with _two_replicas(tmp_path, ledger_url, provider.url) as (first, second):
            provider.script(*["429:retry-after:0"] * KEYS)
            statuses = await asyncio.gather(*(_post(http, first, key) for key in rejected))
            assert set(statuses) <= {429, 502}, statuses  # refused, or "upstream pressure"
            provider.plan.clear()  # calls refused by the cooldown left some 429s unused
            provider.action_gate = asyncio.Event()  # the upstream acts, then holds its answer
            statuses = await asyncio.gather(*(_post(http, first, key) for key in retried))
            assert set(statuses) == {504}
            provider.action_gate.set()
            await _resolve_retry(ledger_url, rejected, retried)

            sends = [_post(http, url, key) for key in rejected + retried for url in (first, second)]
            statuses = await asyncio.wait_for(asyncio.gather(*sends), BOUNDED_S)
            assert set(statuses) <= {201, 409}, statuses
    assert {key: provider.executions[key] for key in rejected} == dict.fromkeys(rejected, 1)
    assert {key: provider.executions[key] for key in retried} == dict.fromkeys(retried, 2)


async def _resolve_retry(url: str, rejected: list[str], retried: list[str]) -> None:
    """Check the entries are rejected / unknown, then retry each unknown one as an operator."""
    store = await LedgerStore.open(LedgerSettings(url=url), owner="operator", migrate=False)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BOUNDED_S
        while True:  # a refusal's record is written behind its answer
            states = {e.idempotency_key: e.state for e in await store.list_entries(limit=500)}
            if all(states.get(key) == EntryState.REJECTED for key in rejected):
                break
            assert loop.time() < deadline, states
            await asyncio.sleep(0.05)
        assert {states[key] for key in retried} == {EntryState.UNKNOWN}
        for key in retried:
            entry = await store.resolve(key, as_="retry", note="not in PSP", actor="test")
            assert entry.state == EntryState.ACCEPTED
    finally:
        await store.close()
