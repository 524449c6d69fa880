"""Browsers: a foreign `Origin` or `Host` (DNS rebinding, cross-site requests) never reaches an
upstream or the operator API; admin POSTs need `Content-Type: application/json`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from ledger import ClaimRequest
from policies.config import parse_config_text
from proxy.app import create_app
from proxy.edge import GUARDED_PREFIXES, is_guarded
from tests.integration import fake_provider
from tests.integration.fake_provider import FakeProvider, running_provider
from tests.integration.mcp_servers import RunningUpstream, running_upstream
from tests.integration.proxy_harness import running_proxy

EVIL_HOST = "evil.example.com:8787"
EVIL_ORIGIN = "http://evil.example.com:8787"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "page", "version": "1"},
    },
}
SEND_EMAIL = {
    "jsonrpc": "2.0",
    "id": 2,
    "method": "tools/call",
    "params": {"name": "send_email", "arguments": {"to": "a@b.c", "subject": "s", "body": "b"}},
}
provider = fake_provider.provider
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningUpstream]:
    with running_upstream(stateless=True) as running:
        yield running


def _config(upstream_url: str, provider_url: str, extra: str = "") -> str:
    return f"""
        ledger: {{url: "sqlite:///ledger.db"}}
        admin: {{token_env: INTERLOCK_TEST_NO_SUCH_TOKEN}}
        upstreams:
          mail: {{mcp: "{upstream_url}"}}
          llm: {{http: "{provider_url}"}}
        {extra}
    """


def _claim(key: str) -> ClaimRequest:
    return ClaimRequest(
        tenant="acme",
        upstream="mail",
        tool="send_email",
        idempotency_key=key,
        key_source="explicit",
        fingerprint="f" * 64,
    )


async def test_dns_rebinding_to_mcp_is_refused_421_and_nothing_reaches_the_upstream(
    tmp_path: Path, upstream: RunningUpstream
):
    """A page that rebinds its name to the proxy (foreign Host) gets 421 on /mcp; no session,
    no send_email."""
    upstream.reset()
    async with (
        running_provider() as provider,
        running_proxy(_config(upstream.url, provider.url), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        rebound = {**MCP_HEADERS, "Host": EVIL_HOST, "Origin": EVIL_ORIGIN}
        for body in (INITIALIZE, SEND_EMAIL):
            async with http.post(proxy.mcp_url("mail"), json=body, headers=rebound) as answer:
                assert answer.status == 421
                error = await answer.json()
        assert error["error"]["data"]["reason"] == "host_not_allowed"
    stats = upstream.stats()
    assert stats["emails_total"] == 0
    assert stats.get("mcp_requests", 0) == 0


async def test_a_foreign_origin_is_refused_403_on_mcp_and_http(
    tmp_path: Path, upstream: RunningUpstream
):
    """A cross-site request (our Host, a foreign Origin) gets 403: a text/plain POST to a model API
    is not forwarded with the injected key, and /mcp opens no session."""
    upstream.reset()
    async with (
        running_provider() as provider,
        running_proxy(_config(upstream.url, provider.url), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        cross_site = {"Origin": "https://evil.example", "Content-Type": "text/plain"}
        url = f"{proxy.base}/http/llm/v1/chat/completions"
        body = b'{"model":"m","messages":[]}'
        async with http.post(url, data=body, headers=cross_site) as answer:
            assert answer.status == 403
            refusal = await answer.json()
        assert refusal["error"]["reason"] == "origin_not_allowed"
        headers = {**MCP_HEADERS, "Origin": "https://evil.example"}
        async with http.post(proxy.mcp_url("mail"), json=INITIALIZE, headers=headers) as answer:
            assert answer.status == 403
        assert provider.count() == 0
    assert upstream.stats().get("mcp_requests", 0) == 0


async def test_requests_without_origin_and_allowed_origins_and_hosts_pass(
    tmp_path: Path, upstream: RunningUpstream, provider: FakeProvider
):
    """No Origin (not a browser), an Origin in allowed_origins, localhost on any port and a Host
    in allowed_hosts all reach the upstream."""
    extra = """
        allowed_origins: ["https://console.example.com"]
        allowed_hosts: ["interlock.internal"]
    """
    async with (
        running_proxy(_config(upstream.url, provider.url, extra), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        url = f"{proxy.base}/http/llm/v1/models"
        for headers in (
            {},
            {"Origin": "https://console.example.com"},
            {"Host": "localhost:9999"},
            {"Host": "interlock.internal:8787"},
            {"Host": "[::1]:1234"},
        ):
            async with http.get(url, headers=headers) as answer:
                assert answer.status == 200, (headers, await answer.text())
        assert provider.count("/v1/models") == 5
        assert not any("origin" in {h.lower() for h in r.headers} for r in provider.received)


async def test_health_and_readiness_answer_any_host(tmp_path: Path, provider: FakeProvider):
    """Probes (which send the pod's address as Host) are not refused: /healthz is not guarded."""
    probe = {"Host": "10.1.2.3:8787"}
    async with (
        running_proxy(_config("http://127.0.0.1:9/mcp", provider.url), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
        http.get(f"{proxy.base}/healthz", headers=probe) as answer,
    ):
        assert answer.status == 200


async def test_admin_csrf_is_refused(tmp_path: Path, provider: FakeProvider):
    """Without an admin token (loopback only): a cross-site POST (foreign Origin) is 403, a POST
    that is not application/json is 415 (a body-less pause or a text/plain resolve), a rebinding
    read is 421 — and none of them changed anything."""
    async with (
        running_proxy(_config("http://127.0.0.1:9/mcp", provider.url), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        claimed = await proxy.store.claim(_claim("pay-1"))
        await proxy.store.mark_unknown(
            claimed.entry.id, claimed.entry.fencing_token, reason="timeout"
        )
        pause = f"{proxy.base}/admin/scopes/global/pause"
        async with http.post(pause, headers={"Origin": "https://evil.example"}) as answer:
            assert answer.status == 403
        async with http.post(pause) as answer:
            assert answer.status == 415
        resolve = f"{proxy.base}/admin/ledger/{claimed.entry.id}/resolve"
        as_text = {"Content-Type": "text/plain"}
        async with http.post(resolve, data=b'{"as": "retry"}', headers=as_text) as answer:
            assert answer.status == 415
        rebound = {"Host": EVIL_HOST}
        async with http.get(f"{proxy.base}/admin/ledger", headers=rebound) as answer:
            assert answer.status == 421
        entry, _history = await proxy.store.get(claimed.entry.id)
        assert str(entry.state) == "unknown"
        assert not proxy.scheduler.snapshot().paused
        async with http.post(pause, json={}) as answer:
            assert answer.status == 200
        assert proxy.scheduler.snapshot().paused


async def test_same_origin_passes_only_on_mcp_and_only_when_host_is_checked(
    tmp_path: Path, upstream: RunningUpstream, provider: FakeProvider
):
    """An Origin equal to the request's own Host is same-origin on /mcp (as an MCP server accepts
    it). It is not on /http and /admin: a relayed upstream answer is served at the proxy's origin,
    and a page in it must not drive the model API or the operator API. With `allowed_hosts: ["*"]`
    the Host is not checked, so a rebinding page's Origin always equals its Host: refused."""
    async with (
        running_proxy(_config(upstream.url, provider.url), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        own = proxy.base.removeprefix("http://")
        same = {"Origin": f"http://{own}"}
        async with http.post(
            proxy.mcp_url("mail"), json=INITIALIZE, headers={**MCP_HEADERS, **same}
        ) as answer:
            assert answer.status == 200, await answer.text()
        async with http.get(f"{proxy.base}/http/llm/v1/models", headers=same) as answer:
            assert answer.status == 403
            assert (await answer.json())["error"]["reason"] == "origin_not_allowed"
        async with http.get(f"{proxy.base}/admin/stats", headers=same) as answer:
            assert answer.status == 403
        assert provider.count("/v1/models") == 0
    extra = 'allowed_hosts: ["*"]'
    async with (
        running_proxy(_config(upstream.url, provider.url, extra), tmp_path / "any") as proxy,
        aiohttp.ClientSession() as http,
    ):
        rebinding = {**MCP_HEADERS, "Host": EVIL_HOST, "Origin": EVIL_ORIGIN}
        async with http.post(proxy.mcp_url("mail"), json=INITIALIZE, headers=rebinding) as answer:
            assert answer.status == 403


async def test_the_job_routes_are_guarded_like_http(tmp_path: Path, provider: FakeProvider):
    """`/jobs/{id}` (added with deferred HTTP work) is behind the edge too: a cross-site DELETE
    (foreign Origin) is 403 and a rebinding GET 421, before the route looks the job up; without
    either, the route answers (404: no such job)."""
    async with (
        running_proxy(_config("http://127.0.0.1:9/mcp", provider.url), tmp_path) as proxy,
        aiohttp.ClientSession() as http,
    ):
        job = f"{proxy.base}/jobs/no-such-job"
        async with http.delete(job, headers={"Origin": "https://evil.example"}) as answer:
            assert answer.status == 403
            assert (await answer.json())["error"]["reason"] == "origin_not_allowed"
        async with http.get(job, headers={"Host": EVIL_HOST}) as answer:
            assert answer.status == 421
        async with http.get(job) as answer:
            assert answer.status == 404


def test_every_route_under_a_guarded_prefix_is_behind_the_edge(tmp_path: Path) -> None:
    """The edge is a wrapper on each route, not a middleware: every route the application
    registers under `/mcp/`, `/http/`, `/jobs/` or `/admin` has it (a route added without it
    would answer browsers and foreign Host names), and no other route does."""
    app = create_app(parse_config_text(_config("http://127.0.0.1:9/mcp", "http://127.0.0.1:9")))
    assert not app.middlewares
    paths = {}
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        paths.setdefault(path, set()).add(is_guarded(route.handler))
    guarded = {path for path in paths if path.startswith(GUARDED_PREFIXES)}
    assert {"/mcp/{upstream}", "/http/{upstream}", "/jobs/{task_id}", "/admin/stats"} <= guarded
    for path, verdicts in paths.items():
        assert verdicts == {path in guarded}, path
