"""The proxy parses each message it relays once: the client's request when it arrives, the
upstream's answer when it comes back, never again to find out whether it changed on the way.
A `tools/call` answer from an HTTP upstream is read to its envelope only: the tool's output
(`content`, `structuredContent`) is relayed and stored as the upstream's bytes, never parsed.

Every whole-document JSON parse in this process (`proxy.json_codec`'s msgspec decoder,
`orjson.loads` and `json.loads`, whoever calls them) and every envelope read is counted while a
`tools/call` goes through the proxy to a real upstream (a subprocess: its own parsing is not
counted) and back; the test client reads bytes.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from proxy import json_codec
from proxy.mcp.wire import jsonrpc
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import (
    RawMcp,
    RunningProxy,
    http_upstream,
    running_proxy,
    stdio_upstream,
)
from tests.integration.mcp_servers import RunningUpstream

MARK = "relay-once-7f3a"

http = mcp_proxy_harness.http


class Parses:
    """The JSON documents parsed in this process that mention `MARK`, by what they are."""

    def __init__(self) -> None:
        self.requests = 0
        self.answers = 0
        self.envelopes = 0

    def saw(self, document: Any) -> None:
        data = document.encode() if isinstance(document, str) else bytes(document)
        if MARK.encode() not in data:
            return
        if b'"method"' in data:
            self.requests += 1
        else:
            self.answers += 1


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Parses:
    seen = Parses()

    def counting(real: Callable[..., Any]) -> Callable[..., Any]:
        def loads(document: Any, *args: Any, **kwargs: Any) -> Any:
            seen.saw(document)
            return real(document, *args, **kwargs)

        return loads

    class CountingEnvelope:
        def __init__(self, real: Any) -> None:
            self._real = real

        def decode(self, document: bytes) -> Any:
            if MARK.encode() in document:
                seen.envelopes += 1
            return self._real.decode(document)

    # As in production: the suite's check of relayed bytes (a second parse on purpose) is off.
    monkeypatch.setattr(jsonrpc, "_CHECK_WIRE", False)
    monkeypatch.setattr(json_codec, "_decode", counting(json_codec._decode))
    monkeypatch.setattr(orjson, "loads", counting(orjson.loads))
    monkeypatch.setattr(json, "loads", counting(json.loads))
    monkeypatch.setattr(jsonrpc, "_ENVELOPE", CountingEnvelope(jsonrpc._ENVELOPE))
    return seen


sse_upstream = mcp_proxy_harness.module_sse_upstream
json_upstream = mcp_proxy_harness.module_json_upstream


@pytest.fixture
async def proxy(
    sse_upstream: RunningUpstream, json_upstream: RunningUpstream, tmp_path: Path
) -> AsyncIterator[RunningProxy]:
    upstreams = {
        "sse": http_upstream("sse", sse_upstream.url, timeout_s=10),
        "json": http_upstream("json", json_upstream.url, timeout_s=10),
        "stdio": stdio_upstream("stdio", timeout_s=10),
    }
    async with running_proxy(upstreams, tmp_path) as running:
        yield running


def _call(request_id: int, text: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": text}},
    }


@pytest.mark.parametrize("upstream", ["json", "sse", "stdio"])
async def test_a_relayed_call_and_its_answer_are_each_parsed_once(
    proxy: RunningProxy, http: aiohttp.ClientSession, parses: Parses, upstream: str
):
    """A session's tools/call: the request is parsed when it arrives and the answer when the
    upstream sends it (to its envelope: the tool's output is never built); both go on as the
    bytes they came as."""
    raw = RawMcp(http, proxy.mcp_url(upstream))
    await raw.initialize()
    body = json.dumps(_call(5, f"{MARK} one")).encode()
    answer = await raw.post(body)
    assert answer.status == 200
    assert json.loads(answer.messages[-1])["result"]["content"][0]["text"] == f"{MARK} one"
    assert parses.requests == 1
    assert (parses.answers, parses.envelopes) == (1, 1)  # the test's own; the envelope


@pytest.mark.parametrize("upstream", ["json", "stdio"])
async def test_a_modern_call_and_its_answer_are_each_parsed_once(
    proxy: RunningProxy, http: aiohttp.ClientSession, parses: Parses, upstream: str
):
    """A stateless 2026-07-28 call (to stdio: the shared process, whose ids the proxy mints and
    puts back in the answer's bytes) is parsed once each way too."""
    answer = await RawMcp(http, proxy.mcp_url(upstream)).call_modern(9, "echo", {"text": MARK})
    assert answer.status == 200
    last = answer.last  # the test's own parse
    assert last["id"] == 9
    assert last["result"]["content"][0]["text"] == MARK
    assert parses.requests == 1
    assert (parses.answers, parses.envelopes) == (1, 1)  # the test's own; the envelope


async def test_a_batch_parses_each_answer_once(
    proxy: RunningProxy, http: aiohttp.ClientSession, parses: Parses
):
    """A batch of two calls: one parse of the batch, one envelope read of each answer."""
    raw = RawMcp(http, proxy.mcp_url("json"))
    await raw.initialize()
    answer = await raw.post([_call(1, f"{MARK} a"), _call(2, f"{MARK} b")])
    assert answer.status == 200
    assert (parses.requests, parses.answers, parses.envelopes) == (1, 0, 2)
    texts = sorted(m["result"]["content"][0]["text"] for m in answer.json())
    assert texts == [f"{MARK} a", f"{MARK} b"]
