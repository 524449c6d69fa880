"""Metric label values are bounded: a caller cannot grow `/metrics` (or the process) by inventing
method names, tenants or run ids, and no label carries a control character."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from policies.model import TelemetrySettings
from proxy.telemetry import labels, metrics
from proxy.telemetry.sdk import TelemetryHandle, configure_telemetry


@pytest.fixture
def handle() -> Iterator[TelemetryHandle]:
    labels.reset()
    h = configure_telemetry(TelemetrySettings(), enabled=False, set_global=False)
    yield h
    h.shutdown()
    labels.reset()


def _series(h: TelemetryHandle, name: str) -> list[dict[str, str]]:
    text = generate_latest(h.registry).decode()
    return [
        dict(s.labels)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def test_unknown_mcp_methods_are_one_series(handle: TelemetryHandle):
    """10,000 invented JSON-RPC method names become `other`; known methods keep their name."""
    for i in range(10_000):
        metrics.operation_duration(f"x/{i}", "up", 0.01)
    metrics.operation_duration("tools/list", "up", 0.01)
    methods = {
        s["mcp_method_name"] for s in _series(handle, "mcp_server_operation_duration_seconds_count")
    }
    assert methods == {"other", "tools/list"}


def test_tenant_values_are_capped_in_length_number_and_characters(handle: TelemetryHandle):
    """Long tenant names with CR/LF are cut and cleaned; past the cap new ones become `other`."""
    for i in range(500):
        metrics.budget_exhausted(f"tenant-{i}\r\n" + "x" * 5000)
    values = [s["tenant"] for s in _series(handle, "interlock_budget_exhausted_total")]
    assert len(values) == labels.MAX_VALUES + 1
    assert "other" in values
    assert all(len(v) <= labels.MAX_CHARS for v in values)
    assert not any(ch in v for v in values for ch in '\r\n\t\\"')
    assert len(generate_latest(handle.registry)) < 100_000


def test_scope_gauges_fold_overflow_into_other(handle: TelemetryHandle):
    """A thousand run scopes report at most the cap plus `run:other`, whose depth is the sum of
    the folded ones; tenants keep their own allowance."""
    reading = metrics.StateReading(
        queue_depth={**{f"run:r{i}": 1 for i in range(1000)}, "tenant:acme": 2, "global": 3}
    )
    remove = metrics.add_state_source(lambda: reading)
    try:
        depth = {s["scope"]: s for s in _series(handle, "interlock_queue_depth")}
        text = generate_latest(handle.registry).decode()
    finally:
        remove()
    runs = [scope for scope in depth if scope.startswith("run:")]
    assert len(runs) == labels.MAX_VALUES + 1
    assert "tenant:acme" in depth
    assert "global" in depth
    samples = {
        s.labels["scope"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "interlock_queue_depth"
    }
    assert samples["run:other"] == 1000 - labels.MAX_VALUES
