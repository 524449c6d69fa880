"""Spans reach a real OTLP/HTTP receiver; a down or stalled collector costs spans, never calls."""

from __future__ import annotations

import asyncio
import socket

import pytest
from opentelemetry.trace import SpanKind
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from policies.model import TelemetrySettings
from proxy.telemetry import tracing
from proxy.telemetry.sdk import TelemetryHandle, configure_telemetry
from tests.integration import otlp_receiver
from tests.integration.otlp_receiver import OtlpReceiver, export_to, sampled_flag

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"


receiver = otlp_receiver.receiver


def start(
    endpoint: str, *, queue: int = 2048, timeout_s: float = 5.0, sample_ratio: float = 1.0
) -> TelemetryHandle:
    return export_to(
        endpoint,
        service_name="interlock-test",
        max_queue_size=queue,
        export_timeout_s=timeout_s,
        sample_ratio=sample_ratio,
    )


def dropped_metric(handle: TelemetryHandle) -> dict[str, float]:
    text = generate_latest(handle.registry).decode()
    return {
        s.labels["reason"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "interlock_telemetry_spans_dropped_total"
    }


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_call_and_child_spans_form_one_tree_continuing_the_caller(
    receiver: OtlpReceiver,
) -> None:
    """The server span continues the caller's trace; steps are its children with their kinds."""
    handle = start(receiver.endpoint)
    try:
        with tracing.call_span(
            "tools/call send_email",
            attributes=lambda: {"mcp.method.name": "tools/call", "interlock.tenant": None},
            headers={"traceparent": TRACEPARENT},
        ) as span:
            with tracing.child_span("interlock.queue"):
                pass
            with tracing.child_span("interlock.upstream.attempt", kind=SpanKind.CLIENT):
                upstream_headers: dict[str, str] = {}
                tracing.inject_headers(upstream_headers)
            tracing.set_attributes(span, {"interlock.attempt": 1, "interlock.cooldown_s": None})
        spans = await receiver.wait_for_trace(CALLER_TRACE, 3)
    finally:
        handle.shutdown()
    (root,) = receiver.tree(CALLER_TRACE)
    assert root.span.name == "tools/call send_email"
    assert root.span.kind == "SERVER"
    assert root.span.parent_span_id == CALLER_SPAN
    assert root.span.service == "interlock-test"
    assert root.span.attributes == {"mcp.method.name": "tools/call", "interlock.attempt": 1}
    assert root.child_names() == ["interlock.queue", "interlock.upstream.attempt"]
    attempt = root.children[1].span
    assert attempt.kind == "CLIENT"
    # the upstream is told about the attempt span, in the caller's trace
    assert upstream_headers["traceparent"] == f"00-{CALLER_TRACE}-{attempt.span_id}-01"
    assert len(spans) == 3


async def test_an_exception_marks_the_span_failed_with_its_type(receiver: OtlpReceiver) -> None:
    """An exception leaving a span sets `error.type` to its class and an ERROR status."""
    handle = start(receiver.endpoint)
    try:
        with pytest.raises(TimeoutError), tracing.call_span("tools/call slow"):
            raise TimeoutError
        span = await receiver.wait_for_span(lambda s: s.name == "tools/call slow")
    finally:
        handle.shutdown()
    assert span.status == "ERROR"
    assert span.attributes["error.type"] == "TimeoutError"


async def test_collector_down_costs_spans_not_calls() -> None:
    """With the OTLP endpoint on a closed port, spans end normally and are counted as dropped."""
    handle = start(f"http://127.0.0.1:{closed_port()}", timeout_s=0.5)
    try:
        for i in range(5):
            with tracing.call_span(f"tools/call t{i}"):
                pass
        await asyncio.to_thread(handle.force_flush, 5.0)
        assert handle.spans_dropped == 5
        assert dropped_metric(handle)["export_failed"] == 5
    finally:
        await asyncio.to_thread(handle.shutdown)


async def test_a_stalled_collector_fills_a_bounded_queue_and_counts_drops(
    receiver: OtlpReceiver,
) -> None:
    """While the collector cannot answer, at most queue + one batch is held; the rest is counted.

    The receiver shares this event loop, so it cannot answer while the spans are produced.
    Every span ends up either received or counted as dropped: none vanishes silently.
    """
    handle = start(receiver.endpoint, queue=4)
    try:
        for i in range(24):
            with tracing.call_span(f"tools/call t{i}"):
                pass
        assert handle.spans_dropped >= 24 - 8
        await receiver.wait_for(lambda ss: len(ss) + handle.spans_dropped >= 24)
        await asyncio.to_thread(handle.force_flush, 5.0)
        assert len(receiver.spans) + handle.spans_dropped == 24
        assert dropped_metric(handle)["queue_full"] == handle.spans_dropped
    finally:
        await asyncio.to_thread(handle.shutdown)


async def test_a_failing_collector_counts_failed_exports(receiver: OtlpReceiver) -> None:
    """A collector answering 400 loses the batch, and the loss is counted as export_failed."""
    receiver.status = 400
    handle = start(receiver.endpoint)
    try:
        with tracing.call_span("tools/call t"):
            pass
        await receiver.wait_for(lambda _ss: receiver.requests >= 1)
        await asyncio.to_thread(handle.force_flush, 5.0)
        assert dropped_metric(handle)["export_failed"] == 1
        assert receiver.spans == []
    finally:
        await asyncio.to_thread(handle.shutdown)


async def test_tracing_off_records_nothing(receiver: OtlpReceiver) -> None:
    """`enabled=False` builds no tracer provider: nothing is exported, context still passes."""
    settings = TelemetrySettings(otlp_endpoint=receiver.endpoint)
    handle = configure_telemetry(settings, enabled=False, set_global=False)
    try:
        assert not handle.tracing
        with tracing.call_span("tools/call t", headers={"traceparent": TRACEPARENT}):
            assert tracing.current_trace_id() == CALLER_TRACE
        assert handle.force_flush()
    finally:
        handle.shutdown()
    assert receiver.requests == 0


def one_call(name: str, headers: dict[str, str] | None = None) -> dict[str, str]:
    """A server span with a child, as a proxied call makes them; the upstream's trace headers."""
    upstream_headers: dict[str, str] = {}
    with tracing.call_span(name, headers=headers), tracing.child_span("interlock.queue"):
        tracing.inject_headers(upstream_headers)
    return upstream_headers


async def test_a_sample_ratio_of_zero_records_no_new_trace_yet_passes_one_on(
    receiver: OtlpReceiver,
) -> None:
    """An unsampled call makes no span to export (and no child at all), but the upstream still
    gets a trace context, marked not sampled, so its own logs can carry the trace id."""
    handle = start(receiver.endpoint, sample_ratio=0.0)
    try:
        with tracing.call_span("tools/call unsampled") as span:
            assert not span.is_recording()
            with tracing.child_span("interlock.queue") as child:
                assert not child.is_recording()
        upstream = one_call("tools/call unsampled")
        assert not sampled_flag(upstream["traceparent"])
        one_call("tools/call sampled by its caller", headers={"traceparent": TRACEPARENT})
        # both went through the same queue: once the caller-sampled trace is in, so would they be
        await receiver.wait_for_trace(CALLER_TRACE, 2)
        await asyncio.to_thread(handle.force_flush, 5.0)
    finally:
        handle.shutdown()
    assert {s.name for s in receiver.spans} == {
        "tools/call sampled by its caller",
        "interlock.queue",
    }
    assert handle.spans_dropped == 0


async def test_the_callers_sampling_decision_wins_over_the_ratio(receiver: OtlpReceiver) -> None:
    """Parent-based: a caller's `sampled` flag is kept whatever the ratio, either way."""
    unsampled_caller = f"00-{'5' * 32}-{CALLER_SPAN}-00"
    handle = start(receiver.endpoint, sample_ratio=1.0)
    try:
        upstream = one_call("tools/call caller said no", headers={"traceparent": unsampled_caller})
        assert upstream["traceparent"].startswith(f"00-{'5' * 32}-")
        assert not sampled_flag(upstream["traceparent"])
        assert sampled_flag(
            one_call("tools/call caller said yes", {"traceparent": TRACEPARENT})["traceparent"]
        )
        await receiver.wait_for_trace(CALLER_TRACE, 2)
        await asyncio.to_thread(handle.force_flush, 5.0)
    finally:
        handle.shutdown()
    assert receiver.trace("5" * 32) == []
    assert len(receiver.trace(CALLER_TRACE)) == 2


async def test_a_sample_ratio_records_about_that_share_of_new_traces(
    receiver: OtlpReceiver,
) -> None:
    """0.5 of 400 new traces: each whole (server span and child) or not at all. The bounds are
    ten standard deviations wide (binomial 400 × 0.5: σ = 10), so only a wiring bug misses."""
    handle = start(receiver.endpoint, sample_ratio=0.5)
    try:
        for i in range(400):
            one_call(f"tools/call t{i}")
        await asyncio.to_thread(handle.force_flush, 5.0)
    finally:
        handle.shutdown()
    traces: dict[str, list[str]] = {}
    for span in receiver.spans:
        traces.setdefault(span.trace_id, []).append(span.name)
    assert 100 <= len(traces) <= 300, len(traces)
    assert all(
        sorted(names)[0] == "interlock.queue" and len(names) == 2 for names in traces.values()
    )


async def test_the_ratio_is_the_whole_sampling_configuration(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OTEL_TRACES_SAMPLER` in the environment does not override `telemetry.sample_ratio`."""
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    handle = start(receiver.endpoint, sample_ratio=1.0)
    try:
        one_call("tools/call recorded")
        spans = await receiver.wait_for(lambda ss: len(ss) >= 2)
    finally:
        handle.shutdown()
    assert {s.name for s in spans} == {"tools/call recorded", "interlock.queue"}
