"""Metric instruments rendered by the Prometheus reader on a handle's own registry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from policies.model import TelemetrySettings, UpstreamSpec
from proxy.mcp.transport.spans import traced
from proxy.mcp.wire.jsonrpc import parse_body
from proxy.telemetry import metrics
from proxy.telemetry.sdk import TelemetryHandle, active_handle, configure_telemetry


@pytest.fixture
def handle() -> Iterator[TelemetryHandle]:
    h = configure_telemetry(TelemetrySettings(), enabled=False, set_global=False)
    yield h
    h.shutdown()


def scrape(h: TelemetryHandle) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the registry as {(name, sorted labels): value}."""
    text = generate_latest(h.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_counters_and_histograms_use_prometheus_names(handle: TelemetryHandle) -> None:
    """Refusals count by reason/scope/upstream; durations are seconds histograms."""
    for _ in range(3):
        metrics.refusal("overloaded", "upstream:mail", "mail")
    metrics.retry("mail")
    metrics.budget_exhausted("acme")
    metrics.first_byte("mail", 0.2)
    metrics.operation_duration("tools/call", "mail", 0.3, "tool_error", tool="send_email")
    samples = scrape(handle)
    key = (("reason", "overloaded"), ("scope", "upstream:mail"), ("upstream", "mail"))
    assert samples[("interlock_admission_refusals_total", key)] == 3
    assert samples[("interlock_upstream_retries_total", (("upstream", "mail"),))] == 1
    assert samples[("interlock_budget_exhausted_total", (("tenant", "acme"),))] == 1
    first_byte = ("interlock_admission_to_first_byte_seconds_count", (("upstream", "mail"),))
    assert samples[first_byte] == 1
    duration = [
        labels
        for (name, labels) in samples
        if name == "mcp_server_operation_duration_seconds_count"
    ]
    assert duration == [
        (
            ("error_type", "tool_error"),
            ("gen_ai_tool_name", "send_email"),
            ("mcp_method_name", "tools/call"),
            ("upstream", "mail"),
        )
    ]


def test_state_gauges_report_every_registered_source(handle: TelemetryHandle) -> None:
    """Queue, running, cooldown, ledger gauges come from state sources; key states always show."""
    reading = metrics.StateReading(
        queue_depth={"global": 4, "tenant:acme": 1},
        oldest_wait_s={"global": 2.5},
        running={"global": 8},
        cooldown_remaining_s={"mail": 3.0, "files": 0.0},
        ledger_entries={"unknown": 1, "running": 2},
        ledger_oldest_unknown_s=42.0,
    )
    remove = metrics.add_state_source(lambda: reading)
    try:
        samples = scrape(handle)
    finally:
        remove()
    assert samples[("interlock_queue_depth", (("scope", "global"),))] == 4
    assert samples[("interlock_queue_depth", (("scope", "tenant:acme"),))] == 1
    assert samples[("interlock_queue_oldest_wait_seconds", (("scope", "global"),))] == 2.5
    assert samples[("interlock_running", (("scope", "global"),))] == 8
    assert samples[("interlock_upstream_cooldown_active", (("upstream", "mail"),))] == 1
    assert samples[("interlock_upstream_cooldown_active", (("upstream", "files"),))] == 0
    for state, count in {"unknown": 1, "running": 2, "accepted": 0, "blocked": 0}.items():
        assert samples[("interlock_ledger_entries", (("state", state),))] == count
    assert samples[("interlock_ledger_oldest_unknown_age_seconds", ())] == 42.0
    assert samples[("interlock_ledger_up", ())] == 1
    assert not [k for k in scrape(handle) if k[0] == "interlock_queue_depth"]


def test_unreadable_ledger_reports_no_counts_rather_than_zeros(handle: TelemetryHandle) -> None:
    """When the ledger cannot be read, entries are absent and `interlock_ledger_up` is 0."""
    remove = metrics.add_state_source(lambda: metrics.StateReading(ledger_up=False))
    try:
        samples = scrape(handle)
    finally:
        remove()
    assert not [k for k in samples if k[0] == "interlock_ledger_entries"]
    assert samples[("interlock_ledger_up", ())] == 0


def test_dropped_span_series_exist_from_the_start(handle: TelemetryHandle) -> None:
    """Alerts see `interlock_telemetry_spans_dropped_total` at 0 before anything was dropped."""
    samples = scrape(handle)
    for reason in ("queue_full", "export_failed", "shutdown"):
        assert samples[("interlock_telemetry_spans_dropped_total", (("reason", reason),))] == 0


def test_shutdown_unbinds_the_handle() -> None:
    """After shutdown, measurements go nowhere and no handle is active."""
    h = configure_telemetry(TelemetrySettings(), enabled=False, set_global=False)
    assert active_handle() is h
    h.shutdown()
    assert active_handle() is None
    metrics.refusal("overloaded", "global", "mail")  # must not raise into a shut-down provider


def test_handles_have_separate_registries() -> None:
    """Two handles in one process never share counts (each application scrapes its own)."""
    first = configure_telemetry(TelemetrySettings(), enabled=False, set_global=False)
    first.shutdown()
    second = configure_telemetry(TelemetrySettings(), enabled=False, set_global=False)
    try:
        metrics.retry("mail")
        assert scrape(second)[("interlock_upstream_retries_total", (("upstream", "mail"),))] == 1
        assert first.registry is not second.registry
    finally:
        second.shutdown()


def test_counters_stay_cumulative_across_scrapes(handle: TelemetryHandle) -> None:
    """A counter kept as sums reports its running total at every scrape, per label set."""
    key = ("interlock_admission_decisions_total", (("decision", "admitted"), ("upstream", "m")))
    metrics.admission("admitted", "m")
    metrics.admission("admitted", "m")
    assert scrape(handle)[key] == 2
    metrics.admission("admitted", "m")
    metrics.admission("queued", "m")
    samples = scrape(handle)
    assert samples[key] == 3
    queued = ("interlock_admission_decisions_total", (("decision", "queued"), ("upstream", "m")))
    assert samples[queued] == 1


def test_histograms_count_each_value_in_its_bucket_cumulatively(handle: TelemetryHandle) -> None:
    """Bounds are inclusive upper limits; buckets, count and sum stay cumulative across scrapes,
    one series per label set (the queue wait's: upstream and work class)."""
    mail = (("class", "interactive"), ("upstream", "mail"))

    def bucket(le: str, labels: tuple[tuple[str, str], ...] = mail) -> float:
        name = "interlock_queue_wait_seconds_bucket"
        return samples[(name, tuple(sorted((("le", le), *labels))))]

    for seconds in (0.005, 0.0051, 0.3, 400.0):
        metrics.queue_wait("mail", "interactive", seconds)
    metrics.queue_wait("files", "interactive", 0.001)
    metrics.queue_wait("mail", "background", 0.02)
    samples = scrape(handle)
    assert [bucket(le) for le in ("0.005", "0.01", "0.25", "0.5", "300", "+Inf")] == [
        1,
        2,
        2,
        3,
        3,
        4,
    ]
    assert samples[("interlock_queue_wait_seconds_count", mail)] == 4
    assert samples[("interlock_queue_wait_seconds_sum", mail)] == pytest.approx(400.3101)
    assert bucket("0.005", (("class", "interactive"), ("upstream", "files"))) == 1
    background = (("class", "background"), ("upstream", "mail"))
    assert [bucket(le, background) for le in ("0.01", "0.025")] == [0, 1]
    metrics.queue_wait("mail", "interactive", 2.0)
    samples = scrape(handle)
    assert bucket("2.5") == 4
    assert bucket("+Inf") == 5
    assert samples[("interlock_queue_wait_seconds_count", mail)] == 5
    assert samples[("interlock_queue_wait_seconds_count", background)] == 1


def test_histograms_are_declared_with_help_and_type(handle: TelemetryHandle) -> None:
    """Each histogram family carries its description and the histogram type, recorded or not."""
    text = generate_latest(handle.registry).decode()
    assert "# TYPE interlock_queue_wait_seconds histogram" in text
    assert "# HELP interlock_queue_wait_seconds Time calls waited for admission" in text
    metrics.first_byte("mail", 0.01)
    families = {f.name: f for f in text_string_to_metric_families(scrape_text(handle))}
    assert families["interlock_admission_to_first_byte_seconds"].type == "histogram"


def test_a_new_handle_starts_its_histograms_empty() -> None:
    """Values recorded while one handle was bound never show in the next handle's registry."""
    first = configure_telemetry(TelemetrySettings(), enabled=False, set_global=False)
    metrics.first_byte("mail", 0.2)
    first.shutdown()
    second = configure_telemetry(TelemetrySettings(), enabled=False, set_global=False)
    try:
        assert not [k for k in scrape(second) if k[0].startswith("interlock_admission_to_first")]
        metrics.first_byte("mail", 0.2)
        count = ("interlock_admission_to_first_byte_seconds_count", (("upstream", "mail"),))
        assert scrape(second)[count] == 1
    finally:
        second.shutdown()


def scrape_text(h: TelemetryHandle) -> str:
    return generate_latest(h.registry).decode()


def test_past_the_cache_limit_values_are_still_recorded_under_their_own_labels(
    handle: TelemetryHandle, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A label set's series is kept per key up to a limit; past it each call builds the label
    set again, and the value lands in the same series as before (nothing lost or mislabelled)."""
    monkeypatch.setattr(metrics, "_ATTRS_CACHE_MAX", 1)
    metrics.queue_wait("mail", "interactive", 0.001)  # cached: the one allowed key
    metrics.queue_wait("mail", "background", 0.02)  # past the limit: built for this call
    metrics.queue_wait("mail", "background", 0.02)
    samples = scrape(handle)
    count = "interlock_queue_wait_seconds_count"
    assert samples[(count, (("class", "interactive"), ("upstream", "mail")))] == 1
    assert samples[(count, (("class", "background"), ("upstream", "mail")))] == 2
    assert len(metrics._instruments.queue_wait_series) == 1


def test_admission_decisions_count_by_decision_upstream_and_reason(handle: TelemetryHandle) -> None:
    """Each (decision, upstream, reason) is its own series, however often one repeats: the label
    sets are shared between calls, so one decision's labels never stand for another's."""
    metrics.admission("admitted", "mail")
    metrics.admission("admitted", "mail")
    metrics.admission("rejected", "mail", "overloaded")
    metrics.admission("rejected", "mail", "paused")
    metrics.admission("rejected", "files", "overloaded")
    samples = scrape(handle)
    decisions = {
        labels: value
        for (name, labels), value in samples.items()
        if name == "interlock_admission_decisions_total"
    }
    assert decisions == {
        (("decision", "admitted"), ("reason", ""), ("upstream", "mail")): 2,  # no reason
        (("decision", "rejected"), ("reason", "overloaded"), ("upstream", "mail")): 1,
        (("decision", "rejected"), ("reason", "paused"), ("upstream", "mail")): 1,
        (("decision", "rejected"), ("reason", "overloaded"), ("upstream", "files")): 1,
    }


def test_per_call_histograms_keep_one_series_per_label_set(handle: TelemetryHandle) -> None:
    """Queue wait by (upstream, class), first byte by upstream, operation duration by its
    attributes: each label set counts and sums only its own values, however often it repeats."""
    metrics.queue_wait("mail", "interactive", 0.0)
    metrics.queue_wait("mail", "interactive", 0.0)
    metrics.queue_wait("mail", "background", 0.25)
    metrics.queue_wait("files", "interactive", 0.5)
    metrics.first_byte("mail", 0.1)
    metrics.first_byte("files", 0.2)
    metrics.first_byte("files", 0.3)
    metrics.operation_duration("tools/call", "mail", 0.3, tool="send_email")
    metrics.operation_duration("tools/call", "mail", 0.4, "tool_error", tool="send_email")
    samples = scrape(handle)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    wait = "interlock_queue_wait_seconds"
    assert value(f"{wait}_count", upstream="mail", **{"class": "interactive"}) == 2
    assert value(f"{wait}_sum", upstream="mail", **{"class": "interactive"}) == 0.0
    assert value(f"{wait}_count", upstream="mail", **{"class": "background"}) == 1
    assert value(f"{wait}_sum", upstream="mail", **{"class": "background"}) == 0.25
    assert value(f"{wait}_count", upstream="files", **{"class": "interactive"}) == 1
    first = "interlock_admission_to_first_byte_seconds"
    assert value(f"{first}_count", upstream="mail") == 1
    assert value(f"{first}_count", upstream="files") == 2
    assert value(f"{first}_sum", upstream="files") == pytest.approx(0.5)
    duration = "mcp_server_operation_duration_seconds_count"
    common = {"gen_ai_tool_name": "send_email", "mcp_method_name": "tools/call"}
    assert value(duration, upstream="mail", **common) == 1
    assert value(duration, upstream="mail", error_type="tool_error", **common) == 1


def test_every_proxied_mcp_call_is_timed_once_with_how_it_ended(handle: TelemetryHandle) -> None:
    """`spans.traced` times each call once: an answer counts without an error type, an error
    answer under its reason, and an exception leaving the block under its class name, and the
    exception still reaches the caller."""
    spec = UpstreamSpec("mail", "mcp_http", url="http://127.0.0.1:9/mcp")
    headers = CIMultiDictProxy(CIMultiDict({"Content-Type": "application/json"}))
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "send"}}
    message = parse_body(json.dumps(call).encode()).single

    def traced_call() -> Any:
        return traced(message, spec, headers, session_id=None, protocol_version="2026-07-28")

    with traced_call() as outcome:
        outcome.response({"jsonrpc": "2.0", "id": 1, "result": {}})
    with traced_call() as outcome:
        outcome.response({"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "data": {}}})
    with pytest.raises(ConnectionResetError), traced_call():
        raise ConnectionResetError("upstream went away")
    counts = {
        dict(labels).get("error_type"): value
        for (name, labels), value in scrape(handle).items()
        if name == "mcp_server_operation_duration_seconds_count"
    }
    assert counts == {None: 1, "-32001": 1, "ConnectionResetError": 1}
