"""The tools/call pipeline end to end: real SDK Client → proxy (in-process) → real MCPServer."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from proxy.state import LEDGER
from tests import prometheus_text
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import RawMcp
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.proxy_harness import running_proxy
from tests.integration.waiting import wait_until

KEY = "interlock/idempotency-key"


upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
def fresh(upstream: RunningUpstream) -> RunningUpstream:
    upstream.reset()
    return upstream


def config(upstream: RunningUpstream, extra: str = "", limits: str = "") -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 5, deadline_s: 10}}
        upstreams:
          up:
            mcp: "{upstream.url}"
            {limits}
        {extra}
        """


async def call(
    url: str, tool: str, args: dict[str, Any], *, key: str | None = None, cls: str | None = None
) -> Any:
    meta = {KEY: key} if key else {}
    if cls:
        meta["interlock/class"] = cls
    async with Client(url, mode="legacy") as client:
        try:
            return await client.call_tool(tool, args, meta=meta)
        except MCPError as exc:
            error = exc  # raised outside the client, where anyio does not wrap it in a group
    raise error


def error_of(exc: MCPError) -> tuple[int, dict[str, Any]]:
    data = exc.error.data if isinstance(exc.error.data, dict) else {}
    return exc.error.code, data


async def test_duplicate_delivery_serially_executes_once(fresh: RunningUpstream, tmp_path: Path):
    """The same key sent twice executes once; the second answer is a replay marked in _meta."""
    async with running_proxy(config(fresh), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        args = {"to": "a@example.com", "subject": "hi", "body": "x"}
        async with Client(url, mode="legacy") as client:
            first = await client.call_tool("send_email", args, meta={KEY: "k-serial"})
            second = await client.call_tool("send_email", args, meta={KEY: "k-serial"})
    assert fresh.stats()["emails_by_key"] == {"k-serial": 1}
    assert first.content == second.content
    assert (second.meta or {}).get("interlock/replayed") is True
    assert not (first.meta or {}).get("interlock/replayed")


async def test_duplicate_delivery_concurrently_executes_once(
    fresh: RunningUpstream, tmp_path: Path
):
    """Ten concurrent deliveries of one key: one execution, the rest in-progress or replays."""
    async with running_proxy(config(fresh), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        args = {"to": "b@example.com", "subject": "once"}

        async def deliver() -> str:
            try:
                result = await call(url, "send_email", args, key="k-conc")
            except MCPError as exc:
                code, data = error_of(exc)
                assert code == -32051, (code, data)
                assert data["reason"] == "in_progress"
                return "in_progress"
            return "replay" if (result.meta or {}).get("interlock/replayed") else "executed"

        outcomes = await asyncio.gather(*(deliver() for _ in range(10)))
    assert outcomes.count("executed") == 1, outcomes
    assert fresh.stats()["emails_by_key"] == {"k-conc": 1}


async def test_same_key_other_arguments_is_refused(fresh: RunningUpstream, tmp_path: Path):
    """A key reused with different arguments answers -32602 idempotency_key_mismatch, unsent."""
    async with running_proxy(config(fresh), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        await call(url, "send_email", {"to": "c@x", "subject": "1"}, key="k")
        with pytest.raises(MCPError) as caught:
            await call(url, "send_email", {"to": "c@x", "subject": "2"}, key="k")
    code, data = error_of(caught.value)
    assert code == -32602
    assert data["reason"] == "idempotency_key_mismatch"
    assert fresh.stats()["emails_total"] == 1


async def test_overflow_is_refused_and_upstream_never_exceeds_its_limit(
    fresh: RunningUpstream, tmp_path: Path
):
    """50 concurrent calls against max_running 4 / max_pending 8: ≤ 4 at once, overflow refused."""
    limits = "limits: {max_running: 4, max_pending: 8, max_wait_s: 5}"
    async with running_proxy(config(fresh, limits=limits), tmp_path) as proxy:
        url = proxy.mcp_url("up")

        async def one(i: int) -> Any:
            try:
                await call(url, "hold", {"seconds": 0.3, "tag": f"t{i}"}, cls="background")
            except MCPError as exc:
                return error_of(exc)
            return "ok"

        outcomes = await asyncio.gather(*(one(i) for i in range(50)))
    refusals = [o for o in outcomes if o != "ok"]
    assert fresh.stats()["max_running"] <= 4
    assert refusals, "the overflow must be refused"
    assert len(outcomes) - len(refusals) >= 4
    for code, data in refusals:
        assert code == -32050
        assert data["reason"] in {"overloaded", "deadline"}
        assert data["retry_after_s"] > 0


async def test_upstream_429_starts_a_shared_cooldown(fresh: RunningUpstream, tmp_path: Path):
    """After HTTP 429 with Retry-After: 2 the upstream receives no call until the cooldown ends.

    The interactive caller that met the 429 is refused with the remaining time (interactive work
    fails fast); a background caller waits the cooldown out, told `waiting_for_dependency`, and
    is served after it; nothing reaches the upstream while the cooldown lasts.
    """
    async with running_proxy(config(fresh), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        states: list[str] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            states.append(message or "")

        async with Client(url, mode="legacy") as first, Client(url, mode="legacy") as patient:
            await first.list_tools()
            fresh.control(reject_next=1, status=429, retry_after="2", methods=["tools/call"])
            before = fresh.stats()["calls"].get("search_docs", 0)
            with pytest.raises(MCPError) as refused:
                await first.call_tool("search_docs", {"query": "a"})
            code, data = error_of(refused.value)
            assert code == -32050
            assert data["reason"] == "cooldown"
            assert 0 < data["retry_after_s"] <= 2
            assert proxy.scheduler.cooldown_remaining("up") > 0
            waiting = asyncio.create_task(
                patient.call_tool(
                    "search_docs",
                    {"query": "b"},
                    progress_callback=progress,
                    meta={"interlock/class": "background"},
                )
            )
            while proxy.scheduler.cooldown_remaining("up") > 0.05:
                assert fresh.stats()["calls"].get("search_docs", 0) == before
                await asyncio.sleep(0.1)
            result = await asyncio.wait_for(waiting, 10)
    assert not result.is_error
    assert "waiting_for_dependency" in states
    assert fresh.stats()["calls"]["search_docs"] == before + 1


async def test_timeout_becomes_unknown_and_blocks_the_key_until_resolved(
    fresh: RunningUpstream, tmp_path: Path
):
    """A timeout after sending → -32053 unknown; the key is refused until resolve --as retry."""
    extra = """
        tools:
          - match: "up/hold"
            side_effect: true
            timeout_s: 0.3
        """
    async with running_proxy(config(fresh, extra=extra), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        args = {"seconds": 1.0, "tag": "slow"}
        with pytest.raises(MCPError) as caught:
            await call(url, "hold", args, key="pay-1")
        code, data = error_of(caught.value)
        assert code == -32053
        assert data["state"] == "unknown"
        entry_id = data["entry_id"]
        with pytest.raises(MCPError) as again:
            await call(url, "hold", args, key="pay-1")
        code, data = error_of(again.value)
        assert code == -32052
        assert data["state"] == "unknown"
        assert data["entry_id"] == entry_id
        await proxy.store.resolve(entry_id, as_="retry", note="checked", actor="test")
        fast = {"seconds": 0.01, "tag": "slow"}
        with pytest.raises(MCPError) as mismatch:
            await call(url, "hold", fast, key="pay-1")
        assert error_of(mismatch.value)[0] == -32602
        async with Client(url, mode="legacy") as client:
            # The retry is sent again; the 0.3 s attempt timeout still applies, so it ends unknown.
            with pytest.raises(MCPError) as retried:
                await client.call_tool("hold", args, meta={KEY: "pay-1"})
        assert error_of(retried.value)[0] == -32053
        entry, history = await proxy.store.get(entry_id)
    assert entry.attempt == 2
    assert fresh.stats()["started"].count("slow") == 2
    assert [str(h.to_state) for h in history].count("running") == 2


async def test_ledger_down_fails_closed_for_side_effects_only(
    fresh: RunningUpstream, tmp_path: Path
):
    """With the ledger's database unreachable, side effects get -32054 unsent; reads still pass."""
    down = config(fresh).replace(
        'url: "sqlite:///ledger.db"', 'url: "postgresql+asyncpg://postgres@127.0.0.1:9/none"'
    )
    async with running_proxy(down, tmp_path) as proxy:
        assert proxy.app[LEDGER].store is None
        url = proxy.mcp_url("up")
        with pytest.raises(MCPError) as caught:
            await call(url, "send_email", {"to": "d@x", "subject": "s"})
        # No tools/list from this client: the proxy lists the tools itself to learn that
        # search_docs is read-only before falling back to "side-effecting".
        read = await call(url, "search_docs", {"query": "q"})
    code, data = error_of(caught.value)
    assert code == -32054
    assert data["reason"] == "ledger_unavailable"
    assert fresh.stats()["emails_total"] == 0
    assert not read.is_error


async def test_reject_as_tool_error_answers_an_is_error_result(
    fresh: RunningUpstream, tmp_path: Path
):
    """With reject_as: tool_error, a refusal is an isError result carrying the data object."""
    extra = """
        tools:
          - match: "up/send_email"
            side_effect: true
            reject_as: tool_error
        """
    async with running_proxy(config(fresh, extra=extra), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        await call(url, "send_email", {"to": "e@x", "subject": "1"}, key="z")
        result = await call(url, "send_email", {"to": "e@x", "subject": "2"}, key="z")
    assert result.is_error is True
    assert result.structured_content is not None
    assert result.structured_content["reason"] == "idempotency_key_mismatch"
    assert "other arguments" in result.content[0].text


async def test_queued_call_reports_progress_states(fresh: RunningUpstream, tmp_path: Path):
    """A background call that waits tells its progress callback `queued`, then `running`."""
    limits = "limits: {max_running: 1, max_pending: 4, max_wait_s: 5}"
    async with running_proxy(config(fresh, limits=limits), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        messages: list[str] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            messages.append(message or "")

        async with Client(url, mode="legacy") as busy, Client(url, mode="legacy") as waiter:
            holder = asyncio.create_task(busy.call_tool("hold", {"seconds": 0.5, "tag": "h"}))
            deadline = time.monotonic() + 5
            while proxy.scheduler.snapshot() and time.monotonic() < deadline:
                if "h" in fresh.stats()["started"]:
                    break
                await asyncio.sleep(0.02)
            result = await waiter.call_tool(
                "search_docs",
                {"query": "q"},
                progress_callback=progress,
                meta={"interlock/class": "background"},
            )
            await holder
    assert not result.is_error
    assert messages[:2] == ["queued", "running"], messages


async def test_observe_mode_refuses_nothing_but_records_would_reject(
    fresh: RunningUpstream, tmp_path: Path
):
    """In observe mode calls over the limit still run (the decision is only traced and counted)."""
    limits = "limits: {max_running: 1, max_pending: 0}"
    async with running_proxy(
        config(fresh, extra="mode: observe", limits=limits), tmp_path
    ) as proxy:
        url = proxy.mcp_url("up")
        results = await asyncio.gather(
            *(call(url, "hold", {"seconds": 0.2, "tag": f"o{i}"}) for i in range(4))
        )
    assert all(not r.is_error for r in results)
    assert fresh.stats()["max_running"] >= 2


async def test_rate_limit_refuses_interactive_calls_over_the_rate(
    fresh: RunningUpstream, tmp_path: Path
):
    """A tenant limited to 1 call/s: the second immediate call is refused `rate_limited`, unsent."""
    extra = """
        limits:
          tenant: {max_running: 32, rate_per_s: 1, burst: 1}
        """
    async with running_proxy(config(fresh, extra=extra), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        async with Client(url, mode="legacy") as client:
            await client.call_tool("send_email", {"to": "r@x", "subject": "1"})
            with pytest.raises(MCPError) as refused:
                await client.call_tool("send_email", {"to": "r@x", "subject": "2"})
    code, data = error_of(refused.value)
    assert code == -32050
    assert data["reason"] == "rate_limited"
    assert data["scope"] == "tenant:default"
    assert 0 < data["retry_after_s"] <= 1
    assert fresh.stats()["emails_total"] == 1


@pytest.mark.parametrize("bad", ["NaN", '"\\ud800"'], ids=["nan", "lone-surrogate"])
async def test_arguments_without_a_canonical_form_are_invalid_params_in_a_batch_too(
    fresh: RunningUpstream, tmp_path: Path, bad: str
):
    """NaN, or a lone surrogate (JSON text can escape one; UTF-8 cannot carry it), has no
    canonical JSON: that element answers -32602 and is never sent; its batch sibling still runs
    and gets its own answer."""
    async with running_proxy(config(fresh), tmp_path) as proxy, aiohttp.ClientSession() as http:
        raw = RawMcp(http, proxy.mcp_url("up"))
        await raw.initialize()
        good = {"to": "n@x", "subject": "fine"}
        batch = (
            '[{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": '
            '{"name": "send_email", "arguments": ' + json.dumps(good) + "}},"
            '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": '
            '{"name": "send_email", "arguments": {"to": "n@x", "subject": ' + bad + "}}}]"
        )
        answer = await raw.post(batch.encode())
    assert answer.status == 200
    by_id = {m["id"]: m for m in (json.loads(x) for x in answer.messages) if "id" in m}
    if not by_id:  # a JSON array body
        by_id = {m["id"]: m for m in answer.json()}
    assert "result" in by_id[1]
    assert by_id[2]["error"]["code"] == -32602
    assert by_id[2]["error"]["data"]["reason"] == "invalid_arguments"
    assert fresh.stats()["emails_total"] == 1


async def test_a_retry_after_429_is_the_next_ledger_attempt(fresh: RunningUpstream, tmp_path: Path):
    """A side-effecting call that met a 429 (certainly not executed) and waited the cooldown out
    is retried as attempt 2 of the same entry: the history shows the released attempt 1."""
    async with running_proxy(config(fresh), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        fresh.control(reject_next=1, status=429, retry_after="1", methods=["tools/call"])
        result = await call(
            url, "send_email", {"to": "w@x", "subject": "s"}, key="k-429", cls="background"
        )
        entry, history = await proxy.store.get("k-429")
    assert not result.is_error
    assert (str(entry.state), entry.attempt) == ("succeeded", 2)
    moves = [(str(h.from_state), str(h.to_state)) for h in history]
    assert moves == [
        ("None", "running"),
        ("running", "rejected"),
        ("rejected", "running"),
        ("running", "succeeded"),
    ]
    assert fresh.stats()["emails_by_key"] == {"k-429": 1}


async def test_a_tool_error_is_recorded_failed_and_replayed_as_itself(
    fresh: RunningUpstream, tmp_path: Path
):
    """The tool answered `isError: true` (it ran, and failed): the entry is `failed`, and the
    same key replays that answer without running the tool again."""
    async with running_proxy(config(fresh), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        first = await call(url, "decline_charge", {"amount": 5}, key="k-declined")
        again = await call(url, "decline_charge", {"amount": 5}, key="k-declined")
        entry, _ = await proxy.store.get("k-declined")
    assert first.is_error
    assert again.is_error
    assert [c.text for c in again.content] == [c.text for c in first.content]
    assert "card declined for 5" in first.content[0].text
    assert str(entry.state) == "failed"
    assert fresh.stats()["calls"]["decline_charge"] == 1


async def test_metrics_count_admissions_outcomes_and_first_byte(
    fresh: RunningUpstream, tmp_path: Path
):
    """/metrics shows the admissions, the idempotency outcomes (new, replayed), the
    admission-to-answer histogram and the queue waits per work class of the MCP calls that were
    driven."""
    async with running_proxy(config(fresh), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        args = {"to": "m@x", "subject": "metrics"}
        await call(url, "send_email", args, key="k-metrics")
        await call(url, "send_email", args, key="k-metrics", cls="background")
        async with aiohttp.ClientSession() as http, http.get(f"{proxy.base}/metrics") as answer:
            text = await answer.text()
    samples = prometheus_text.samples(text)

    def value(name: str, **labels: str) -> float:
        return sum(
            v
            for (n, ls), v in samples.items()
            if n == name and all((k, w) in ls for k, w in labels.items())
        )

    assert value("interlock_admission_decisions_total", decision="admitted", upstream="up") == 2
    assert value("interlock_idempotency_outcomes_total", outcome="new", upstream="up") == 1
    assert value("interlock_idempotency_outcomes_total", outcome="replayed", upstream="up") == 1
    assert value("interlock_admission_to_first_byte_seconds_count", upstream="up") == 1
    # queue waits per work class: the SRE's "is interactive work waiting?"
    wait = "interlock_queue_wait_seconds_count"
    assert value(wait, upstream="up", **{"class": "interactive"}) == 1
    assert value(wait, upstream="up", **{"class": "background"}) == 1


async def test_a_call_that_never_waits_gets_only_the_upstreams_progress(
    fresh: RunningUpstream, tmp_path: Path
):
    """No queueing, no cooldown: the client's progress callback sees exactly what the server
    reported (the proxy invented a `running` notification before it, then the server's own
    values went backwards)."""
    async with running_proxy(config(fresh), tmp_path) as proxy:
        seen: list[tuple[float, str | None]] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            seen.append((value, message))

        async with Client(proxy.mcp_url("up"), mode="legacy") as client:
            result = await client.call_tool(
                "slow_progress", {"steps": 3}, progress_callback=progress
            )
    assert not result.is_error
    assert seen == [(1, "step 1"), (2, "step 2"), (3, "step 3")]


@pytest.mark.parametrize("era", ["legacy", "2026-07-28"])
async def test_progress_keeps_increasing_when_a_queued_call_reports_its_own_from_zero(
    fresh: RunningUpstream, tmp_path: Path, era: str
):
    """A call that waited was told `queued` and `running` (0.001, 0.002); the server then reports
    0, 1, 2 on the same token: the client still sees a strictly increasing sequence (the server's
    0 is lifted just above the proxy's last value), with every message of the server's."""
    limits = "limits: {max_running: 1, max_pending: 4, max_wait_s: 5}"
    async with running_proxy(config(fresh, limits=limits), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        seen: list[tuple[float, str | None]] = []

        async def progress(value: float, total: float | None, message: str | None) -> None:
            seen.append((value, message))

        async with Client(url, mode="legacy") as busy, Client(url, mode=era) as waiter:
            holder = asyncio.create_task(busy.call_tool("hold", {"seconds": 0.5, "tag": "z"}))
            await wait_until(lambda: "z" in fresh.stats()["started"])
            result = await waiter.call_tool(
                "slow_progress",
                {"steps": 3, "start": 0},
                progress_callback=progress,
                meta={"interlock/class": "background"},
            )
            await holder
    assert not result.is_error
    values = [value for value, _ in seen]
    assert values == sorted(values)
    assert len(set(values)) == len(values), values
    assert [message for _, message in seen] == ["queued", "running", "step 1", "step 2", "step 3"]
