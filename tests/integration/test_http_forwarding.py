"""The model-API proxy end to end: real openai/anthropic SDKs → in-process proxy → fake provider."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anthropic
import openai
import pytest
from yarl import URL

from tests.integration import fake_provider
from tests.integration.fake_provider import FakeProvider
from tests.integration.proxy_harness import RunningProxy, running_proxy

SECRET = "sk-real-secret-from-config"
BOUNDED_S = 10.0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(provider: FakeProvider, extra: str = "", upstream_extra: str = "") -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db", lease_s: 5}}
        defaults: {{timeout_s: 1, deadline_s: 5}}
        max_body_bytes: 4096
        upstreams:
          fake:
            http: "{provider.url}"
            kind: openai
            headers: {{Authorization: "Bearer {SECRET}", x-api-key: "{SECRET}"}}
            retry: {{max_attempts: 1}}
            {upstream_extra}
          claude:
            http: "{provider.url}"
            kind: anthropic
            headers: {{x-api-key: "{SECRET}"}}
            retry: {{max_attempts: 1}}
          other:
            http: "{provider.url}/v1"
            kind: openai
          dead:
            http: "http://127.0.0.1:{closed_port()}"
        {extra}
        """


provider = fake_provider.provider


@pytest.fixture
async def proxy(provider: FakeProvider, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    async with running_proxy(config(provider), tmp_path) as running:
        yield running


def openai_client(proxy: RunningProxy, upstream: str = "fake") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{proxy.base}/http/{upstream}/v1", api_key="sk-dummy", max_retries=0
    )


def anthropic_client(proxy: RunningProxy) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=f"{proxy.base}/http/claude", api_key="dummy", max_retries=0
    )


async def test_openai_chat_through_proxy_with_injected_credentials(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """An unmodified OpenAI SDK call works; the upstream sees the configured key only."""
    async with openai_client(proxy) as client:
        completion = await client.chat.completions.create(
            model="gpt-test",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Interlock-Tenant": "acme"},
        )
    assert completion.choices[0].message.content == "Hello there."
    assert completion.usage is not None
    assert completion.usage.total_tokens == 14
    (seen,) = provider.received
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["Authorization"] == f"Bearer {SECRET}"
    assert "sk-dummy" not in json.dumps(seen.headers)
    assert not any(name.lower().startswith("x-interlock-") for name in seen.headers)
    assert seen.headers.get("Accept-Encoding") == "identity"


async def test_base_url_with_path_prefix(proxy: RunningProxy, provider: FakeProvider) -> None:
    """An upstream whose base URL ends in /v1 gets /v1/<path> (the path is relative to it)."""
    async with openai_client(proxy, upstream="other") as client:
        # base_url .../http/other/v1 → proxy path "v1/chat/completions" → upstream /v1/v1/...
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model="m", messages=[])
    assert provider.received[-1].path == "/v1/v1/chat/completions"
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{proxy.base}/http/other/models?limit=2") as response,
    ):
        assert response.status == 200
    assert (provider.received[-1].path, provider.received[-1].query) == ("/v1/models", "limit=2")


async def test_anthropic_messages_json_and_stream(proxy: RunningProxy) -> None:
    """The Anthropic SDK works unmodified, plain and streaming."""
    async with anthropic_client(proxy) as client:
        message = await client.messages.create(
            model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
        assert message.usage.output_tokens == 4
        async with client.messages.stream(
            model="claude-test", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            text = await stream.get_final_text()
    assert text == "part0 part1 part2 "


async def test_stream_chunks_arrive_before_the_stream_ends(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """The fake holds the rest of a stream until the client has seen the first chunk, so a proxy
    that buffered would stall the gate; measured first-chunk delays are printed, not asserted."""
    provider.gate_streams = True
    delays = {}
    for route, base in (("direct", f"{provider.url}/v1"), ("proxy", f"{proxy.base}/http/fake/v1")):
        provider.first_chunk_seen.clear()
        async with openai.AsyncOpenAI(base_url=base, api_key="k", max_retries=0) as client:
            started = time.perf_counter()
            stream = await client.chat.completions.create(
                model="m", messages=[], stream=True, stream_options={"include_usage": True}
            )
            parts = []
            async with asyncio.timeout(BOUNDED_S):
                async for chunk in stream:
                    if not parts:
                        delays[route] = time.perf_counter() - started
                        provider.first_chunk_seen.set()
                    parts.append(chunk)
        assert parts[-1].usage is not None
        assert parts[-1].usage.total_tokens == 14
        assert "".join(c.choices[0].delta.content or "" for c in parts if c.choices) == (
            "part0 part1 part2 "
        )
    assert provider.gate_timeouts == 0
    print(
        f"first chunk: direct {delays['direct'] * 1e3:.1f} ms, proxy {delays['proxy'] * 1e3:.1f} ms"
    )


async def test_mid_stream_death_ends_the_client_stream_with_an_error(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """When the upstream dies mid-stream the SDK raises promptly instead of hanging."""
    provider.script("die")
    async with openai_client(proxy) as client:
        stream = await client.chat.completions.create(model="m", messages=[], stream=True)
        seen: list[object] = []

        async def consume() -> None:
            async with asyncio.timeout(BOUNDED_S):
                async for chunk in stream:
                    seen.append(chunk)

        with pytest.raises((openai.APIError, openai.APIConnectionError)):
            await consume()
    assert len(seen) == 1


async def test_stalled_upstream_times_out(proxy: RunningProxy, provider: FakeProvider) -> None:
    """A stalled upstream answers 504 after the attempt timeout, not never."""
    provider.script("stall")
    async with openai_client(proxy) as client:
        with pytest.raises(openai.APIStatusError) as caught:
            async with asyncio.timeout(BOUNDED_S):
                await client.chat.completions.create(model="m", messages=[])
    assert caught.value.status_code == 504
    assert caught.value.body["reason"] == "upstream_timeout"  # type: ignore[index]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "reason"),
    [
        ("POST", "/http/fake/v1/chat/completions", b"{not json", {}, 400, "invalid_json"),
        ("POST", "/http/fake/v1/chat/completions", b"[1]", {}, 400, "invalid_request"),
        (
            "POST",
            "/http/fake/v1/actions",
            b"{",
            {"Content-Type": "application/json"},
            400,
            "invalid_json",
        ),
        ("POST", "/http/fake/v1/chat/completions", b"{}" + b" " * 5000, {}, 413, "body_too_large"),
        ("GET", "/http/nowhere/v1/models", b"", {}, 404, "unknown_upstream"),
        ("GET", "/http/fake/v1/%2e%2e/%2e%2e/admin", b"", {}, 400, "unsafe_path"),
        ("GET", "/http/fake/v1/a%2F..%2Fb", b"", {}, 400, "unsafe_path"),
        ("GET", "/http/fake//evil.example/x", b"", {}, 400, "unsafe_path"),
        ("GET", "/http/fake/http://evil.example/x", b"", {}, 400, "unsafe_path"),
        ("GET", "/http/fake/v1/models", b"", {"X-Interlock-Class": "vip"}, 400, "bad_class"),
    ],
)
async def test_bad_input_gets_a_specific_error_and_nothing_is_sent(
    proxy: RunningProxy,
    provider: FakeProvider,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    reason: str,
) -> None:
    """Malformed bodies, oversized bodies, unknown upstreams and escaping paths never leave."""
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, URL(f"{proxy.base}{path}", encoded=True), data=body or None, headers=headers
        ) as response,
    ):
        assert response.status == status
        answer = await response.json()
    assert answer["error"]["reason"] == reason
    assert provider.received == []


async def test_raw_dot_segments_never_reach_the_upstream(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """A request line with literal ../ (no client normalisation) is refused before sending."""
    host, port = proxy.base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(
            b"GET /http/fake/v1/../../secret HTTP/1.1\r\n"
            b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        await writer.drain()
        async with asyncio.timeout(BOUNDED_S):
            raw = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    assert raw.startswith(b"HTTP/1.1 400")
    assert provider.received == []


async def test_hop_by_hop_headers_are_not_forwarded(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """Connection-named and hop-by-hop request headers stop at the proxy; others pass."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{proxy.base}/http/fake/v1/models",
            headers={
                "Connection": "keep-alive, X-Hop",
                "X-Hop": "1",
                "X-End": "2",
                "TE": "trailers",
            },
        ) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/json")
    (seen,) = provider.received
    assert seen.headers.get("X-End") == "2"
    assert "X-Hop" not in seen.headers
    assert "TE" not in seen.headers


async def test_request_body_is_streamed_through(provider: FakeProvider, tmp_path: Path) -> None:
    """A body the proxy does not need to read (read-only by rule, not JSON, with a length) is
    streamed: the upstream sees its first bytes before the client has sent the rest."""
    rule = 'tools: [{match: "PUT /v1/blobs/*", side_effect: false}]'
    first, rest = b"a" * 1000, b"b" * 2000

    async def upload() -> AsyncIterator[bytes]:
        yield first
        async with asyncio.timeout(BOUNDED_S):
            await provider.blob_started.wait()
        yield rest

    async with running_proxy(config(provider, rule), tmp_path) as proxy:
        async with (
            aiohttp.ClientSession() as session,
            session.put(
                f"{proxy.base}/http/fake/v1/blobs/x",
                data=upload(),
                headers={"Content-Type": "application/octet-stream", "Content-Length": "3000"},
            ) as response,
        ):
            assert response.status == 200
            echo = await response.json()
        assert echo["bytes"] == 3000
        status, _ = await raw_put(proxy, b"c" * 5000)
        assert status == 413
    assert provider.count() == 1


async def raw_put(proxy: RunningProxy, body: bytes) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.put(
            f"{proxy.base}/http/fake/v1/blobs/y",
            data=body,
            headers={"Content-Type": "application/octet-stream"},
        ) as response,
    ):
        return response.status, await response.read()


async def test_head_request_is_relayed(proxy: RunningProxy, provider: FakeProvider) -> None:
    """A HEAD answer carries the upstream's headers and no body."""
    async with (
        aiohttp.ClientSession() as session,
        session.head(f"{proxy.base}/http/fake/v1/models") as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/json")
        assert await response.read() == b""
    assert provider.received[0].method == "HEAD"


async def test_observe_mode_counts_a_budget_refusal_without_enforcing_it(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """In observe mode a tenant over its token budget is still served."""
    text = config(provider, "mode: observe\n        budgets: {tokens: 10}")
    async with running_proxy(text, tmp_path) as proxy, openai_client(proxy) as client:
        for _ in range(3):
            await client.chat.completions.create(model="m", messages=[])
    assert provider.count() == 3


async def test_redirects_are_relayed_not_followed(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """An upstream redirect reaches the caller as-is; the proxy never follows it elsewhere."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{proxy.base}/http/fake/v1/redirect", allow_redirects=False) as response,
    ):
        assert response.status == 302
        assert response.headers["Location"] == "http://127.0.0.2:9/elsewhere"
    assert provider.count() == 1


async def test_unreachable_upstream_is_a_502(proxy: RunningProxy) -> None:
    """Connection refused (nothing sent, retried as policy allows) ends in 502."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{proxy.base}/http/dead/v1/models") as response,
    ):
        assert response.status == 502
        assert (await response.json())["error"]["reason"] == "upstream_unreachable"


async def test_query_string_reaches_the_upstream_byte_for_byte(
    proxy: RunningProxy, provider: FakeProvider
) -> None:
    """Percent-escapes in the query are forwarded as sent, never decoded on the way."""
    raw = "q=a%26admin%3Dtrue&x=%23frag&s=a%20b&p=100%25"
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{proxy.base}/http/fake/v1/models?{raw}") as response,
    ):
        assert response.status == 200
    assert provider.received[0].query == raw
