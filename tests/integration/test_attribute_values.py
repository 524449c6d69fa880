"""Request attribute values are checked at the edge, on both paths: an over-long or unprintable
tenant, run, class or idempotency key is a 400 / -32602 `bad_<attribute>`, and the call is neither
sent nor recorded (real HTTP and MCP clients → proxy → fake provider / real MCPServer)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration import fake_provider, mcp_proxy_harness
from tests.integration.fake_provider import FakeProvider
from tests.integration.http_calls import post
from tests.integration.mcp_proxy_harness import RawMcp
from tests.integration.mcp_servers import RunningUpstream
from tests.integration.proxy_harness import RunningProxy, running_proxy

provider = fake_provider.provider
http = mcp_proxy_harness.http

BAD_VALUES = [
    ("tenant", "t" * 129, "bad_tenant"),
    ("tenant", "acme\tcorp", "bad_tenant"),
    ("run", "r" * 129, "bad_run"),
    ("run", "run\u2028two", "bad_run"),
    ("class", "c" * 129, "bad_class"),
    ("idempotency-key", "k" * 256, "bad_idempotency_key"),
    ("idempotency-key", "key\u200bx", "bad_idempotency_key"),
]
HEADERS = {
    "tenant": "X-Interlock-Tenant",
    "run": "X-Interlock-Run",
    "class": "X-Interlock-Class",
    "idempotency-key": "Idempotency-Key",
}


upstream = mcp_proxy_harness.module_upstream


def http_config(provider: FakeProvider) -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db"}}
        upstreams:
          fake: {{http: "{provider.url}"}}
        """


async def raw_post(proxy: RunningProxy, header: bytes) -> tuple[int, Any]:
    """A POST with one raw header line (bytes an HTTP client library would not send)."""
    host, port = proxy.base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    body = b'{"n": 1}'
    writer.write(
        b"POST /http/fake/v1/actions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n%s\r\n\r\n%s"
        % (len(body), header, body)
    )
    await writer.drain()
    async with asyncio.timeout(10):
        answer = await reader.read()
    writer.close()
    head, _, content = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(content)


@pytest.mark.parametrize(("attribute", "value", "reason"), BAD_VALUES)
async def test_a_bad_header_value_is_a_400_and_nothing_is_sent_or_recorded(
    provider: FakeProvider, tmp_path: Path, attribute: str, value: str, reason: str
) -> None:
    """Over 128 characters (keys 255), or holding a control or separator character: 400."""
    async with running_proxy(http_config(provider), tmp_path) as proxy:
        status, _, body = await post(proxy, {"n": 1}, headers={HEADERS[attribute]: value})
        assert (status, json.loads(body)["error"]["reason"]) == (400, reason)
        assert await proxy.store.list_entries() == []
    assert provider.count() == 0


async def test_a_header_that_is_not_utf8_is_a_bad_attribute(
    provider: FakeProvider, tmp_path: Path
) -> None:
    """Bytes that are not UTF-8 (they arrive as lone surrogates) make a bad tenant, not a row."""
    async with running_proxy(http_config(provider), tmp_path) as proxy:
        status, body = await raw_post(proxy, b"X-Interlock-Tenant: acme\xff")
        assert (status, body["error"]["reason"]) == (400, "bad_tenant")
        assert await proxy.store.list_entries() == []
    assert provider.count() == 0


@pytest.mark.parametrize(
    ("attribute", "value", "reason"),
    [
        *BAD_VALUES,
        ("tenant", "acme\ud800", "bad_tenant"),
        ("run", "\x00", "bad_run"),
        ("idempotency-key", "key\x7f", "bad_idempotency_key"),
    ],
)
async def test_a_bad_meta_value_is_a_32602_and_nothing_is_sent_or_recorded(
    upstream: RunningUpstream,
    tmp_path: Path,
    http: aiohttp.ClientSession,
    attribute: str,
    value: str,
    reason: str,
) -> None:
    """The same values in `_meta` (lone surrogates and NUL too, which JSON can carry) answer
    -32602 with `bad_<attribute>`; the tool does not run and no entry is written."""
    upstream.reset()
    text = f"""
        ledger: {{url: "sqlite:///ledger.db"}}
        upstreams:
          up: {{mcp: "{upstream.url}"}}
        """
    async with running_proxy(text, tmp_path) as proxy:
        raw = RawMcp(http, proxy.mcp_url("up"))
        await raw.initialize()
        meta = {f"interlock/{attribute}": value}
        params = {"name": "charge", "arguments": {"amount": 1}, "_meta": meta}
        answer = await raw.post(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        )
        assert await proxy.store.list_entries() == []
    error = answer.last["error"]
    assert (error["code"], error["data"]["reason"]) == (-32602, reason)
    assert upstream.stats()["calls"] == {}
