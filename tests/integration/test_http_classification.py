"""Which HTTP calls are side effects, end to end: only a declared model provider has inference
endpoints (matched exactly), and rules and classification see the path the upstream receives."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.integration import fake_provider
from tests.integration.fake_provider import FakeProvider
from tests.integration.http_calls import post
from tests.integration.proxy_harness import running_proxy

provider = fake_provider.provider


def config(provider: FakeProvider, kind: str | None = None, extra: str = "") -> str:
    declared = f"kind: {kind}" if kind else ""
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 0.3, deadline_s: 5}}
        upstreams:
          fake:
            http: "{provider.url}"
            {declared}
            retry: {{max_attempts: 3, base_delay_s: 0.01}}
        {extra}
        """


@pytest.mark.parametrize("kind", [None, "openai"])
async def test_a_thread_message_that_answers_late_runs_once_and_is_unknown(
    provider: FakeProvider, tmp_path: Path, kind: str | None
) -> None:
    """`POST /v1/threads/t1/messages` only ends like an inference path: it is a side effect, so
    when it acts and answers after the attempt timeout it is `unknown`, never sent again."""
    provider.action_gate = asyncio.Event()  # the upstream acts at once and answers late
    path = "/http/fake/v1/threads/t1/messages"
    async with running_proxy(config(provider, kind), tmp_path) as proxy:
        status, _, body = await post(proxy, {"content": "hi"}, "msg-1", path=path)
        assert (status, json.loads(body)["error"]["reason"]) == (504, "outcome_unknown")
        assert provider.executions["msg-1"] == 1
        entry, _ = await proxy.store.get("msg-1")
        assert (entry.state, entry.tool) == ("unknown", "POST /v1/threads/t1/messages")
        status, _, body = await post(proxy, {"content": "hi"}, "msg-1", path=path)
        assert (status, json.loads(body)["error"]["state"]) == (409, "unknown")
        provider.action_gate.set()
    assert provider.executions["msg-1"] == 1
