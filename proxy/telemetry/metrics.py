"""Metric instruments over the OpenTelemetry *API*; the Prometheus reader is attached at start-up.

Call sites use these small functions so instrument names live in one place, and every label
value passes `proxy.telemetry.labels` (bounded in length, characters and number). Gauges of current
state (queue depth, oldest wait, running, cooldowns, ledger entries by state) are observed at
scrape time from the `StateReading` sources registered with `add_state_source` (see
`proxy.telemetry.metrics_route`, which registers one per running application).

Prometheus names (dots become underscores; counters get `_total`, seconds get `_seconds`):
`interlock_admission_refusals_total{reason,scope,upstream}`, `interlock_queue_depth{scope}`,
`interlock_queue_oldest_wait_seconds{scope}`, `interlock_running{scope}`,
`interlock_upstream_cooldown_active{upstream}`, `interlock_ledger_entries{state}`,
`interlock_ledger_commits_total`, `interlock_ledger_committed_operations_total`,
`interlock_admission_to_first_byte_seconds{upstream}`,
`interlock_queue_wait_seconds{upstream,class}`, `mcp_server_operation_duration_seconds`, ...
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from opentelemetry import metrics
from opentelemetry.metrics import Meter, MeterProvider

from proxy.telemetry import labels
from proxy.telemetry.instruments import Histogram, LabelKey, Sums, label_key
from proxy.telemetry.state_gauges import (
    LEDGER_STATES,
    StateReading,
    StateSource,
    add_state_source,
    ledger_entries,
    ledger_writer,
    observe,
    per_scope,
    per_upstream,
)

__all__ = [
    "LEDGER_STATES",
    "Histogram",
    "StateReading",
    "StateSource",
    "add_state_source",
    "admission",
    "bind_meter_provider",
    "bound_histograms",
    "budget_exhausted",
    "cooldown_started",
    "first_byte",
    "idempotency_outcome",
    "operation_duration",
    "queue_wait",
    "refusal",
    "rejection_unrecorded",
    "retry",
    "token_usage",
    "would_reject",
]

_SCOPE = "interlock"

# Latency buckets in seconds (the OTel default buckets are meant for milliseconds).
_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# mcp.server.operation.duration buckets recommended by the MCP semantic conventions.
_MCP_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class _Instruments:
    """Every instrument of one meter; rebuilt when the meter provider is rebound."""

    def __init__(self, meter: Meter) -> None:
        def c(name: str, unit: str, description: str) -> Sums:
            sums = Sums()
            meter.create_observable_counter(name, [sums.observe], unit, description)
            return sums

        # Attribute mappings built once and shared (never mutated), cleared with the instruments.
        self.upstream_attrs: dict[str, Mapping[str, str]] = {}
        # The per-call recorders (an admission decision, a claim's outcome, queue wait, first
        # byte, operation duration) keep each label set's key or live series instead: no
        # mapping per call.
        self.decision_keys: dict[tuple[str, str, str | None], LabelKey] = {}
        self.outcome_keys: dict[tuple[str, str], LabelKey] = {}
        self.queue_wait_series: dict[tuple[str, str], list[float]] = {}
        self.first_byte_series: dict[str, list[float]] = {}
        self.duration_series: dict[tuple[str | None, ...], list[float]] = {}
        self.refusals = c("interlock.admission.refusals", "{call}", "Calls refused")
        self.admissions = c(
            "interlock.admission.decisions", "{call}", "Admission decisions by decision and reason"
        )
        self.would_reject = c(
            "interlock.admission.would_reject", "{call}", "Observe mode: calls enforce would refuse"
        )
        self.retries = c(
            "interlock.upstream.retries", "{attempt}", "Upstream attempts after the first"
        )
        self.budget = c("interlock.budget.exhausted", "{call}", "Calls refused for a spent budget")
        self.cooldowns = c(
            "interlock.upstream.cooldowns", "{event}", "Cooldowns started by upstreams"
        )
        self.outcomes = c(
            "interlock.idempotency.outcomes", "{call}", "Ledger claims by idempotency outcome"
        )
        self.tokens = c("interlock.model.tokens", "{token}", "Model tokens by direction")
        # The ledger writer's own counts, read at scrape time: operations per commit is how much
        # the group commit shares each durable commit (fsync) among concurrent writes.
        meter.create_observable_counter(
            "interlock.ledger.commits",
            [observe(ledger_writer(lambda stats: stats.batches))],
            "{commit}",
            "Ledger transactions committed by the writer (each one durable commit)",
        )
        meter.create_observable_counter(
            "interlock.ledger.committed_operations",
            [observe(ledger_writer(lambda stats: stats.operations))],
            "{operation}",
            "Ledger write operations carried by those commits",
        )
        self.unrecorded = c(
            "interlock.ledger.rejections_unrecorded",
            "{record}",
            "Refusal records not written (dropped: backlog full; failed: the ledger refused)",
        )
        # Histograms: named as the OTel Prometheus reader would name `interlock.queue.wait` (s).
        self.first_byte = Histogram(
            "interlock_admission_to_first_byte_seconds",
            "From admission to the first upstream response byte",
            _SECONDS_BUCKETS,
        )
        self.queue_wait = Histogram(
            "interlock_queue_wait_seconds", "Time calls waited for admission", _SECONDS_BUCKETS
        )
        self.duration = Histogram(
            "mcp_server_operation_duration_seconds",
            "Duration of proxied MCP operations",
            _MCP_BUCKETS,
        )
        self.histograms = (self.first_byte, self.queue_wait, self.duration)
        g = meter.create_observable_gauge
        g(
            "interlock.queue.depth",
            [observe(lambda r: per_scope(r.queue_depth))],
            "{call}",
            "Calls waiting for admission, per scope",
        )
        g(
            "interlock.queue.oldest_wait",
            [observe(lambda r: per_scope(r.oldest_wait_s, max))],
            "s",
            "Age of the oldest call waiting for admission, per scope",
        )
        g(
            "interlock.running",
            [observe(lambda r: per_scope(r.running))],
            "{call}",
            "Calls admitted and not finished, per scope",
        )
        g(
            "interlock.upstream.cooldown_active",
            [
                observe(
                    lambda r: per_upstream(
                        {u: float(s > 0) for u, s in r.cooldown_remaining_s.items()}
                    )
                )
            ],
            "1",
            "1 while the upstream is in cooldown after a 429/503",
        )
        g(
            "interlock.upstream.cooldown_remaining",
            [observe(lambda r: per_upstream(r.cooldown_remaining_s))],
            "s",
            "Seconds left in the upstream's cooldown",
        )
        g(
            "interlock.ledger.entries",
            [observe(ledger_entries)],
            "{entry}",
            "Ledger entries by state, read from the ledger",
        )
        g(
            "interlock.ledger.oldest_unknown_age",
            [
                observe(
                    lambda r: (
                        []
                        if r.ledger_oldest_unknown_s is None
                        else [({}, r.ledger_oldest_unknown_s)]
                    )
                )
            ],
            "s",
            "Age of the oldest entry in state unknown (absent when there is none)",
        )
        g(
            "interlock.ledger.oldest_accepted_age",
            [
                observe(
                    lambda r: (
                        []
                        if r.ledger_oldest_accepted_s is None
                        else [({}, r.ledger_oldest_accepted_s)]
                    )
                )
            ],
            "s",
            "Age of the oldest entry in state accepted: deferred work waiting to start "
            "(absent when there is none)",
        )
        g(
            "interlock.ledger.up",
            [observe(lambda r: [({}, float(r.ledger_up))])],
            "1",
            "1 when the ledger could be read at the last refresh",
        )


# Until `proxy.telemetry.sdk` binds a provider, measurements go nowhere. The instruments are never
# created on the global proxy meter: binding the same provider again would register them twice.
_instruments = _Instruments(metrics.NoOpMeterProvider().get_meter(_SCOPE))


def bind_meter_provider(provider: MeterProvider | None) -> None:
    """Record into `provider` from now on (None: nowhere).

    Called by `proxy.telemetry.sdk`; nothing else needs it.
    """
    global _instruments
    labels.reset()  # a new registry starts with a fresh allowance of label values
    _instruments = _Instruments((provider or metrics.NoOpMeterProvider()).get_meter(_SCOPE))


def bound_histograms() -> tuple[Histogram, ...]:
    """The histograms of the instruments bound now (a new set at every `bind_meter_provider`)."""
    return _instruments.histograms


def _upstream(name: str) -> str:
    return labels.bounded("upstream", name)


K = TypeVar("K")
V = TypeVar("V")
_ATTRS_CACHE_MAX = 1024  # upstream names come from the configuration: far fewer in practice


def _shared(cache: dict[K, V], key: K, build: Callable[..., V], *args: Any) -> V:
    """`build(*args)` made once per `key` and shared (never mutated): an attribute mapping, a
    label set's key or its live series. The per-call recorders write `cache.get(key) or
    _made(...)` instead, which costs one look-up when the value is kept (their values, a
    non-empty key or series, are never falsy)."""
    value = cache.get(key)
    return value if value is not None else _made(cache, key, build, *args)


def _made(cache: dict[K, V], key: K, build: Callable[..., V], *args: Any) -> V:
    """`build(*args)`, kept for `key` while the cache is below `_ATTRS_CACHE_MAX` entries (past
    that it is built again per call; the labels themselves stay bounded)."""
    value = build(*args)
    if len(cache) < _ATTRS_CACHE_MAX:
        cache[key] = value
    return value


def _series(
    histogram: Histogram, attributes: Callable[..., Mapping[str, str]], *args: Any
) -> list[float]:
    """The live series of the label set `attributes(*args)` (for `_made` to keep)."""
    return histogram.series_for(attributes(*args))


def _upstream_attrs(name: str) -> Mapping[str, str]:
    """`{"upstream": <bounded name>}`, one shared mapping per upstream."""
    return _shared(_instruments.upstream_attrs, name, _build_upstream_attrs, name)


def _build_upstream_attrs(name: str) -> Mapping[str, str]:
    return {"upstream": _upstream(name)}


def _refusal_attrs(reason: str, scope: str, upstream: str) -> dict[str, str]:
    return {
        "reason": labels.bounded("reason", reason),
        "scope": labels.scope(scope),
        "upstream": _upstream(upstream),
    }


def refusal(reason: str, scope: str, upstream: str) -> None:
    """A call was refused (by admission, cooldown, budget or deadline)."""
    _instruments.refusals.add(1, _refusal_attrs(reason, scope, upstream))


def admission(decision: str, upstream: str, reason: str | None = None) -> None:
    """An admission decision: admitted | queued | rejected | observed | deferred."""
    key = (decision, upstream, reason)
    keys = _instruments.decision_keys
    _instruments.admissions.add_to(keys.get(key) or _made(keys, key, _decision_key, *key), 1)


def _decision_key(decision: str, upstream: str, reason: str | None) -> LabelKey:
    attrs = {"decision": decision, "upstream": _upstream(upstream)}
    if reason:
        attrs["reason"] = labels.bounded("reason", reason)
    return label_key(attrs)


def would_reject(reason: str, scope: str, upstream: str) -> None:
    """Observe mode: enforce mode would have refused this call."""
    _instruments.would_reject.add(1, _refusal_attrs(reason, scope, upstream))


def rejection_unrecorded(why: str, count: int = 1) -> None:
    """Refusal records written behind the answer that never reached the ledger."""
    _instruments.unrecorded.add(count, {"why": why})


def retry(upstream: str) -> None:
    """An upstream attempt after the first."""
    _instruments.retries.add(1, _upstream_attrs(upstream))


def budget_exhausted(tenant: str) -> None:
    """A call was refused because the tenant's budget is spent."""
    _instruments.budget.add(1, {"tenant": labels.bounded("tenant", tenant)})


def cooldown_started(upstream: str) -> None:
    """An upstream answered 429/503 and went into cooldown."""
    _instruments.cooldowns.add(1, _upstream_attrs(upstream))


def idempotency_outcome(outcome: str, upstream: str) -> None:
    """A ledger claim's outcome: new | replayed | in_progress | mismatch | needs_reconciliation."""
    key = (outcome, upstream)
    keys = _instruments.outcome_keys
    _instruments.outcomes.add_to(keys.get(key) or _made(keys, key, _outcome_key, *key), 1)


def _outcome_key(outcome: str, upstream: str) -> LabelKey:
    return label_key({"outcome": outcome, "upstream": _upstream(upstream)})


def first_byte(upstream: str, seconds: float) -> None:
    """From admission to the first byte of the upstream's answer."""
    histogram, kept = _instruments.first_byte, _instruments.first_byte_series
    series = kept.get(upstream) or _made(
        kept, upstream, _series, histogram, _build_upstream_attrs, upstream
    )
    histogram.record_into(series, seconds)


def queue_wait(upstream: str, work_class: str, seconds: float) -> None:
    """How long an admitted call waited in the queue, per upstream and work class (a priority
    band: one of four names, so the label stays bounded)."""
    histogram, kept = _instruments.queue_wait, _instruments.queue_wait_series
    key = (upstream, work_class)
    series = kept.get(key) or _made(kept, key, _series, histogram, _class_attrs, *key)
    histogram.record_into(series, seconds)


def _class_attrs(upstream: str, work_class: str) -> Mapping[str, str]:
    return {"upstream": _upstream(upstream), "class": labels.bounded("class", work_class)}


def token_usage(upstream: str, model: str | None, input_tokens: int, output_tokens: int) -> None:
    """Model tokens reported by a model API's usage block."""
    base = {"upstream": _upstream(upstream), "model": labels.bounded("model", model or "unknown")}
    if input_tokens:
        _instruments.tokens.add(input_tokens, base | {"direction": "input"})
    if output_tokens:
        _instruments.tokens.add(output_tokens, base | {"direction": "output"})


def operation_duration(
    method: str,
    upstream: str,
    seconds: float,
    error_type: str | None = None,
    *,
    tool: str | None = None,
    transport: str | None = None,
) -> None:
    """`mcp.server.operation.duration` of one proxied MCP request (MCP conventions' attributes)."""
    key = (method, upstream, error_type, tool, transport)
    histogram, kept = _instruments.duration, _instruments.duration_series
    series = kept.get(key) or _made(kept, key, _series, histogram, _duration_attrs, *key)
    histogram.record_into(series, seconds)


def _duration_attrs(
    method: str, upstream: str, error_type: str | None, tool: str | None, transport: str | None
) -> Mapping[str, str]:
    attrs = {"mcp.method.name": labels.method(method), "upstream": _upstream(upstream)}
    if error_type:
        attrs["error.type"] = labels.bounded("error.type", error_type)
    if tool:
        attrs["gen_ai.tool.name"] = labels.bounded("gen_ai.tool.name", tool)
    if transport:
        attrs["network.transport"] = transport
    return attrs
