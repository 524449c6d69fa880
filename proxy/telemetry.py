"""Tracing helpers over the OpenTelemetry *API* (the SDK is configured once, in `proxy.otel_setup`).

Every proxied call is one SERVER span; its steps are child spans. Trace context is continued
from the caller (W3C `traceparent` header or MCP `params._meta`) and propagated upstream.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind

__all__ = [
    "call_span",
    "child_span",
    "current_trace_id",
    "hash_key",
    "inject_headers",
    "inject_meta",
]

_tracer = trace.get_tracer("interlock")
_TRACE_META_KEYS = ("traceparent", "tracestate", "baggage")


def _incoming_context(
    headers: Mapping[str, str] | None, meta: Mapping[str, Any] | None
) -> otel_context.Context | None:
    carrier: dict[str, str] = {}
    if meta:
        carrier.update({k: str(meta[k]) for k in _TRACE_META_KEYS if isinstance(meta.get(k), str)})
    if headers and "traceparent" not in carrier:
        carrier.update({k: headers[k] for k in _TRACE_META_KEYS if k in headers})
    return propagate.extract(carrier) if carrier else None


@contextmanager
def call_span(
    name: str,
    *,
    attributes: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Iterator[Span]:
    """The SERVER span of one proxied request, continuing the caller's trace if it sent one."""
    parent = _incoming_context(headers, meta)
    with _tracer.start_as_current_span(
        name,
        context=parent,
        kind=SpanKind.SERVER,
        attributes=_clean(attributes),
        record_exception=False,
        set_status_on_exception=True,
    ) as span:
        yield span


@contextmanager
def child_span(
    name: str,
    *,
    attributes: Mapping[str, Any] | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """A step of the current call (queue wait, ledger write, an upstream attempt)."""
    with _tracer.start_as_current_span(
        name, kind=kind, attributes=_clean(attributes), record_exception=False
    ) as span:
        yield span


def inject_headers(headers: MutableMapping[str, str]) -> None:
    """Write the current trace context as W3C headers (for an upstream request)."""
    propagate.inject(headers)


def inject_meta(meta: MutableMapping[str, Any]) -> None:
    """Write the current trace context into an MCP `params._meta` object."""
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
    """Idempotency keys appear in telemetry only hashed (first 16 hex of sha256)."""
    return None if key is None else hashlib.sha256(key.encode()).hexdigest()[:16]


def _clean(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (attributes or {}).items() if v is not None}
