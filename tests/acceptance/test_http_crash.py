"""The proxy killed with SIGKILL in the middle of a side-effecting HTTP call: the write-ahead
survives, the entry becomes `unknown`, and a resend with the same Idempotency-Key is refused
(409, state unknown) instead of executing again."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from tests.acceptance.test_proxy_crash import _free_port, proxy_process, unknown_entries
from tests.integration.fake_provider import FakeProvider, running_provider

pytestmark = pytest.mark.slow
BOUNDED_S = 20.0


async def test_sigkill_mid_http_call_leaves_unknown_and_the_resend_is_refused(
    tmp_path: Path,
) -> None:
    """`interlock serve` forwards a POST with an Idempotency-Key to a slow upstream and is killed
    with SIGKILL while the upstream works; after a restart the entry is `unknown` (attempt 1),
    and the resend gets 409 with state unknown: the upstream executed it once."""
    provider = FakeProvider()
    provider.action_gate = asyncio.Event()  # the upstream acts, then holds its answer
    async with running_provider(provider):
        port = _free_port()
        config = tmp_path / "interlock.yaml"
        config.write_text(
            f"""
listen: "127.0.0.1:{port}"
ledger: {{url: "sqlite:///ledger.db", lease_s: 1, sweep_interval_s: 0.2}}
upstreams:
  pay: {{http: "{provider.url}"}}
"""
        )
        url = f"http://127.0.0.1:{port}/http/pay/v1/actions"
        headers = {"Idempotency-Key": "charge-42"}
        body = {"amount": 500}
        async with aiohttp.ClientSession() as http:
            with proxy_process(config) as first:
                call = asyncio.create_task(http.post(url, json=body, headers=headers))
                deadline = time.monotonic() + BOUNDED_S
                while provider.executions["charge-42"] < 1:
                    assert time.monotonic() < deadline, "the call never reached the upstream"
                    await asyncio.sleep(0.02)
                first.send_signal(signal.SIGKILL)
                first.wait(timeout=BOUNDED_S)
                with pytest.raises(aiohttp.ClientError):
                    await asyncio.wait_for(call, BOUNDED_S)

            with proxy_process(config) as second:
                deadline = time.monotonic() + BOUNDED_S
                while not (entries := unknown_entries(config)):
                    assert time.monotonic() < deadline, "the expired lease never became unknown"
                    await asyncio.sleep(0.2)
                assert [(e["idempotency_key"], e["attempt"]) for e in entries] == [("charge-42", 1)]
                async with http.post(url, json=body, headers=headers) as resent:
                    answer = await resent.read()
                assert resent.status == 409, answer
                error = json.loads(answer)["error"]
                assert (error["state"], error["entry_id"]) == ("unknown", entries[0]["id"])
                second.send_signal(signal.SIGTERM)
                assert second.wait(timeout=BOUNDED_S) == 0
        provider.action_gate.set()
    assert provider.executions["charge-42"] == 1
