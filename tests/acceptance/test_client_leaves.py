"""A client that leaves mid-call, against `interlock serve` itself (its own listener settings)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import aiohttp
import pytest

from tests.acceptance.test_proxy_crash import KEY, _serve_with_upstream, interlock
from tests.integration.mcp_proxy_harness import LEGACY, RawMcp
from tests.integration.waiting import wait_until


@pytest.mark.slow
async def test_a_legacy_call_whose_client_left_runs_on_and_is_recorded_succeeded(tmp_path: Path):
    """In the handshake era a dropped connection is not a cancellation: `serve` never cancels
    the handler (the pipeline runs in it), so the upstream finishes the side-effecting call and
    its entry ends `succeeded`, the outcome a retry with the same key replays."""
    with _serve_with_upstream(tmp_path, grace_s=10) as (upstream, config, _proxy, url):
        async with aiohttp.ClientSession() as leaving:
            raw = RawMcp(leaving, url)
            assert (await raw.initialize(LEGACY)).status == 200
            body = {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {
                    "name": "hold",
                    "arguments": {"seconds": 1.0, "tag": "left"},
                    "_meta": {KEY: "left"},
                },
            }
            call = asyncio.create_task(raw.post(body))
            await wait_until(
                lambda: "left" in upstream.stats()["started"],
                what="the call never reached the upstream",
            )
            call.cancel()  # the client stops reading; its connection closes with the session
            with contextlib.suppress(asyncio.CancelledError):
                await call

        def state() -> str:
            shown: dict[str, str] = json.loads(
                interlock(config, "ledger", "show", "left", "--json")
            )
            return shown["state"]

        await wait_until(lambda: state() != "running", 15.0, what="the entry stayed running")
        assert state() == "succeeded"
        assert upstream.stats()["finished"].count("left") == 1
        assert "left" not in upstream.stats()["cancelled"]
