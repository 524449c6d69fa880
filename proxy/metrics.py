"""Metric instruments over the OpenTelemetry *API*; the Prometheus reader is attached at start-up.

Call sites use these small functions so instrument names live in one place.
"""

from __future__ import annotations

from opentelemetry import metrics

__all__ = [
    "budget_exhausted",
    "cooldown_started",
    "first_byte",
    "operation_duration",
    "refusal",
    "retry",
    "would_reject",
]

_meter = metrics.get_meter("interlock")

_refusals = _meter.create_counter(
    "interlock.admission.refusals", unit="{call}", description="Calls refused, by reason and scope"
)
_would_reject = _meter.create_counter(
    "interlock.admission.would_reject",
    unit="{call}",
    description="Observe mode: calls enforce mode would have refused",
)
_retries = _meter.create_counter(
    "interlock.upstream.retries", unit="{attempt}", description="Upstream attempts after the first"
)
_budget = _meter.create_counter(
    "interlock.budget.exhausted", unit="{call}", description="Calls refused for a spent budget"
)
_cooldowns = _meter.create_counter(
    "interlock.upstream.cooldowns", unit="{event}", description="Cooldowns started by upstreams"
)
_first_byte = _meter.create_histogram(
    "interlock.admission_to_first_byte",
    unit="s",
    description="From admission to the first upstream response byte",
)
_duration = _meter.create_histogram(
    "mcp.server.operation.duration", unit="s", description="Duration of proxied MCP operations"
)


def refusal(reason: str, scope: str, upstream: str) -> None:
    _refusals.add(1, {"reason": reason, "scope": scope, "upstream": upstream})


def would_reject(reason: str, scope: str, upstream: str) -> None:
    _would_reject.add(1, {"reason": reason, "scope": scope, "upstream": upstream})


def retry(upstream: str) -> None:
    _retries.add(1, {"upstream": upstream})


def budget_exhausted(tenant: str) -> None:
    _budget.add(1, {"tenant": tenant})


def cooldown_started(upstream: str) -> None:
    _cooldowns.add(1, {"upstream": upstream})


def first_byte(upstream: str, seconds: float) -> None:
    _first_byte.record(seconds, {"upstream": upstream})


def operation_duration(
    method: str, upstream: str, seconds: float, error_type: str | None = None
) -> None:
    attrs = {"mcp.method.name": method, "upstream": upstream}
    if error_type:
        attrs["error.type"] = error_type
    _duration.record(seconds, attrs)
