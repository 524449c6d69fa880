"""Deeply nested JSON is a 400 on both entry routes, never a 500 (and nothing is forwarded)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.integration import fake_provider
from tests.integration.fake_provider import FakeProvider
from tests.integration.mcp_servers import RunningUpstream, running_upstream
from tests.integration.proxy_harness import running_proxy

provider = fake_provider.provider
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningUpstream]:
    with running_upstream(stateless=True) as running:
        yield running


def _deep(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


@pytest.mark.parametrize("depth", [600, 900, 100_000])
async def test_deep_tool_arguments_are_400(
    tmp_path: Path, upstream: RunningUpstream, provider: FakeProvider, depth: int
):
    """600 levels used to reach the key's canonical form and die in a RecursionError (500)."""
    upstream.reset()
    config = f"""
        ledger: {{url: "sqlite:///ledger.db"}}
        upstreams:
          mail: {{mcp: "{upstream.url}"}}
          api: {{http: "{provider.url}"}}
    """
    body = (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call",'
        f'"params":{{"name":"send_email","arguments":{{"x":{_deep(depth)}}}}}}}'
    )
    async with running_proxy(config, tmp_path) as proxy, aiohttp.ClientSession() as http:
        async with http.post(proxy.mcp_url("mail"), data=body, headers=HEADERS) as answer:
            assert answer.status == 400
            error = await answer.json()
        assert error["error"]["data"]["reason"] in ("too_deep", "parse_error")
        url = f"{proxy.base}/http/api/v1/actions"
        async with http.post(url, data=f'{{"x":{_deep(depth)}}}', headers=HEADERS) as answer:
            assert answer.status == 400
    assert upstream.stats().get("mcp_requests", 0) == 0
    assert provider.count() == 0
