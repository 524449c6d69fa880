"""Two proxy replicas sharing one ledger (SQLite file, and PostgreSQL as in production): a key
delivered to both at once still executes once."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from mcp import Client
from mcp.shared.exceptions import MCPError

from tests import ledger_fixtures
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.proxy_harness import running_proxy

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url

KEY = "interlock/idempotency-key"


upstream = mcp_proxy_harness.module_upstream


async def deliver(url: str, args: dict[str, Any], key: str) -> str:
    async with Client(url, mode="legacy") as client:
        try:
            result = await client.call_tool("send_email", args, meta={KEY: key})
        except MCPError as exc:
            outcome = f"error {exc.error.code}"
        else:
            replayed = (result.meta or {}).get("interlock/replayed")
            outcome = "replay" if replayed else "executed"
    return outcome


async def test_two_replicas_racing_one_key_execute_it_once(
    upstream: RunningUpstream, ledger_url: str, tmp_path: Path
):
    """Twelve deliveries of one key, alternating between two replicas on one ledger: one
    execution; the rest are answered in-progress (-32051) or replayed."""
    upstream.reset()
    config = f"""
        ledger: {{url: "{ledger_url}"}}
        upstreams:
          up: {{mcp: "{upstream.url}"}}
        """
    async with contextlib.AsyncExitStack() as stack:
        first = await stack.enter_async_context(running_proxy(config, tmp_path / "a"))
        second = await stack.enter_async_context(running_proxy(config, tmp_path / "b"))
        urls = [first.mcp_url("up"), second.mcp_url("up")]
        args = {"to": "ops@example.com", "subject": "once, whatever the replica"}
        outcomes = await asyncio.gather(
            *(deliver(urls[i % 2], args, "replica-race") for i in range(12))
        )
    assert outcomes.count("executed") == 1, outcomes
    assert set(outcomes) <= {"executed", "replay", "error -32051"}, outcomes
    assert upstream.stats()["emails_by_key"] == {"replica-race": 1}
