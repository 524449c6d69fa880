"""A real OTLP/HTTP trace receiver for tests: aiohttp, decoding `ExportTraceServiceRequest`.

    async with OtlpReceiver() as receiver:           # listens on 127.0.0.1, a free port
        settings = TelemetrySettings(otlp_endpoint=receiver.endpoint)
        ...
        server = await receiver.wait_for_span(lambda s: s.kind == "SERVER")
        print(receiver.render_tree(server.trace_id))

It can also play a slow collector (`delay_s`) or a failing one (`status=503`).
"""

from __future__ import annotations

import asyncio
import gzip
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from policies.model import TelemetrySettings
from proxy.telemetry.sdk import TelemetryHandle, configure_telemetry

__all__ = ["OtlpReceiver", "ReceivedSpan", "SpanNode"]

_KINDS = {
    Span.SPAN_KIND_INTERNAL: "INTERNAL",
    Span.SPAN_KIND_SERVER: "SERVER",
    Span.SPAN_KIND_CLIENT: "CLIENT",
    Span.SPAN_KIND_PRODUCER: "PRODUCER",
    Span.SPAN_KIND_CONSUMER: "CONSUMER",
}
_STATUS = {
    Status.STATUS_CODE_UNSET: "UNSET",
    Status.STATUS_CODE_OK: "OK",
    Status.STATUS_CODE_ERROR: "ERROR",
}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as the collector received it (ids in hex, attributes decoded to Python values)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    attributes: dict[str, Any]
    status: str
    status_message: str
    service: str
    scope: str
    start_ns: int
    end_ns: int
    events: tuple[str, ...] = ()
    links: tuple[tuple[str, str], ...] = ()
    """(trace id, span id) of each span this one links to."""

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class SpanNode:
    """A span and its children, ordered by start time."""

    span: ReceivedSpan
    children: list[SpanNode] = field(default_factory=list)

    def find(self, name: str) -> list[SpanNode]:
        """Every node below (and including) this one whose span has `name`."""
        found = [self] if self.span.name == name else []
        for child in self.children:
            found.extend(child.find(name))
        return found

    def child_names(self) -> list[str]:
        return [child.span.name for child in self.children]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return _attributes(value.kvlist_value.values)
    return getattr(value, kind)


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


def _decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans: list[ReceivedSpan] = []
    for resource_spans in request.resource_spans:
        service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex() or None,
                        name=span.name,
                        kind=_KINDS.get(span.kind, "UNSPECIFIED"),
                        attributes=_attributes(span.attributes),
                        status=_STATUS.get(span.status.code, "UNSET"),
                        status_message=span.status.message,
                        service=service,
                        scope=scope_spans.scope.name,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        events=tuple(event.name for event in span.events),
                        links=tuple(
                            (link.trace_id.hex(), link.span_id.hex()) for link in span.links
                        ),
                    )
                )
    return spans


class OtlpReceiver:
    """An OTLP/HTTP collector on 127.0.0.1 that keeps every span it receives, in memory."""

    def __init__(self, *, delay_s: float = 0.0, status: int = 200) -> None:
        self.delay_s = delay_s
        self.status = status
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._changed = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        """The base URL to configure as `telemetry.otlp_endpoint`."""
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> OtlpReceiver:
        app = web.Application()
        app.router.add_post("/v1/traces", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests += 1
        body = await request.read()
        encoding = request.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            body = gzip.decompress(body)
        elif encoding == "deflate":
            body = zlib.decompress(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)  # plays a slow collector, not a wait for something
        if self.status != 200:
            self._changed.set()
            return web.Response(status=self.status, headers={"Retry-After": "0"})
        self.spans.extend(_decode(body))
        self._changed.set()
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def wait_for(
        self, predicate: Callable[[Sequence[ReceivedSpan]], bool], timeout_s: float = 10.0
    ) -> list[ReceivedSpan]:
        """Wait (bounded) until `predicate(all spans so far)` holds; returns the spans."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self.spans):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                names = sorted({s.name for s in self.spans})
                raise TimeoutError(f"spans never matched; received {len(self.spans)}: {names}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                continue
        return list(self.spans)

    async def wait_for_span(
        self, predicate: Callable[[ReceivedSpan], bool], timeout_s: float = 10.0
    ) -> ReceivedSpan:
        """Wait (bounded) for the first span matching `predicate`."""
        spans = await self.wait_for(lambda ss: any(predicate(s) for s in ss), timeout_s)
        return next(s for s in spans if predicate(s))

    async def wait_for_trace(
        self, trace_id: str, count: int, timeout_s: float = 10.0
    ) -> list[ReceivedSpan]:
        """Wait (bounded) until the trace has at least `count` spans."""
        await self.wait_for(lambda ss: sum(s.trace_id == trace_id for s in ss) >= count, timeout_s)
        return self.trace(trace_id)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]

    def tree(self, trace_id: str) -> list[SpanNode]:
        """The trace's spans as trees (roots: spans whose parent was not received)."""
        spans = sorted(self.trace(trace_id), key=lambda s: s.start_ns)
        nodes = {s.span_id: SpanNode(s) for s in spans}
        roots: list[SpanNode] = []
        for span in spans:
            parent = nodes.get(span.parent_span_id or "")
            (parent.children if parent else roots).append(nodes[span.span_id])
        return roots

    def render_tree(self, trace_id: str, *, attributes: bool = True) -> str:
        """The trace as an indented text tree (durations in ms, interesting attributes inline)."""
        lines: list[str] = []

        def walk(node: SpanNode, prefix: str, last: bool, root: bool) -> None:
            span = node.span
            branch = "" if root else ("└─ " if last else "├─ ")
            status = " [ERROR]" if span.status == "ERROR" else ""
            lines.append(
                f"{prefix}{branch}{span.name} ({span.kind}, {span.duration_s * 1000:.1f} ms)"
                f"{status}"
            )
            pad = prefix + ("" if root else ("   " if last else "│  "))
            if attributes:
                for key in sorted(span.attributes):
                    bar = "│  " if node.children else "   "
                    lines.append(f"{pad}{bar}  {key} = {span.attributes[key]!r}")
            for i, child in enumerate(node.children):
                walk(child, pad, i == len(node.children) - 1, False)

        for root in self.tree(trace_id):
            walk(root, "", True, True)
        return "\n".join(lines)


@pytest.fixture
async def receiver() -> AsyncIterator[OtlpReceiver]:
    """A receiver per test. Bind it in a test module with `receiver = otlp_receiver.receiver`."""
    async with OtlpReceiver() as running:
        yield running


def export_to(endpoint: str, **settings: Any) -> TelemetryHandle:
    """The proxy's telemetry exporting every 20 ms to `endpoint` (other `TelemetrySettings` as
    given), not installed as the process-global provider."""
    configured = TelemetrySettings(otlp_endpoint=endpoint, **settings)
    return configure_telemetry(configured, enabled=True, set_global=False, schedule_delay_s=0.02)


def sampled_flag(traceparent: str) -> bool:
    """The W3C `sampled` bit of a traceparent's flags (other bits, e.g. `random`, may be set)."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert (version, len(trace_id), len(span_id)) == ("00", 32, 16), traceparent
    return bool(int(flags, 16) & 0x01)


@pytest.fixture
async def traced(receiver: OtlpReceiver) -> AsyncIterator[TelemetryHandle]:
    """The proxy's telemetry, exporting every 20 ms to the test's receiver."""
    handle = export_to(receiver.endpoint, service_name="interlock")
    yield handle
    await asyncio.to_thread(handle.shutdown)
