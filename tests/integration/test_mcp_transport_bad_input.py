"""Bad input at /mcp/{upstream}: a specific error each, nothing forwarded, the proxy stays up."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from policies.model import UpstreamSpec
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import RawMcp, RunningProxy, http_upstream, running_proxy
from tests.integration.mcp_servers import RunningUpstream

CAP = 2048


upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
async def proxy(upstream: RunningUpstream, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    upstreams = {
        "up": http_upstream("up", upstream.url),
        "api": UpstreamSpec(name="api", kind="http", url=upstream.base),
    }
    async with running_proxy(upstreams, tmp_path, max_body_bytes=CAP) as running:
        yield running


http = mcp_proxy_harness.http


HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


async def _post(
    http: aiohttp.ClientSession, url: str, data: bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict]:
    async with http.post(url, data=data, headers=headers or HEADERS) as answer:
        return answer.status, await answer.json(content_type=None)


@pytest.mark.parametrize(
    ("data", "status", "code", "reason"),
    [
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/li', 400, -32700, "parse_error"),
        (b"\xff\xfe\x00", 400, -32700, "parse_error"),
        (b'{"hello": "world"}', 400, -32600, "bad_jsonrpc_version"),
        (b'{"jsonrpc": "2.0", "id": 1}', 400, -32600, "not_jsonrpc"),
        (b'{"jsonrpc": "2.0", "id": [1], "method": "ping"}', 400, -32600, "bad_id"),
        (b"[]", 400, -32600, "empty_batch"),
        (b"42", 400, -32600, "not_an_object"),
    ],
)
async def test_malformed_bodies_get_specific_errors_and_are_not_forwarded(
    proxy: RunningProxy,
    http: aiohttp.ClientSession,
    upstream: RunningUpstream,
    data: bytes,
    status: int,
    code: int,
    reason: str,
):
    """Not JSON → 400/-32700; JSON but not JSON-RPC → 400/-32600; the upstream sees nothing."""
    before = upstream.stats()["mcp_requests"]
    got_status, body = await _post(http, proxy.mcp_url("up"), data)
    assert (got_status, body["error"]["code"], body["error"]["data"]["reason"]) == (
        status,
        code,
        reason,
    )
    assert body["id"] is None
    assert upstream.stats()["mcp_requests"] == before


async def test_wrong_content_type_is_415(
    proxy: RunningProxy, http: aiohttp.ClientSession, upstream: RunningUpstream
):
    """A body that is not declared application/json is refused with 415 and a JSON-RPC body."""
    before = upstream.stats()["mcp_requests"]
    headers = {**HEADERS, "Content-Type": "text/plain"}
    status, body = await _post(
        http, proxy.mcp_url("up"), b'{"jsonrpc":"2.0","id":1,"method":"ping"}', headers
    )
    assert (status, body["error"]["code"], body["error"]["data"]["reason"]) == (
        415,
        -32600,
        "unsupported_media_type",
    )
    assert upstream.stats()["mcp_requests"] == before


async def test_body_over_the_cap_is_413_even_without_a_length(
    proxy: RunningProxy, http: aiohttp.ClientSession, upstream: RunningUpstream
):
    """Over max_body_bytes → 413, whether announced by Content-Length or streamed chunked."""
    before = upstream.stats()["mcp_requests"]
    big = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"' + b"a" * CAP + b'"}}'
    status, body = await _post(http, proxy.mcp_url("up"), big)
    assert (status, body["error"]["data"]["reason"]) == (413, "body_too_large")

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(big), 512):
            yield big[start : start + 512]

    async with http.post(proxy.mcp_url("up"), data=chunks(), headers=HEADERS) as answer:
        assert answer.status == 413
    assert upstream.stats()["mcp_requests"] == before


@pytest.mark.parametrize("name", ["nope", "api"])
@pytest.mark.parametrize("method", ["POST", "GET", "DELETE"])
async def test_unknown_or_non_mcp_upstream_is_404(
    proxy: RunningProxy, http: aiohttp.ClientSession, name: str, method: str
):
    """An unconfigured name, or an HTTP (non-MCP) upstream, is a 404 for every method."""
    data = b'{"jsonrpc":"2.0","id":1,"method":"ping"}'
    async with http.request(method, proxy.mcp_url(name), data=data, headers=HEADERS) as answer:
        assert answer.status == 404
        body = await answer.json()
    assert body["error"]["data"]["reason"] == "unknown_upstream"


async def test_the_proxy_stays_up_after_bad_input(proxy: RunningProxy, http: aiohttp.ClientSession):
    """After a string of bad requests the same proxy still serves a real session."""
    for data in (b"{", b"[1]", b'{"jsonrpc":"2.0"}'):
        await _post(http, proxy.mcp_url("up"), data)
    raw = RawMcp(http, proxy.mcp_url("up"))
    await raw.initialize()
    answer = await raw.post({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
    assert answer.status == 200
    assert answer.last["result"]["tools"]
