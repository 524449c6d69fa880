"""Per-tenant token budgets through the model-API proxy, counted from real SDK-shaped answers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import anthropic
import openai
import pytest

from proxy.http.pipeline import TOKEN_BUDGET
from tests.integration import fake_provider
from tests.integration.fake_provider import FakeProvider
from tests.integration.proxy_harness import RunningProxy, running_proxy

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGE = {"model": "c", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


provider = fake_provider.provider


@pytest.fixture
async def proxy(provider: FakeProvider, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    text = f"""
        ledger: {{url: "sqlite:///ledger.db"}}
        budgets: {{tokens: 30, window_s: 60}}
        upstreams:
          fake: {{http: "{provider.url}", kind: openai}}
          claude: {{http: "{provider.url}", kind: anthropic}}
        """
    async with running_proxy(text, tmp_path) as running:
        yield running


def openai_for(proxy: RunningProxy, tenant: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{proxy.base}/http/fake/v1",
        api_key="k",
        max_retries=0,
        default_headers={"X-Interlock-Tenant": tenant},
    )


async def test_budget_refuses_with_reason_and_time_until_the_window_frees(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """Once a tenant's counted tokens reach the budget, its next model call is a 429 with reason
    `budget` and a Retry-After of about the window; another tenant is unaffected."""
    async with openai_for(proxy, "acme") as acme, openai_for(proxy, "globex") as globex:
        for _ in range(3):  # 14 tokens each: 14, 28 (< 30, allowed), 42
            await acme.chat.completions.create(**CHAT)  # type: ignore[call-overload]
        with pytest.raises(openai.RateLimitError) as caught:
            await acme.chat.completions.create(**CHAT)  # type: ignore[call-overload]
        await globex.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    error = caught.value.body
    assert isinstance(error, dict)
    assert (error["reason"], error["scope"]) == ("budget", "tenant:acme")
    assert 55 <= error["retry_after_s"] <= 60
    assert 55 <= int(caught.value.response.headers["Retry-After"]) <= 60
    assert provider.count() == 4
    assert proxy.app[TOKEN_BUDGET].used("acme") == 42


async def test_stream_usage_is_counted_from_the_final_chunk(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """An OpenAI stream's usage chunk and an Anthropic stream's start/delta usage are counted."""
    async with openai_for(proxy, "acme") as client:
        stream = await client.chat.completions.create(
            **CHAT, stream=True, stream_options={"include_usage": True}
        )  # type: ignore[call-overload]
        async for _ in stream:
            pass
    assert proxy.app[TOKEN_BUDGET].used("acme") == 14
    async with anthropic.AsyncAnthropic(
        base_url=f"{proxy.base}/http/claude",
        api_key="k",
        max_retries=0,
        default_headers={"X-Interlock-Tenant": "initech"},
    ) as claude:
        async with claude.messages.stream(**MESSAGE) as stream:  # type: ignore[arg-type]
            await stream.get_final_message()
        assert proxy.app[TOKEN_BUDGET].used("initech") == 13  # 9 in + 4 out
        await claude.messages.create(**MESSAGE)  # type: ignore[arg-type]
        assert proxy.app[TOKEN_BUDGET].used("initech") == 26
        await claude.messages.create(**MESSAGE)  # type: ignore[arg-type]
        with pytest.raises(anthropic.RateLimitError):
            await claude.messages.create(**MESSAGE)  # type: ignore[arg-type]
    assert provider.count() == 4


async def test_budget_does_not_apply_to_non_model_calls(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """A tenant over its token budget can still make calls that are not model inference."""
    proxy.app[TOKEN_BUDGET].record("acme", 1000)
    async with openai_for(proxy, "acme") as client:
        models = await client.models.list()
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert [m.id for m in models.data] == ["fake-model"]
    assert provider.count() == 1
