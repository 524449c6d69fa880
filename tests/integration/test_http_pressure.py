"""Upstream pressure through the model-API proxy: shared cooldowns, Retry-After, waiting callers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests import prometheus_text
from tests.integration import fake_provider
from tests.integration.fake_provider import (
    Behaviour,
    FakeProvider,
    wait_until,
)
from tests.integration.proxy_harness import RunningProxy, running_proxy

BOUNDED_S = 10.0
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def config(provider: FakeProvider, upstream_extra: str = "") -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 2, deadline_s: 10}}
        upstreams:
          fake:
            http: "{provider.url}"
            kind: openai
            retry: {{max_attempts: 3, base_delay_s: 0.01}}
            {upstream_extra}
        """


provider = fake_provider.provider


@pytest.fixture
async def proxy(provider: FakeProvider, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    async with running_proxy(config(provider), tmp_path) as running:
        yield running


async def post_chat(
    proxy: RunningProxy, headers: dict[str, str] | None = None, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{proxy.base}/http/fake/v1/chat/completions", json=body or CHAT, headers=headers
        ) as response,
    ):
        async with asyncio.timeout(BOUNDED_S):
            content = await response.read()
        return response.status, dict(response.headers), content


async def test_429_burst_puts_the_upstream_in_cooldown_and_nothing_reaches_it(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """After one 429 with Retry-After: 2 every caller is refused by the proxy during the cooldown,
    with a Retry-After reflecting the remaining time, and the fake receives nothing more."""
    provider.script("429:retry-after:2")
    status, headers, _ = await post_chat(proxy)
    assert status == 429
    assert headers["Retry-After"] == "2"
    burst = await asyncio.gather(*(post_chat(proxy) for _ in range(20)))
    assert provider.count() == 1
    for status, headers, body in burst:
        assert status == 429
        assert 1 <= int(headers["Retry-After"]) <= 2
        assert b'"reason": "cooldown"' in body
        assert b'"scope": "upstream:fake"' in body
    assert proxy.scheduler.cooldown_remaining("fake") > 0


async def test_sdk_retry_honours_the_proxy_retry_after(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """The OpenAI SDK's own retry waits for the proxy's Retry-After, then succeeds; the fake's
    second request comes only after the cooldown."""
    provider.script("429:retry-after:2")
    async with openai.AsyncOpenAI(
        base_url=f"{proxy.base}/http/fake/v1", api_key="k", max_retries=2
    ) as client:
        async with asyncio.timeout(BOUNDED_S):
            completion = await client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
    assert completion.choices[0].message.content == "Hello there."
    first, second = provider.received
    assert second.at - first.at >= 1.9


@pytest.mark.parametrize(
    "style", ["retry-after", "retry-after-date", "retry-after-ms", "openai", "anthropic"]
)
@pytest.mark.parametrize("status", [429, 503, 529])
async def test_every_header_style_starts_a_cooldown(
    proxy: RunningProxy, provider: FakeProvider, style: str, status: int
) -> None:
    """Retry-After (seconds or date), retry-after-ms, OpenAI and Anthropic reset headers on 429,
    503 and 529 all cool the upstream down; the caller is told when to come back (429: the
    cooldown ends within its deadline)."""
    provider.script(Behaviour(kind="pressure", status=status, style=style, delay_s=3.0))  # type: ignore[arg-type]
    answered, headers, _ = await post_chat(proxy)
    assert answered == 429
    assert 1 <= int(headers["Retry-After"]) <= 3
    assert proxy.scheduler.cooldown_remaining("fake") > 1.0
    again, _, _ = await post_chat(proxy)
    assert again == answered
    assert provider.count() == 1


@pytest.mark.parametrize(("should_retry", "expected_requests"), [(False, 1), (True, 2)])
async def test_x_should_retry_is_honoured(
    proxy: RunningProxy, provider: FakeProvider, should_retry: bool, expected_requests: int
) -> None:
    """A background call waits out the cooldown and retries, unless the upstream said
    x-should-retry: false, which the caller then sees too."""
    provider.script(
        Behaviour(
            kind="pressure", status=429, style="retry-after", delay_s=1.0, should_retry=should_retry
        )
    )
    status, headers, _ = await post_chat(proxy, {"X-Interlock-Class": "background"})
    assert provider.count() == expected_requests
    if should_retry:
        assert status == 200
    else:
        assert status == 429
        assert headers["x-should-retry"] == "false"


async def test_cooldown_past_the_deadline_is_a_503(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """A cooldown longer than the caller's deadline is answered 503 with Retry-After at once;
    a caller whose deadline outlasts it gets 429."""
    provider.script("429:retry-after:5")
    await post_chat(proxy)
    started = time.monotonic()
    short, headers, body = await post_chat(
        proxy, {"X-Interlock-Deadline-Ms": "1000", "X-Interlock-Class": "background"}
    )
    assert short == 503
    assert time.monotonic() - started < 1.0
    assert 4 <= int(headers["Retry-After"]) <= 5
    assert b'"reason": "cooldown"' in body
    longer, _, _ = await post_chat(proxy, {"X-Interlock-Deadline-Ms": "8000"})
    assert longer == 429
    assert provider.count() == 1


async def stream_bytes(proxy: RunningProxy, headers: dict[str, str]) -> bytes:
    body = {**CHAT, "stream": True}
    status, _, content = await post_chat(proxy, headers, body)
    assert status == 200
    return content


async def test_streaming_caller_waiting_for_a_cooldown_sees_sse_comments(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """A streaming background call that waits out a cooldown is sent `: waiting_for_dependency`
    before the upstream's stream, and the SDK still reads the stream normally."""
    provider.script("429:retry-after:1")
    await post_chat(proxy, body={**CHAT, "stream": True})
    content = await stream_bytes(proxy, {"X-Interlock-Class": "background"})
    assert content.startswith(b": waiting_for_dependency\n\n")
    assert content.rstrip().endswith(b"data: [DONE]")
    provider.script("429:retry-after:1")
    await post_chat(proxy, body={**CHAT, "stream": True})
    async with openai.AsyncOpenAI(
        base_url=f"{proxy.base}/http/fake/v1",
        api_key="k",
        max_retries=0,
        default_headers={"X-Interlock-Class": "background"},
    ) as client:
        stream = await client.chat.completions.create(**CHAT, stream=True)  # type: ignore[call-overload]
        async with asyncio.timeout(BOUNDED_S):
            parts = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p or "" for p in parts) == "part0 part1 part2 "


ONE_SLOT = "limits: {max_running: 1, max_pending: 4, max_wait_s: 5}"


async def queued_behind(
    proxy: RunningProxy, provider: FakeProvider, first: str, second: str, held_s: float = 0.0
) -> tuple[bytes, bytes]:
    """A streaming call of class `first` takes the upstream's one slot (its stream held open), a
    second of class `second` queues behind it; `held_s` later the first stream goes on. Both
    streams' bytes."""
    provider.gate_streams = True
    running = asyncio.create_task(stream_bytes(proxy, {"X-Interlock-Class": first}))
    await wait_until(lambda: provider.count() == 1)
    queued = asyncio.create_task(stream_bytes(proxy, {"X-Interlock-Class": second}))
    await wait_until(lambda: proxy.scheduler.snapshot().scopes["upstream:fake"].queued == 1)
    await asyncio.sleep(held_s)  # the queued call waits at least this long
    provider.first_chunk_seen.set()
    async with asyncio.timeout(BOUNDED_S):
        one, two = await asyncio.gather(running, queued)
    return one, two


async def test_streaming_caller_queued_behind_a_full_upstream_sees_queued(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """With the upstream's one slot taken, a streaming background call is told `: queued` and is
    served when the slot frees."""
    async with running_proxy(config(provider, ONE_SLOT), tmp_path) as proxy:
        one, two = await queued_behind(proxy, provider, "background", "background")
    assert not one.startswith(b":")
    assert two.startswith(b": queued\n\n")
    assert two.rstrip().endswith(b"data: [DONE]")


async def test_a_queued_calls_wait_is_measured_under_its_work_class(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """`interlock_queue_wait_seconds` is per upstream and work class: a background call queued
    behind an interactive one shows its wait under `class="background"`, the interactive call's
    none under `class="interactive"`."""
    async with running_proxy(config(provider, ONE_SLOT), tmp_path) as proxy:
        await queued_behind(proxy, provider, "interactive", "background", held_s=0.03)
        async with aiohttp.ClientSession() as http, http.get(f"{proxy.base}/metrics") as answer:
            text = await answer.text()
    samples = prometheus_text.samples(text)

    def series(name: str, work_class: str, **more: str) -> float:
        return samples[
            (name, tuple(sorted({"class": work_class, "upstream": "fake", **more}.items())))
        ]

    assert series("interlock_queue_wait_seconds_count", "background") == 1
    assert series("interlock_queue_wait_seconds_sum", "background") >= 0.03
    assert series("interlock_queue_wait_seconds_bucket", "background", le="0.025") == 0
    assert series("interlock_queue_wait_seconds_count", "interactive") == 1
    assert series("interlock_queue_wait_seconds_bucket", "interactive", le="0.005") == 1


async def test_model_call_lost_before_the_first_byte_is_retried(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """A model call (not side-effecting) whose connection dies before any answer byte is retried
    on a fresh admission and succeeds; the caller never sees the failed attempt."""
    provider.script("die")
    status, _, body = await post_chat(proxy)
    assert status == 200
    assert b"Hello there." in body
    assert provider.count() == 2
