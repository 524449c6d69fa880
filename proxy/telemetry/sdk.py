"""OpenTelemetry SDK set-up: the only module that imports the SDK and the exporters.

`interlock serve` calls `configure_telemetry` once, before `create_app`. It builds

- a `TracerProvider` (resource `service.name`; new traces head-sampled at `sample_ratio`, a
  caller's decision kept) whose spans go through a bounded batch queue to an
  OTLP/HTTP exporter at `{otlp_endpoint}/v1/traces`, on a worker thread, so a collector that is
  down or slow never slows a proxied call: when the queue is full, spans are dropped and counted
  in `interlock.telemetry.spans_dropped` (reason `queue_full`), as are spans of failed exports
  (reason `export_failed`);
- a `MeterProvider` whose Prometheus reader lives on a dedicated `CollectorRegistry` (never the
  process-global one, so several applications can run in one process), served by `/metrics`.

Library code (`proxy.telemetry.tracing`, `proxy.telemetry.metrics`) sees only the OTel API; this
module binds those modules to the providers it built.
"""

from __future__ import annotations

import atexit
import functools
import logging
import re
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from opentelemetry import metrics as metrics_api
from opentelemetry import trace as trace_api
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Counter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from policies.model import TelemetrySettings
from proxy.telemetry import metrics, tracing

__all__ = ["TelemetryHandle", "active_handle", "configure_telemetry", "traces_url"]

log = logging.getLogger("interlock.telemetry")

_DEFAULT_SCHEDULE_DELAY_S = 1.0
_MAX_EXPORT_BATCH = 512
_SHUTDOWN_GRACE_S = 3.0

_lock = threading.Lock()
_active: TelemetryHandle | None = None
_globals_set = False


def traces_url(otlp_endpoint: str) -> str:
    """The OTLP/HTTP traces URL for a configured base endpoint (`/v1/traces` appended once)."""
    base = otlp_endpoint.rstrip("/")
    return base if base.endswith("/v1/traces") else f"{base}/v1/traces"


class _DropCounter:
    """Counts spans Interlock had to drop, by reason, into one OTel counter."""

    def __init__(self, counter: Counter) -> None:
        self._counter = counter
        self._lock = threading.Lock()
        self.total = 0

    def add_zero(self, reason: str) -> None:
        self._counter.add(0, {"reason": reason})

    def add(self, count: int, reason: str) -> None:
        if count <= 0:
            return
        with self._lock:
            self.total += count
        self._counter.add(count, {"reason": reason})


@functools.lru_cache(maxsize=256)
def _label_name(attribute: str) -> str:
    """An attribute key as a Prometheus label name (`mcp.method.name` -> `mcp_method_name`)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


class _Histograms(Collector):
    """Renders the proxy's bucket-count histograms (`metrics.Histogram`) on one registry."""

    def __init__(self, histograms: Sequence[metrics.Histogram]) -> None:
        self._histograms = tuple(histograms)

    def collect(self) -> Iterator[Metric]:
        for histogram in self._histograms:
            name = histogram.name
            family = Metric(name, histogram.description, "histogram")
            bounds = [*(str(bound) for bound in histogram.bounds), "+Inf"]
            for attrs, cumulative, total in histogram.series():
                labels = {_label_name(k): v for k, v in attrs.items()}
                for le, count in zip(bounds, cumulative, strict=True):
                    family.add_sample(f"{name}_bucket", labels | {"le": le}, count)
                family.add_sample(f"{name}_count", labels, cumulative[-1])
                family.add_sample(f"{name}_sum", labels, total)
            yield family


class _Gate:
    """Spans handed to the batch queue and not yet taken by the exporter, bounded.

    The SDK's queue drops silently when full; this gate refuses a span *before* the queue would,
    so every drop is counted. The count is released when the worker hands a batch to the
    exporter, so it never undercounts what the queue holds.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held = 0
        self._lock = threading.Lock()

    def try_take(self) -> bool:
        with self._lock:
            if self._held >= self.capacity:
                return False
            self._held += 1
            return True

    def release(self, count: int) -> None:
        with self._lock:
            self._held = max(0, self._held - count)


class _CountingExporter(SpanExporter):
    """Wraps the OTLP exporter: releases the gate, counts failed batches as dropped spans."""

    def __init__(self, inner: SpanExporter, gate: _Gate, dropped: _DropCounter) -> None:
        self._inner = inner
        self._gate = gate
        self._dropped = dropped
        self._closing_at: float | None = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self._gate.release(len(spans))
        if self._closing_at is not None and time.monotonic() > self._closing_at:
            self._dropped.add(len(spans), "shutdown")
            return SpanExportResult.FAILURE
        try:
            result = self._inner.export(spans)
        except Exception:  # an exporter bug must cost spans, never the worker thread
            log.exception("span export raised")
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self._dropped.add(len(spans), "export_failed")
        return result

    def begin_closing(self, grace_s: float) -> None:
        """From `grace_s` from now, batches are dropped instead of sent (bounds shutdown)."""
        self._closing_at = time.monotonic() + grace_s

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _CountingBatchProcessor(BatchSpanProcessor):
    """A `BatchSpanProcessor` whose bounded queue counts the spans it cannot take."""

    def __init__(
        self, exporter: _CountingExporter, gate: _Gate, dropped: _DropCounter, delay_s: float
    ) -> None:
        super().__init__(
            exporter,
            max_queue_size=gate.capacity,
            schedule_delay_millis=max(1.0, delay_s * 1000),
            max_export_batch_size=min(_MAX_EXPORT_BATCH, gate.capacity),
        )
        self._gate = gate
        self._dropped = dropped
        self._closed = False

    def on_end(self, span: ReadableSpan) -> None:
        if not (span.context and span.context.trace_flags.sampled):
            return
        if self._closed:
            self._dropped.add(1, "shutdown")
        elif self._gate.try_take():
            super().on_end(span)
        else:
            self._dropped.add(1, "queue_full")

    def shutdown(self) -> None:
        self._closed = True
        super().shutdown()  # type: ignore[no-untyped-call]


@dataclass
class TelemetryHandle:
    """What `configure_telemetry` built; `shutdown()` flushes (bounded) and unbinds it."""

    settings: TelemetrySettings
    registry: CollectorRegistry
    meter_provider: MeterProvider
    tracer_provider: TracerProvider | None = None
    _exporter: _CountingExporter | None = field(default=None, repr=False)
    _dropped: _DropCounter | None = field(default=None, repr=False)
    _closed: bool = field(default=False, repr=False)

    @property
    def tracing(self) -> bool:
        """True when spans are recorded and exported."""
        return self.tracer_provider is not None

    @property
    def spans_dropped(self) -> int:
        """Spans dropped since start-up (also exported as `interlock_telemetry_spans_dropped`)."""
        return self._dropped.total if self._dropped else 0

    def force_flush(self, timeout_s: float = 5.0) -> bool:
        """Export what is queued now. Blocking: from async code, run it in a thread."""
        if self.tracer_provider is None or self._closed:
            return True
        return self.tracer_provider.force_flush(int(timeout_s * 1000))

    def shutdown(self, grace_s: float = _SHUTDOWN_GRACE_S) -> None:
        """Flush within `grace_s` (later batches are dropped and counted), then release all."""
        global _active
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        if self._exporter is not None:
            self._exporter.begin_closing(grace_s)
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        self.meter_provider.shutdown()
        with _lock:
            if _active is self:
                _active = None
                tracing.bind_tracer_provider(None)
                metrics.bind_meter_provider(None)


def active_handle() -> TelemetryHandle | None:
    """The handle the proxy's telemetry is currently bound to, if any."""
    return _active


def configure_telemetry(
    settings: TelemetrySettings,
    *,
    enabled: bool,
    set_global: bool = True,
    schedule_delay_s: float | None = None,
    instance_id: str | None = None,
) -> TelemetryHandle:
    """Build the SDK providers for `settings` and bind the proxy's telemetry to them.

    Tracing is on when `enabled` (and `settings.enabled`) and `settings.otlp_endpoint` is set;
    otherwise no span is recorded, yet an incoming trace context still passes through to
    upstreams. Metrics are always on: `/metrics` is part of the contract.
    `set_global` also installs the providers as the process-wide OTel defaults (once per process;
    tests pass False so they can configure several times). `schedule_delay_s` is how long the
    batch processor waits to fill a batch (default 1 s).
    """
    global _active, _globals_set
    attributes: dict[str, str] = {"service.name": settings.service_name}
    if instance_id:
        attributes["service.instance.id"] = instance_id
    resource = Resource.create(attributes)
    registry = CollectorRegistry(auto_describe=True)
    reader = PrometheusMetricReader(registry=registry, scope_info_enabled=False)
    meter_provider = MeterProvider(
        resource=resource, metric_readers=[reader], shutdown_on_exit=False
    )
    handle = TelemetryHandle(settings=settings, registry=registry, meter_provider=meter_provider)
    dropped = _DropCounter(
        meter_provider.get_meter("interlock.telemetry").create_counter(
            "interlock.telemetry.spans_dropped",
            unit="{span}",
            description="Spans not exported: queue full, export failed, or shut down",
        )
    )
    handle._dropped = dropped
    for reason in ("queue_full", "export_failed", "shutdown"):
        dropped.add_zero(reason)  # the series exist from the start, so alerts see a 0
    if enabled and settings.enabled and settings.otlp_endpoint:
        # Loaded only when spans are exported (the exporter and protobuf cost ~3 MB).
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        gate = _Gate(max(1, settings.max_queue_size))
        otlp = OTLPSpanExporter(
            endpoint=traces_url(settings.otlp_endpoint), timeout=settings.export_timeout_s
        )
        exporter = _CountingExporter(otlp, gate, dropped)
        delay = _DEFAULT_SCHEDULE_DELAY_S if schedule_delay_s is None else schedule_delay_s
        # A new trace is recorded with probability `sample_ratio` (by its trace id); a call that
        # continues a caller's trace keeps the caller's decision. An unsampled call still passes
        # its trace context upstream, flagged not sampled, and makes no child span.
        sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio))
        tracer_provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False)
        tracer_provider.add_span_processor(_CountingBatchProcessor(exporter, gate, dropped, delay))
        handle.tracer_provider = tracer_provider
        handle._exporter = exporter
    with _lock:
        previous = _active
        _active = handle
        tracing.bind_tracer_provider(handle.tracer_provider or trace_api.NoOpTracerProvider())
        metrics.bind_meter_provider(meter_provider)
        registry.register(_Histograms(metrics.bound_histograms()))
        if set_global and not _globals_set:
            _globals_set = True
            metrics_api.set_meter_provider(meter_provider)
            if handle.tracer_provider is not None:
                trace_api.set_tracer_provider(handle.tracer_provider)
    atexit.register(handle.shutdown)
    if previous is not None:
        log.info("telemetry reconfigured; the previous handle stays open until shut down")
    return handle
