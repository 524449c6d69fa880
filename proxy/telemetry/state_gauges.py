"""The gauges of current state, read at scrape time: each running application registers a
`StateReading` source (`add_state_source`, see `proxy.telemetry.metrics_route`) and the observable
gauges of `proxy.telemetry.metrics` report every source's reading through `observe`."""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry.metrics import CallbackOptions, Observation

from proxy.telemetry import labels

if TYPE_CHECKING:
    from ledger.writer import WriterStats

__all__ = [
    "LEDGER_STATES",
    "StateReading",
    "StateSource",
    "add_state_source",
    "ledger_entries",
    "ledger_writer",
    "observe",
    "per_scope",
    "per_upstream",
]

LEDGER_STATES = ("accepted", "running", "unknown", "blocked", "succeeded", "failed", "rejected")
"""Always exported (0 when empty) so alerts and dashboards never see a missing series."""


@dataclass(frozen=True, slots=True)
class StateReading:
    """Current state of one application, as the scrape-time gauges report it.

    Scope names are the scheduler's (e.g. "global", "tenant:acme", "upstream:mail").
    `ledger_entries` is None when the ledger could not be read (the gauge then reports nothing
    rather than a wrong zero); `ledger_up` is 0 in that case. `ledger_writer` is the ledger
    writer's counts (group commits, the operations they carried) since the store opened; None
    without a store.
    """

    queue_depth: Mapping[str, int] = field(default_factory=dict)
    oldest_wait_s: Mapping[str, float] = field(default_factory=dict)
    running: Mapping[str, int] = field(default_factory=dict)
    cooldown_remaining_s: Mapping[str, float] = field(default_factory=dict)
    ledger_entries: Mapping[str, int] | None = None
    ledger_oldest_unknown_s: float | None = None
    ledger_oldest_accepted_s: float | None = None
    ledger_up: bool = True
    ledger_writer: WriterStats | None = None


StateSource = Callable[[], StateReading]
_sources: list[StateSource] = []
_sources_lock = threading.Lock()


def add_state_source(source: StateSource) -> Callable[[], None]:
    """Report `source()` in the state gauges at every scrape; returns the function to remove it."""
    with _sources_lock:
        _sources.append(source)

    def remove() -> None:
        with _sources_lock:
            if source in _sources:
                _sources.remove(source)

    return remove


def _readings() -> list[StateReading]:
    with _sources_lock:
        sources = list(_sources)
    return [source() for source in sources]


def observe(
    pick: Callable[[StateReading], Iterable[tuple[Mapping[str, str], float]]],
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(value, dict(attrs)) for r in _readings() for attrs, value in pick(r)]

    return callback


def per_scope(
    values: Mapping[str, float], combine: Callable[[float, float], float] = operator.add
) -> list[tuple[Mapping[str, str], float]]:
    return labels.folded("scope", values, labels.scope, combine)


def per_upstream(values: Mapping[str, float]) -> list[tuple[Mapping[str, str], float]]:
    return labels.folded("upstream", values, lambda name: labels.bounded("upstream", name), max)


def ledger_entries(r: StateReading) -> list[tuple[Mapping[str, str], float]]:
    if r.ledger_entries is None:
        return []
    counts = dict.fromkeys(LEDGER_STATES, 0) | dict(r.ledger_entries)
    return [({"state": state}, value) for state, value in counts.items()]


def ledger_writer(
    count: Callable[[WriterStats], int],
) -> Callable[[StateReading], list[tuple[Mapping[str, str], float]]]:
    """Pick one of the ledger writer's counts (nothing without a store)."""

    def pick(r: StateReading) -> list[tuple[Mapping[str, str], float]]:
        return [] if r.ledger_writer is None else [({}, float(count(r.ledger_writer)))]

    return pick
