"""Pure telemetry helpers: names, key hashing, trace-context pass-through without an SDK."""

from __future__ import annotations

from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry.trace import NoOpTracerProvider

from proxy.telemetry import tracing
from proxy.telemetry.sdk import traces_url

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


def test_span_names_follow_the_conventions() -> None:
    """MCP spans are named `{method} {target}`; HTTP server spans `{METHOD} {route}`."""
    assert tracing.mcp_span_name("tools/call", "send_email") == "tools/call send_email"
    assert tracing.mcp_span_name("tools/list") == "tools/list"
    assert tracing.http_span_name("post", "/http/{upstream}/{path}") == (
        "POST /http/{upstream}/{path}"
    )


def test_hash_key_never_returns_the_key() -> None:
    """Idempotency keys are reduced to 16 hex chars of sha256; None stays None."""
    hashed = tracing.hash_key("order-42")
    assert hashed is not None
    assert len(hashed) == 16
    assert "order-42" not in hashed
    assert hashed == tracing.hash_key("order-42")
    assert hashed != tracing.hash_key("order-43")
    assert tracing.hash_key(None) is None


def test_traces_url_appends_the_signal_path_once() -> None:
    """`otlp_endpoint` is a base URL; `/v1/traces` is appended unless already there."""
    assert traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://127.0.0.1:4318/") == "http://127.0.0.1:4318/v1/traces"
    assert traces_url("http://c:4318/v1/traces") == "http://c:4318/v1/traces"


def test_incoming_trace_passes_through_when_tracing_is_off() -> None:
    """With no SDK recording, a caller's traceparent still reaches the upstream (headers, _meta)."""
    tracing.bind_tracer_provider(NoOpTracerProvider())
    try:
        with tracing.call_span("tools/call echo", headers={"Traceparent": TRACEPARENT}):
            headers: dict[str, str] = {}
            meta: dict[str, object] = {}
            tracing.inject_headers(headers)
            tracing.inject_meta(meta)
            assert tracing.current_trace_id() == TRACE_ID
    finally:
        tracing.bind_tracer_provider(None)
    assert headers["traceparent"] == TRACEPARENT
    assert meta["traceparent"] == TRACEPARENT


def test_meta_traceparent_wins_over_the_header() -> None:
    """An MCP `_meta.traceparent` is the request's own context; it beats the HTTP header."""
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    tracing.bind_tracer_provider(NoOpTracerProvider())
    try:
        with tracing.call_span(
            "tools/call echo", headers={"traceparent": other}, meta={"traceparent": TRACEPARENT}
        ):
            assert tracing.current_trace_id() == TRACE_ID
        with tracing.call_span("tools/call echo", headers={"traceparent": "garbage"}):
            assert tracing.current_trace_id() is None
    finally:
        tracing.bind_tracer_provider(None)


def test_aiohttp_headers_carry_the_trace_through_when_tracing_is_off() -> None:
    """Case-insensitive request headers (aiohttp's) are read directly, in any case of the name."""
    tracing.bind_tracer_provider(NoOpTracerProvider())
    try:
        headers = CIMultiDictProxy(CIMultiDict({"TraceParent": TRACEPARENT}))
        with tracing.call_span("tools/call echo", headers=headers):
            outgoing: dict[str, str] = {}
            tracing.inject_headers(outgoing)
    finally:
        tracing.bind_tracer_provider(None)
    assert outgoing["traceparent"] == TRACEPARENT


def test_tracing_off_and_no_caller_trace_starts_no_span() -> None:
    """With a no-op provider and no incoming context, no span is made and nothing is injected."""
    tracing.bind_tracer_provider(NoOpTracerProvider())
    try:
        assert not tracing.tracing_on()
        with tracing.call_span("tools/call echo", headers={}, meta={}) as span:
            assert not span.is_recording()
            assert not span.get_span_context().is_valid
            outgoing: dict[str, str] = {}
            meta: dict[str, object] = {}
            tracing.inject_headers(outgoing)
            tracing.inject_meta(meta)
    finally:
        tracing.bind_tracer_provider(None)
    assert outgoing == {}
    assert meta == {}
    assert tracing.tracing_on()  # the global provider may become a real one: assume it records


def test_steps_of_a_call_keep_the_callers_trace_when_tracing_is_off() -> None:
    """With nothing recording, a step (`child_span`) makes no span and leaves the context as it
    was: the caller's trace still reaches the upstream from inside it, and after it."""
    tracing.bind_tracer_provider(NoOpTracerProvider())
    try:
        with tracing.call_span("tools/call echo", headers={"traceparent": TRACEPARENT}):
            with tracing.child_span("interlock.upstream.attempt") as step:
                assert not step.is_recording()
                inside: dict[str, object] = {}
                tracing.inject_meta(inside)
            after: dict[str, str] = {}
            tracing.inject_headers(after)
        with tracing.child_span("interlock.queue") as lone:
            assert not lone.is_recording()
            assert tracing.current_trace_id() is None
    finally:
        tracing.bind_tracer_provider(None)
    assert inside["traceparent"] == TRACEPARENT
    assert after["traceparent"] == TRACEPARENT
