"""Every proxied MCP request is a SERVER span continuing the caller's trace, propagated upstream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from proxy.telemetry import tracing
from proxy.telemetry.tracing import hash_key
from tests.integration import mcp_proxy_harness
from tests.integration.mcp_proxy_harness import RawMcp, RunningProxy, http_upstream, running_proxy
from tests.integration.mcp_servers import RunningUpstream

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


upstream = mcp_proxy_harness.module_upstream


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.bind_tracer_provider(provider)
    try:
        yield exporter
    finally:
        tracing.bind_tracer_provider(None)
        provider.shutdown()


@pytest.fixture
async def proxy(upstream: RunningUpstream, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    async with running_proxy({"up": http_upstream("up", upstream.url)}, tmp_path) as running:
        yield running


def _server_spans(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans() if s.kind == SpanKind.SERVER}


async def test_requests_are_server_spans_continuing_the_callers_trace(
    proxy: RunningProxy, upstream: RunningUpstream, spans: InMemorySpanExporter
):
    """tools/list and tools/call each get a SERVER span in the caller's trace, sent upstream."""
    async with aiohttp.ClientSession() as http:
        raw = RawMcp(http, proxy.mcp_url("up"))
        await raw.initialize()
        listed = await raw.post(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, {"traceparent": TRACEPARENT}
        )
        assert listed.status == 200
        seen_upstream = upstream.stats()["last_headers"]
        call = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "x"}},
        }
        assert (await raw.post(call)).status == 200
    server = _server_spans(spans)
    listing = server["tools/list up"]
    assert format(listing.context.trace_id, "032x") == TRACE_ID
    assert listing.attributes is not None
    assert listing.attributes["mcp.method.name"] == "tools/list"
    # a session id is a bearer of the session (stdio): spans carry only its hash
    assert raw.session_id is not None
    assert listing.attributes["mcp.session.id"] == hash_key(raw.session_id)
    assert raw.session_id not in str(dict(listing.attributes))
    assert listing.attributes["interlock.upstream"] == "up"
    assert listing.attributes["jsonrpc.request.id"] == "1"
    assert seen_upstream["traceparent"].split("-")[1] == TRACE_ID
    called = server["tools/call echo"]
    assert called.attributes is not None
    assert called.attributes["gen_ai.operation.name"] == "execute_tool"
    assert called.attributes["gen_ai.tool.name"] == "echo"
    assert "initialize up" in server


async def test_a_failed_request_is_marked_with_its_error_type(
    proxy: RunningProxy, spans: InMemorySpanExporter
):
    """An upstream 404 (session gone) marks the request's span failed with error.type 404."""
    async with aiohttp.ClientSession() as http:
        raw = RawMcp(http, proxy.mcp_url("up"))
        raw.session_id, raw.version = "gone", "2025-11-25"
        answer = await raw.post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert answer.status == 404
    span = _server_spans(spans)["ping up"]
    assert span.attributes is not None
    assert span.attributes["error.type"] == "404"
