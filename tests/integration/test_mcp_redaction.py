"""Per-rule `redact`: the named argument fields are never stored in clear (the ledger keeps their
sha256) nor served by `/admin`, yet still tell two calls apart through the fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

import aiohttp
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from tests.integration import mcp_proxy_harness
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.proxy_harness import running_proxy

KEY = "interlock/idempotency-key"
SECRET = "the merger closes friday"


upstream = mcp_proxy_harness.module_upstream


def _config(upstream: RunningUpstream) -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db"}}
        upstreams:
          up: {{mcp: "{upstream.url}"}}
        tools:
          - match: "up/send_*"
            side_effect: true
            redact: [body, attachments.0.content]
    """


async def test_redacted_fields_are_kept_as_hashes_and_still_fingerprinted(
    upstream: RunningUpstream, tmp_path: Path
):
    """The ledger and /admin show `to` but only a sha256 for `body`; the same key with another
    body is still a mismatch (the fingerprint covers the real value)."""
    upstream.reset()
    args = {"to": "ceo@example.com", "subject": "q3", "body": SECRET}
    async with (
        running_proxy(_config(upstream), tmp_path) as proxy,
        Client(proxy.mcp_url("up"), mode="legacy") as client,
    ):
        await client.call_tool("send_email", args, meta={KEY: "r-1"})
        with pytest.raises(MCPError) as caught:
            await client.call_tool("send_email", {**args, "body": "other"}, meta={KEY: "r-1"})
        assert caught.value.error.code == -32602
        entry, _ = await proxy.store.get("r-1")
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{proxy.base}/admin/ledger/{entry.id}") as answer,
        ):
            served = await answer.text()
    assert entry.arguments is not None
    stored = json.loads(entry.arguments)
    assert stored["to"] == "ceo@example.com"
    assert stored["body"].startswith("sha256:")
    assert SECRET not in entry.arguments
    assert SECRET not in served
    assert upstream.stats()["emails_total"] == 1
