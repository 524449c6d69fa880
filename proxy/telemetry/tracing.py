"""Tracing helpers over the OpenTelemetry *API* (the SDK is configured once: `telemetry.sdk`).

Every proxied call is one SERVER span; its steps are child spans. Trace context is continued
from the caller (W3C `traceparent` header or MCP `params._meta`) and propagated upstream.
Idempotency keys appear only hashed (`hash_key`); arguments and results never appear.

Span names: `mcp_span_name("tools/call", "send_email")` → "tools/call send_email" (MCP);
`http_span_name("POST", "/http/{upstream}/{path}")` → "POST /http/{upstream}/{path}" (HTTP).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, StatusCode, Tracer, TracerProvider

__all__ = [
    "Attr",
    "bind_tracer_provider",
    "call_span",
    "child_span",
    "current_span",
    "current_trace_id",
    "hash_key",
    "http_span_name",
    "inject_headers",
    "inject_meta",
    "linked_span",
    "mark_error",
    "mcp_span_name",
    "set_attributes",
    "trace_carrier",
    "tracing_on",
]

_SCOPE = "interlock"
_NO_SPAN = nullcontext(INVALID_SPAN)  # reusable: entering it does nothing
_TRACE_META_KEYS = ("traceparent", "tracestate", "baggage")
_tracer: Tracer = trace.get_tracer(_SCOPE)
_on = True  # until a provider is bound: the global one may become a real SDK provider
# Whether a `_CurrentSpan` made the current context: with tracing off, that is the only way one
# holds a trace (a caller's, continued), so without it the OTel context need not be looked up.
_span_made: ContextVar[bool] = ContextVar("interlock_span_made", default=False)


class Attr:
    """Attribute names: OTel MCP / GenAI / general semantic conventions, then Interlock's own."""

    MCP_METHOD = "mcp.method.name"
    MCP_SESSION_ID = "mcp.session.id"
    MCP_PROTOCOL_VERSION = "mcp.protocol.version"
    JSONRPC_REQUEST_ID = "jsonrpc.request.id"
    GEN_AI_OPERATION = "gen_ai.operation.name"  # "execute_tool" | "chat"
    GEN_AI_TOOL = "gen_ai.tool.name"
    GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
    GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
    GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
    GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
    ERROR_TYPE = "error.type"
    SERVER_ADDRESS = "server.address"
    SERVER_PORT = "server.port"
    NETWORK_TRANSPORT = "network.transport"
    HTTP_METHOD = "http.request.method"
    HTTP_ROUTE = "http.route"
    HTTP_STATUS = "http.response.status_code"
    UPSTREAM = "interlock.upstream"
    TENANT = "interlock.tenant"
    WORK_CLASS = "interlock.class"
    ADMISSION_DECISION = "interlock.admission.decision"  # admitted|queued|rejected|observed
    ADMISSION_REASON = "interlock.admission.reason"
    ADMISSION_SCOPE = "interlock.admission.scope"
    QUEUE_WAIT_S = "interlock.queue.wait_s"
    ATTEMPT = "interlock.attempt"
    LEDGER_ENTRY_ID = "interlock.ledger.entry_id"
    LEDGER_STATE = "interlock.ledger.state"
    IDEMPOTENCY_OUTCOME = "interlock.idempotency.outcome"  # new|replayed|in_progress|mismatch|...
    IDEMPOTENCY_KEY_HASH = "interlock.idempotency.key_hash"
    COOLDOWN_S = "interlock.cooldown_s"
    WOULD_REJECT = "interlock.would_reject"


def bind_tracer_provider(provider: TracerProvider | None) -> None:
    """Make this module's spans come from `provider` (None: the process-global provider).

    Called by `proxy.telemetry.sdk`; nothing else needs it.
    """
    global _tracer, _on
    resolved = provider or trace.get_tracer_provider()
    _tracer = resolved.get_tracer(_SCOPE)
    _on = not isinstance(resolved, trace.NoOpTracerProvider)


def tracing_on() -> bool:
    """False when no span can ever be recorded (no exporter: a no-op provider is bound).

    Call sites skip building span attributes then; the caller's trace context still passes
    through to upstreams (`call_span` continues it with a non-recording span).
    """
    return _on


def mcp_span_name(method: str, target: str | None = None) -> str:
    """`{mcp.method.name} {target}` (a tool, prompt or resource name), per the MCP conventions."""
    return f"{method} {target}" if target else method


def http_span_name(method: str, route: str | None = None) -> str:
    """`{method} {route}` for an HTTP server span, per the HTTP conventions."""
    return f"{method.upper()} {route}" if route else method.upper()


def _incoming_context(
    headers: Mapping[str, str] | None, meta: Mapping[str, Any] | None
) -> otel_context.Context | None:
    if (
        not (meta and isinstance(meta.get("traceparent"), str))
        and isinstance(headers, CIMultiDictProxy | CIMultiDict)
        and "traceparent" not in headers
    ):
        return None  # the common case, decided in two look-ups: no trace context was sent
    carrier: dict[str, str] = {}
    if meta:
        carrier.update({k: meta[k] for k in _TRACE_META_KEYS if isinstance(meta.get(k), str)})
    if headers and "traceparent" not in carrier:
        if isinstance(headers, CIMultiDictProxy | CIMultiDict):  # case-insensitive look-ups
            carrier.update({k: headers[k] for k in _TRACE_META_KEYS if k in headers})
        else:  # a plain dict may have any case
            lowered = {k.lower(): v for k, v in headers.items() if k.lower() in _TRACE_META_KEYS}
            carrier.update(lowered)
    if "traceparent" not in carrier:
        return None
    ctx = propagate.extract(carrier)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None


def call_span(
    name: str,
    *,
    attributes: Callable[[], Mapping[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> AbstractContextManager[Span]:
    """The SERVER span of one proxied request, continuing the caller's trace if it sent one.

    `attributes` is called only for a span that records them (tracing on and the trace
    sampled): an unsampled call builds none. An exception leaving the block sets `error.type`
    (its class name) and an error status.
    With tracing off and no caller's trace to continue, no span is started at all (a plain
    `nullcontext`: this runs on every call).
    """
    parent = _incoming_context(headers, meta)
    if parent is None and not _on:
        return _NO_SPAN
    return _server_span(name, parent, attributes)


def _server_span(
    name: str,
    parent: otel_context.Context | None,
    attributes: Callable[[], Mapping[str, Any]] | None,
) -> _CurrentSpan:
    return _CurrentSpan(name, parent, SpanKind.SERVER, {}, attributes)


class _CurrentSpan:
    """A span started on entry and made current; an exception leaving the block sets its
    `error.type` and ERROR status; ended on exit. (What `start_as_current_span` with
    `use_span` does, in one object instead of three nested generators: it runs on every call.)
    """

    __slots__ = (
        "_attributes",
        "_context",
        "_kind",
        "_later",
        "_marked",
        "_name",
        "_span",
        "_token",
    )

    def __init__(
        self,
        name: str,
        context: otel_context.Context | None,
        kind: SpanKind,
        attributes: dict[str, Any],
        later: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self._name = name
        self._context = context
        self._kind = kind
        self._attributes = attributes
        self._later = later  # built once the span is known to record

    def __enter__(self) -> Span:
        span = _tracer.start_span(
            self._name,
            context=self._context,
            kind=self._kind,
            attributes=self._attributes,
            record_exception=False,
            set_status_on_exception=False,
        )
        if self._later is not None and span.is_recording():
            span.set_attributes(_clean(self._later()))
        self._span = span
        self._token = otel_context.attach(trace.set_span_in_context(span))
        self._marked = _span_made.set(True)
        return span

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        try:
            if exc_type is not None:
                mark_error(self._span, exc_type.__qualname__)
        finally:
            _span_made.reset(self._marked)
            otel_context.detach(self._token)
            self._span.end()


@contextmanager
def linked_span(
    name: str,
    *,
    link: Mapping[str, str] | None,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Span]:
    """A span that starts a trace of its own (deferred work runs long after the call that
    accepted it), linked to the span whose W3C context `link` carries (`traceparent`)."""
    links = []
    if link:
        linked = trace.get_current_span(propagate.extract(dict(link))).get_span_context()
        if linked.is_valid:
            links.append(trace.Link(linked))
    with (
        _tracer.start_as_current_span(
            name,
            context=otel_context.Context(),
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=_clean(attributes),
            record_exception=False,
            set_status_on_exception=False,
        ) as span,
        _errors_marked(span),
    ):
        yield span


def trace_carrier() -> dict[str, str]:
    """The current trace context as W3C headers, to link to it later (`linked_span`)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def child_span(
    name: str,
    *,
    attributes: Mapping[str, Any] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> AbstractContextManager[Span]:
    """A step of the current call (queue wait, ledger write, an upstream attempt).

    An exception leaving the block sets `error.type` (its class name) and an error status. When the
    call's span is not being recorded (tracing off, or not sampled) no child is made at all: the
    steps run on every proxied call, and a no-op span still costs.
    """
    if not _on:  # nothing can record: a caller's trace passes through without our spans
        return _NO_SPAN
    parent = trace.get_current_span()
    if not parent.is_recording():
        return nullcontext(parent)
    return _child_span(name, attributes, kind)


def _child_span(name: str, attributes: Mapping[str, Any] | None, kind: SpanKind) -> _CurrentSpan:
    return _CurrentSpan(name, None, kind, _clean(attributes))


@contextmanager
def _errors_marked(span: Span) -> Iterator[None]:
    """An exception leaving the block sets the span's `error.type` and ERROR status."""
    try:
        yield
    except BaseException as exc:
        mark_error(span, type(exc).__qualname__)
        raise


def current_span() -> Span:
    """The span of the current context (a non-recording span when there is none)."""
    if not _on and not _span_made.get():
        return INVALID_SPAN  # nothing records and no caller's trace is being continued
    return trace.get_current_span()


def set_attributes(span: Span, attributes: Mapping[str, Any]) -> None:
    """Set the attributes whose value is not None (None means "does not apply")."""
    cleaned = _clean(attributes)
    if cleaned and span.is_recording():
        span.set_attributes(cleaned)


def mark_error(span: Span, error_type: str, description: str | None = None) -> None:
    """Mark a span failed: `error.type` plus an ERROR status (description: never user data)."""
    if span.is_recording():
        span.set_attribute(Attr.ERROR_TYPE, error_type)
        span.set_status(StatusCode.ERROR, description)


def _no_trace() -> bool:
    """True when there is no trace context to pass on (nothing continued, nothing recorded)."""
    return not current_span().get_span_context().is_valid


def inject_headers(headers: MutableMapping[str, str]) -> None:
    """Write the current trace context as W3C headers (for an upstream request)."""
    if _no_trace():
        return
    propagate.inject(headers)


def inject_meta(meta: MutableMapping[str, Any]) -> None:
    """Write the current trace context into an MCP `params._meta` object."""
    if _no_trace():
        return
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    for key in _TRACE_META_KEYS:
        if key in carrier:
            meta[key] = carrier[key]


def current_trace_id() -> str | None:
    """The 32-hex trace id of the current span, if it is recording a valid trace."""
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


def hash_key(key: str | None) -> str | None:
    """Idempotency keys and session ids appear in telemetry only hashed (16 hex of sha256)."""
    return None if key is None else hashlib.sha256(key.encode()).hexdigest()[:16]


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (attributes or {}).items() if v is not None}
