"""`ledger.commit_delay_ms` through the whole proxy: real SDK Client → proxy → real MCPServer.

A side-effecting call that arrives while another is at its upstream has its claim wait for that
call's outcome (and is not forwarded meanwhile: write-ahead holds), and both are written by one
commit: the ledger stamps every write of a commit with
the commit's one time, so the held call's `finished_at` equals the newcomer's `created_at`.
Without the delay the newcomer's claim commits at once, while the other call is still held.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from proxy.state import LEDGER
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.proxy_harness import running_proxy
from tests.integration.test_mcp_pipeline import call
from tests.integration.waiting import wait_until

upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
def fresh(upstream: RunningUpstream) -> RunningUpstream:
    upstream.reset()
    return upstream


def _config(upstream: RunningUpstream, delay_ms: float) -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 10, commit_delay_ms: {delay_ms}}}
        defaults: {{timeout_s: 5, deadline_s: 10}}
        upstreams:
          up: {{mcp: "{upstream.url}"}}
        tools:
          - {{match: "up/hold", side_effect: true}}
          - {{match: "up/send_email", side_effect: true}}
        """
    # Both tools classified by rules: the proxy has nothing to list before the newcomer's claim
    # (its own listing, in a child process, would take longer than the held call).


@pytest.mark.parametrize(("delay_ms", "shared"), [(1000, True), (0, False)])
async def test_a_call_arriving_while_another_is_held_shares_the_commit_of_its_outcome(
    fresh: RunningUpstream, tmp_path: Path, delay_ms: float, shared: bool
) -> None:
    async with running_proxy(_config(fresh, delay_ms), tmp_path) as proxy:
        url = proxy.mcp_url("up")
        held = asyncio.create_task(
            call(url, "hold", {"seconds": 0.6, "tag": "held"}, key="commit-held")
        )
        await wait_until(lambda: "held" in fresh.stats()["started"])
        newcomer_call = asyncio.create_task(
            call(url, "send_email", {"to": "c@example.com", "subject": "shared"}, key="commit-new")
        )
        if shared:  # its claim is held, not yet committed: the upstream must not have it yet
            await asyncio.sleep(0.25)
            assert "held" not in fresh.stats()["finished"]
            assert fresh.stats()["emails_by_key"] == {}, "forwarded before its claim committed"
        newcomer = await newcomer_call
        await held
        store = proxy.app[LEDGER].store
        assert store is not None
        held_entry, _ = await store.get("commit-held")
        new_entry, _ = await store.get("commit-new")
    assert not newcomer.is_error
    assert fresh.stats()["emails_by_key"] == {"commit-new": 1}
    assert (held_entry.state, new_entry.state) == ("succeeded", "succeeded")
    assert (held_entry.finished_at == new_entry.created_at) is shared, (held_entry, new_entry)
