"""A refusal of a side-effecting call is answered at once; its `rejected` record is written behind.

The ledger is made unable to commit by a second SQLite connection that holds the write lock
(`BEGIN IMMEDIATE`): the proxy's writer then waits on it. A refusal must still be answered while
the lock is held, and its record must land once the lock is released (or at graceful shutdown).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families

from ledger import ClaimRequest, EntryNotFound, LedgerStore
from policies.admission import Refusal
from policies.model import LedgerSettings
from proxy.runtime.rejections import RejectionRecorder
from proxy.state import LEDGER, RUNTIME
from tests.integration import fake_provider, mcp_proxy_harness
from tests.integration.fake_provider import FakeProvider
from tests.integration.http_calls import BOUNDED_S, post, settled
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.proxy_harness import RunningProxy, running_proxy
from tests.integration.waiting import wait_until

KEY = "interlock/idempotency-key"
provider = fake_provider.provider


upstream = mcp_proxy_harness.module_upstream


def mcp_config(upstream: RunningUpstream) -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 5, deadline_s: 10}}
        upstreams:
          up:
            mcp: "{upstream.url}"
        """


def http_config(provider: FakeProvider) -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 2, deadline_s: 120}}
        upstreams:
          fake:
            http: "{provider.url}"
            kind: openai
        """


@contextlib.contextmanager
def ledger_locked(folder: Path) -> Iterator[sqlite3.Connection]:
    """Hold the ledger file's write lock (released when the block ends, or earlier by rollback)."""
    other = sqlite3.connect(folder / "ledger.db", timeout=BOUNDED_S, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        yield other
    finally:
        if other.in_transaction:
            other.rollback()
        other.close()


async def refused_mcp(url: str, key: str) -> dict[str, Any]:
    """Send one side-effecting call that admission refuses; its error data (bounded wait)."""
    args = {"to": "r@x", "subject": key}
    async with asyncio.timeout(BOUNDED_S), Client(url, mode="legacy") as client:
        with pytest.raises(MCPError) as refused:
            await client.call_tool("send_email", args, meta={KEY: key})
    assert refused.value.error.code == -32050
    data = refused.value.error.data
    assert isinstance(data, dict)
    return data


async def entry_state(proxy: RunningProxy, key: str) -> str | None:
    try:
        entry, _ = await proxy.store.get(key)
    except EntryNotFound:
        return None
    return str(entry.state)


@contextlib.asynccontextmanager
async def mcp_proxy(upstream: RunningUpstream, folder: Path) -> AsyncIterator[RunningProxy]:
    upstream.reset()
    async with running_proxy(mcp_config(upstream), folder) as proxy:
        proxy.scheduler.start_cooldown("up", 60)
        yield proxy


async def test_mcp_refusal_is_answered_while_the_ledger_cannot_commit(
    upstream: RunningUpstream, tmp_path: Path
) -> None:
    """With the ledger's write lock held elsewhere, a refused side-effecting MCP call is answered
    (with its key, and no entry id it cannot vouch for); once the lock is released its `rejected`
    entry appears, and the tool never ran."""
    async with mcp_proxy(upstream, tmp_path) as proxy:
        with ledger_locked(tmp_path):
            data = await refused_mcp(proxy.mcp_url("up"), "k-mcp")
        assert (data["reason"], data["idempotency_key"]) == ("cooldown", "k-mcp")
        assert "entry_id" not in data
        entry = await _landed(proxy, "k-mcp")
    assert (str(entry.state), entry.attempt) == ("rejected", 0)
    assert upstream.stats()["emails_total"] == 0


async def test_http_refusal_is_answered_while_the_ledger_cannot_commit(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """With the ledger's write lock held elsewhere, a refused side-effecting HTTP call is answered
    429 with its key; once the lock is released its `rejected` entry appears; nothing was sent."""
    async with running_proxy(http_config(provider), tmp_path) as proxy:
        proxy.scheduler.start_cooldown("fake", 60)
        with ledger_locked(tmp_path):
            status, headers, body = await post(proxy, {"n": 1}, "k-http")
        error = json.loads(body)["error"]
        assert status == 429
        assert "Retry-After" in headers
        assert (error["reason"], error["idempotency_key"]) == ("cooldown", "k-http")
        assert "entry_id" not in error
        entry = await _landed(proxy, "k-http")
    assert str(entry.state) == "rejected"
    assert provider.count() == 0


async def test_graceful_shutdown_writes_the_pending_refusals(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """Refusals answered while the ledger could not commit are all in the ledger after a graceful
    shutdown: the backlog is drained before the ledger closes."""
    keys = [f"k-shut-{i}" for i in range(150)]
    async with running_proxy(http_config(provider), tmp_path) as proxy:
        proxy.scheduler.start_cooldown("fake", 60)
        settings = proxy.config.ledger
        lock = ledger_locked(tmp_path)
        lock.__enter__()
        try:
            answers = await asyncio.gather(*(post(proxy, {"k": k}, k) for k in keys))
            assert {status for status, _, _ in answers} == {429}
            runtime = proxy.app[RUNTIME]
            release_when_shutting_down = asyncio.create_task(_release_on_shutdown(runtime, lock))
        except BaseException:
            lock.__exit__(None, None, None)
            raise
    await asyncio.wait_for(release_when_shutting_down, BOUNDED_S)
    assert await _states_after_restart(settings, keys) == dict.fromkeys(keys, "rejected")
    assert provider.count() == 0


async def test_a_resend_after_the_record_landed_runs_as_the_next_attempt(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """A key refused (recorded `rejected` behind the answer) and sent again once the cooldown is
    over runs: the history reads rejected → running → succeeded, and the upstream acted once."""
    async with running_proxy(http_config(provider), tmp_path) as proxy:
        proxy.scheduler.start_cooldown("fake", 60)
        assert (await post(proxy, {"n": 1}, "k-again"))[0] == 429
        await _landed(proxy, "k-again")
        proxy.scheduler.end_cooldown("fake")
        assert (await post(proxy, {"n": 1}, "k-again"))[0] == 201
        entry = await settled(proxy, "k-again", "succeeded")
        _, history = await proxy.store.get("k-again")
    assert [str(h.to_state) for h in history] == ["rejected", "running", "succeeded"]
    assert (str(entry.state), entry.attempt) == ("succeeded", 1)
    assert provider.executions["k-again"] == 1


async def _landed(proxy: RunningProxy, key: str) -> Any:
    """The entry for `key` once its record has been written (bounded)."""
    deadline = asyncio.get_running_loop().time() + BOUNDED_S
    while (state := await entry_state(proxy, key)) is None:
        assert asyncio.get_running_loop().time() < deadline, f"{key} was never recorded"
        await asyncio.sleep(0.01)
    entry, _ = await proxy.store.get(key)
    assert str(entry.state) == state
    return entry


async def _release_on_shutdown(runtime: Any, lock: contextlib.AbstractContextManager[Any]) -> None:
    """Release the ledger's lock once shutdown has begun: the records are still pending then."""
    try:
        await wait_until(lambda: runtime.shutting_down, BOUNDED_S)
    finally:
        lock.__exit__(None, None, None)


async def _states_after_restart(settings: LedgerSettings, keys: list[str]) -> dict[str, str]:
    store = await LedgerStore.open(settings, owner="reader", migrate=False)
    try:
        entries = {key: (await store.get(key))[0] for key in keys}
    finally:
        await store.close()
    return {key: str(entry.state) for key, entry in entries.items()}


async def test_a_refusal_without_a_key_names_the_entry_written_behind_it(
    upstream: RunningUpstream, tmp_path: Path
) -> None:
    """A call without a key (`key: none`) always makes a new entry when refused: the refusal
    names its id before the write, and the `rejected` entry that lands has exactly that id."""
    upstream.reset()
    rule = """
        tools:
          - match: "up/send_email"
            side_effect: true
            key: none
        """
    async with running_proxy(mcp_config(upstream) + rule, tmp_path) as proxy:
        proxy.scheduler.start_cooldown("up", 60)
        with ledger_locked(tmp_path):
            async with asyncio.timeout(BOUNDED_S), Client(proxy.mcp_url("up")) as client:
                with pytest.raises(MCPError) as refused:
                    await client.call_tool("send_email", {"to": "n@x", "subject": "keyless"})
        data = refused.value.error.data
        assert isinstance(data, dict)
        assert "idempotency_key" not in data
        entry = await _landed(proxy, data["entry_id"])
    assert (entry.id, str(entry.state)) == (data["entry_id"], "rejected")


async def test_a_full_backlog_drops_the_record_counts_it_and_never_blocks(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """With the backlog full (the ledger cannot commit), another refusal's record is dropped at
    once (not queued, no id named) and counted in /metrics; the queued ones land once the ledger
    can commit again, and nothing is taken after the drain."""
    async with running_proxy(http_config(provider), tmp_path) as proxy:
        recorder = RejectionRecorder(proxy.app[LEDGER], backlog=2)
        refusal = Refusal("overloaded", "upstream:up", 1.0)
        with ledger_locked(tmp_path):
            queued = [recorder.record(_request(None, n), refusal) for n in range(2)]
            dropped = recorder.record(_request(None, 2), refusal)
            assert recorder.pending == 2
        await recorder.drain(BOUNDED_S)
        assert recorder.record(_request(None, 3), refusal) is None  # drained: closed
        states = {str((await proxy.store.get(str(i)))[0].state) for i in queued}
        samples = await _scrape(f"{proxy.base}/metrics")
    assert all(queued)
    assert dropped is None
    assert states == {"rejected"}
    # the one over the backlog, and the one after the drain
    assert samples[("interlock_ledger_rejections_unrecorded_total", (("why", "dropped"),))] == 2


async def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _request(key: str | None, n: int) -> ClaimRequest:
    return ClaimRequest(
        tenant="t",
        upstream="up",
        tool="send_email",
        idempotency_key=key,
        key_source="none" if key is None else "explicit",
        fingerprint=f"fp-{n}",
        arguments=None,
        work_class="interactive",
        run_id=None,
        trace_id=None,
        dedup_window_s=None,
    )
