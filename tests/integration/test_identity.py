"""Caller identity: with `tenants.api_keys`, the caller's key alone names the tenant. No key or an
unknown key is 401; a tenant header or `_meta` that names another tenant is 403 `tenant_mismatch`;
nothing reaches an upstream and no other tenant's outcome is replayed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration import fake_provider
from tests.integration.fake_provider import FakeProvider
from tests.integration.mcp_servers import RunningUpstream, running_upstream
from tests.integration.proxy_harness import RunningProxy, running_proxy

provider = fake_provider.provider
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
TEAM_A = {"Authorization": "Bearer key-a"}
TEAM_B = {"x-api-key": "key-b"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningUpstream]:
    with running_upstream(stateless=True) as running:
        yield running


def _config(upstream: RunningUpstream, provider: FakeProvider) -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db"}}
        tenants:
          api_keys: {{key-a: team-a, key-b: team-b}}
        upstreams:
          mail: {{mcp: "{upstream.url}"}}
          api: {{http: "{provider.url}", headers: {{Authorization: "Bearer upstream-secret"}}}}
    """


def _call(tool: str, arguments: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": arguments,
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                "io.modelcontextprotocol/clientCapabilities": {},
                **meta,
            },
        },
    }


def _mcp_headers(extra: dict[str, str], tool: str) -> dict[str, str]:
    return {
        **MCP_HEADERS,
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
        **extra,
    }


async def _post_action(
    http: aiohttp.ClientSession, proxy: RunningProxy, headers: dict[str, str], key: str
) -> tuple[int, Any]:
    url = f"{proxy.base}/http/api/v1/actions"
    async with http.post(
        url, json={"amount": 5}, headers={**headers, "Idempotency-Key": key}
    ) as answer:
        return answer.status, await answer.json()


async def test_a_key_cannot_act_as_another_tenant_over_http(
    tmp_path: Path, upstream: RunningUpstream, provider: FakeProvider
):
    """team-a's key with `X-Interlock-Tenant: team-b` and team-b's idempotency key is 403: team-b's
    stored outcome is not replayed and nothing is sent; team-a's own key still works as team-a."""
    async with (
        running_proxy(_config(upstream, provider), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        status, _ = await _post_action(http, proxy, TEAM_B, "b-1")
        assert status == 201
        sent = provider.count()
        forged = {**TEAM_A, "X-Interlock-Tenant": "team-b"}
        status, body = await _post_action(http, proxy, forged, "b-1")
        assert status == 403
        assert body["error"]["reason"] == "tenant_mismatch"
        assert provider.count() == sent
        same = {**TEAM_A, "X-Interlock-Tenant": "team-a"}
        status, _ = await _post_action(http, proxy, same, "a-1")
        assert status == 201
        entry, _ = await proxy.store.get("a-1")
        assert entry.tenant == "team-a"


async def test_no_key_or_an_unknown_key_is_401_and_nothing_is_forwarded(
    tmp_path: Path, upstream: RunningUpstream, provider: FakeProvider
):
    """Without a key (or with one nobody configured) neither route forwards anything — the
    upstream's injected credentials are never used on a stranger's behalf."""
    upstream.reset()
    async with (
        running_proxy(_config(upstream, provider), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        for headers in ({}, {"Authorization": "Bearer nope"}, {"x-api-key": "nope"}):
            async with http.get(f"{proxy.base}/http/api/v1/models", headers=headers) as answer:
                assert answer.status == 401
                body = await answer.json()
                assert answer.headers.get("WWW-Authenticate", "").startswith("Bearer")
            assert body["error"]["reason"] in ("missing_api_key", "unknown_api_key")
            call = _call("send_email", {"to": "a@b.c", "subject": "s", "body": "b"}, {})
            async with http.post(
                proxy.mcp_url("mail"), json=call, headers=_mcp_headers(headers, "send_email")
            ) as answer:
                assert answer.status == 401
        assert provider.count() == 0
    assert upstream.stats().get("mcp_requests", 0) == 0


async def test_meta_naming_another_tenant_is_refused_on_mcp(
    tmp_path: Path, upstream: RunningUpstream, provider: FakeProvider
):
    """`_meta` `interlock/tenant` naming another tenant is refused `tenant_mismatch` (not sent, not
    a replay of that tenant's outcome); the key's own tenant is recorded otherwise."""
    upstream.reset()
    args = {"to": "a@b.c", "subject": "s", "body": "b"}
    async with (
        running_proxy(_config(upstream, provider), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        own = _call("send_email", args, {"interlock/idempotency-key": "m-1"})
        async with http.post(
            proxy.mcp_url("mail"), json=own, headers=_mcp_headers(TEAM_B, "send_email")
        ) as answer:
            assert answer.status == 200
        forged = _call(
            "send_email", args, {"interlock/idempotency-key": "m-1", "interlock/tenant": "team-b"}
        )
        async with http.post(
            proxy.mcp_url("mail"), json=forged, headers=_mcp_headers(TEAM_A, "send_email")
        ) as answer:
            body = await answer.json()
        assert body["error"]["data"]["reason"] == "tenant_mismatch"
        entry, _ = await proxy.store.get("m-1")
        assert entry.tenant == "team-b"
    assert upstream.stats()["emails_total"] == 1
