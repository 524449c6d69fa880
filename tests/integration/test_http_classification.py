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


SEND_RULES = """
        tools:
          - {match: "POST /send*", side_effect: true}
          - {match: "POST /*", side_effect: false}
"""


async def test_an_encoded_path_is_matched_by_the_rule_for_what_the_upstream_runs(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """`/s%65nd-mail` is `/send-mail` to the upstream, so the `POST /send*` rule governs it: it is
    ledgered under that path and a repeat with its key is a replay, not a second email."""
    async with running_proxy(config(provider, extra=SEND_RULES), tmp_path) as proxy:
        path = "/http/fake/s%65nd-mail"
        first = await post(proxy, {"to": "bob"}, "mail-1", path=path)
        second = await post(proxy, {"to": "bob"}, "mail-1", path=path)
        assert (first[0], second[0]) == (201, 201)
        assert second[1]["Idempotent-Replayed"] == "true"
        entry, _ = await proxy.store.get("mail-1")
        assert entry.tool == "POST /send-mail"
    assert provider.executions["mail-1"] == 1
    assert [r.path for r in provider.received] == ["/send-mail"]


async def test_an_encoded_inference_path_is_budgeted(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """`/v1/chat/completion%73` is the chat endpoint: its tokens count against the budget and
    the tenant over budget is refused there too."""
    budget = "budgets: {tokens: 20, window_s: 60}"
    async with running_proxy(config(provider, "openai", extra=budget), tmp_path) as proxy:
        chat = {"model": "m", "messages": []}
        assert (await post(proxy, chat, path="/http/fake/v1/chat/completions"))[0] == 200
        assert (await post(proxy, chat, path="/http/fake/v1/chat/completion%73"))[0] == 200
        status, _, body = await post(proxy, chat, path="/http/fake/v1/chat/completion%73")
        assert (status, json.loads(body)["error"]["reason"]) == (429, "budget")
    assert provider.count("/v1/chat/completions") == 2


@pytest.mark.parametrize(
    "tail",
    [
        "s%2565nd-mail",  # decodes to "s%65nd-mail": another decode would make it "send-mail"
        "v1/a%5Cb",
        "v1/a%2fb",
        "v1/%2E/actions",
        "v1/%2e%2e/v1/actions",
        "v1/a%zzb",
        "v1/%ff",
    ],
)
async def test_a_path_without_one_meaning_is_refused_before_anything_is_sent(
    provider: FakeProvider, tmp_path: Path, tail: str
) -> None:
    """Double encoding, encoded '/' or '\\', dot segments and broken escapes are a 400
    `unsafe_path`: the upstream is not contacted and nothing is recorded."""
    async with running_proxy(config(provider, extra=SEND_RULES), tmp_path) as proxy:
        status, _, body = await post(proxy, {"to": "bob"}, "odd-1", path=f"/http/fake/{tail}")
        assert (status, json.loads(body)["error"]["reason"]) == (400, "unsafe_path")
        assert await proxy.store.list_entries() == []
    assert provider.count() == 0
