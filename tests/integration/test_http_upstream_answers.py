"""What an HTTP upstream's answer proves, and what a replay of it may say (aiohttp client →
proxy → fake provider / gateway)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from pathlib import Path

import pytest

from ledger import LedgerStore, sqlite_connect
from tests.integration import fake_provider
from tests.integration.fake_provider import FakeProvider, wait_until
from tests.integration.http_calls import post, settled
from tests.integration.proxy_harness import running_proxy
from tests.ledger_fixtures import sqlite_write_lock_in_another_process

provider = fake_provider.provider

TRANSFERS = "/http/gw/v1/transfers"
ACTIONS = "/http/gw/v1/actions"


def config(provider: FakeProvider, upstream_extra: str = "") -> str:
    """The fake provider as a generic upstream `gw` (more keys of it in `upstream_extra`)."""
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5, max_outcome_bytes: 4096}}
        defaults: {{timeout_s: 2, deadline_s: 5}}
        upstreams:
          gw:
            http: "{provider.url}"
            retry: {{max_attempts: 3, base_delay_s: 0.01}}
            {upstream_extra}
        """


async def test_a_gateway_503_after_the_backend_acted_is_unknown_and_never_resent(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """A generic upstream's 503 is no proof of "not executed": the transfer is not retried,
    its entry is `unknown` (504), and the same key is refused 409 until reconciled."""
    async with running_proxy(config(provider), tmp_path) as proxy:
        status, _, body = await post(proxy, {"amount": 100}, "tr-1", path=TRANSFERS)
        error = json.loads(body)["error"]
        assert (status, error["reason"], error["state"]) == (504, "outcome_unknown", "unknown")
        entry, _ = await proxy.store.get("tr-1")
        assert entry.state == "unknown"
        await wait_until(lambda: proxy.scheduler.cooldown_remaining("gw") == 0)  # its Retry-After
        status, _, body = await post(proxy, {"amount": 100}, "tr-1", path=TRANSFERS)
        assert (status, json.loads(body)["error"]["state"]) == (409, "unknown")
    assert provider.executions["tr-1"] == 1


async def test_a_503_declared_not_executed_releases_the_key(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """`not_executed_statuses: [503]`: the operator vouches for this upstream's 503, so the
    call is released (`rejected`) and refused with Retry-After."""
    declared = "not_executed_statuses: [503]"
    async with running_proxy(config(provider, declared), tmp_path) as proxy:
        status, headers, _ = await post(proxy, {"amount": 5}, "tr-2", path=TRANSFERS)
        assert (status, "Retry-After" in headers) == (429, True)
        entry, _ = await proxy.store.get("tr-2")
        assert entry.state == "rejected"


async def test_a_queued_streaming_side_effect_answered_in_json_keeps_its_real_answer(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """A side-effecting caller told `: queued` on an SSE stream, whose upstream then answers in
    JSON: the ledger keeps that real answer (not an empty body), the caller's stream carries it
    in an error event, and a repeat of its key replays it byte for byte."""
    limits = "limits: {max_running: 1, max_pending: 4, max_wait_s: 5}"
    streaming = {"X-Interlock-Class": "background", "Accept": "text/event-stream"}
    async with running_proxy(config(provider, limits), tmp_path) as proxy:
        provider.action_gate = asyncio.Event()
        first = asyncio.create_task(post(proxy, {"n": 1}, "hold-1", path=ACTIONS))
        await wait_until(lambda: provider.executions["hold-1"] == 1)
        second = asyncio.create_task(post(proxy, {"n": 2}, "sse-1", ACTIONS, streaming))
        await wait_until(lambda: proxy.scheduler.snapshot().scopes["upstream:gw"].queued == 1)
        provider.action_gate.set()
        await first
        status, headers, stream = await second
        entry = await settled(proxy, "sse-1", "succeeded")
        replayed = await post(proxy, {"n": 2}, "sse-1", path=ACTIONS)
    stored = json.loads(entry.outcome)
    assert stored["status"] == 201
    assert json.loads(base64.b64decode(stored["body"]))["echo"] == {"n": 2}
    assert replayed[0] == 201
    assert replayed[1]["Idempotent-Replayed"] == "true"
    assert json.loads(replayed[2])["echo"] == {"n": 2}
    assert (status, headers["Content-Type"]) == (200, "text/event-stream")
    assert stream.startswith(b": queued\n\n")
    event = json.loads(stream.split(b"data: ", 1)[1])
    assert (event["error"]["type"], event["error"]["status"]) == ("not_streamed", 201)
    assert event["error"]["body"]["echo"] == {"n": 2}
    assert provider.executions["sse-1"] == 1


async def test_a_finish_interrupted_by_shutdown_still_lands(
    provider: FakeProvider,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The upstream answered while the ledger could not be written, and the outcome is still
    being retried when shutdown begins (grace 0): the ledger comes back as it starts closing and
    the finish commits before it closes (`succeeded`, never left `running`). Another process
    holds SQLite's write lock past the busy timeout."""
    monkeypatch.setattr(sqlite_connect, "BUSY_TIMEOUT_MS", 200)
    text = config(provider) + "\n        shutdown_grace_s: 0\n"
    provider.action_gate = asyncio.Event()
    # The lock outlives the proxy: its holder exits only once released, as the ledger closes.
    async with contextlib.AsyncExitStack() as lock, running_proxy(text, tmp_path) as proxy:
        caller = asyncio.create_task(post(proxy, {"n": 1}, "fin-1", path=ACTIONS))
        await wait_until(lambda: provider.executions["fin-1"] == 1)  # claimed and forwarded
        url = proxy.config.ledger.url
        release = await lock.enter_async_context(sqlite_write_lock_in_another_process(url))
        provider.action_gate.set()  # it answers now, while the ledger cannot take the outcome
        await wait_until(lambda: "outcome not recorded yet" in caplog.text)
        real_close = proxy.store.close

        async def close_as_the_ledger_returns() -> None:
            release()  # the finish is still being retried as the ledger starts closing
            await real_close()

        monkeypatch.setattr(proxy.store, "close", close_as_the_ledger_returns)
    caller.cancel()
    await asyncio.gather(caller, return_exceptions=True)
    store = await LedgerStore.open(proxy.config.ledger, owner="test")
    try:
        entry, _ = await store.get("fin-1")
    finally:
        await store.close()
    assert entry.state == "succeeded"
    assert provider.executions["fin-1"] == 1
