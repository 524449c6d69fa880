"""Instruments kept as plain numbers on the call path: counters as sums (`Sums`, reported to
OpenTelemetry at collection) and histograms as bucket counts (`Histogram`, rendered by the
Prometheus reader's registry at scrape time)."""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Mapping

from opentelemetry.metrics import CallbackOptions, Observation

__all__ = ["Histogram", "LabelKey", "Sums", "label_key"]

LabelKey = tuple[tuple[str, str], ...]
"""A label set as the instruments key it: its (name, value) pairs in order."""


def label_key(attributes: Mapping[str, str]) -> LabelKey:
    return tuple(attributes.items())


class Sums:
    """A counter kept as plain sums on the call path, reported to OTel at collection.

    Adding to an OTel SDK counter costs several microseconds per call (attribute copies, hashing,
    locks); adding to a dict costs a fraction of one. The totals are cumulative, so the observable
    counter that reports them exports exactly what a synchronous counter would have.
    """

    __slots__ = ("_lock", "_totals")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals: dict[LabelKey, float] = {}

    def add(self, value: float, attributes: Mapping[str, str]) -> None:
        self.add_to(label_key(attributes), value)

    def add_to(self, key: LabelKey, value: float) -> None:
        """Add to the total of a label set given as its `label_key` (callers that add to the
        same label set on every call keep its key instead of rebuilding it)."""
        with self._lock:
            self._totals[key] = self._totals.get(key, 0) + value

    def observe(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            totals = list(self._totals.items())
        return [Observation(total, dict(key)) for key, total in totals]


class Histogram:
    """A histogram kept as bucket counts on the call path, rendered by the Prometheus reader's
    registry at scrape time (`proxy.telemetry.sdk` registers the collector).

    Recording into an OTel SDK histogram costs about 4 us per value (a measurement object,
    attribute hashing, view matching, two locks); a bisect and two additions under one lock cost
    a tenth of that, and the proxy records two or three per call. Buckets are cumulative, with
    inclusive upper bounds and a last `+Inf` bucket, exactly as the SDK's explicit-bucket
    aggregation exports them. `name` is the Prometheus family name (unit suffix included).
    A caller takes a label set's series once (`series_for`) and counts into it (`record_into`).
    """

    __slots__ = ("_lock", "_series", "bounds", "description", "name")

    def __init__(self, name: str, description: str, bounds: tuple[float, ...]) -> None:
        self.name = name
        self.description = description
        self.bounds = bounds
        self._lock = threading.Lock()
        self._series: dict[LabelKey, list[float]] = {}

    def series_for(self, attributes: Mapping[str, str]) -> list[float]:
        """The live counts of one label set, made on first use: callers that record into the
        same label set on every call keep it and pass it to `record_into` (a series is never
        replaced or dropped while the histogram lives)."""
        key = label_key(attributes)
        with self._lock:
            series = self._series.get(key)
            if series is None:
                # one count per bound, the +Inf count, then the sum
                series = self._series[key] = [0] * (len(self.bounds) + 2)
        return series

    def record_into(self, series: list[float], value: float) -> None:
        """Count `value` in a series `series_for` gave."""
        index = bisect.bisect_left(self.bounds, value)
        with self._lock:
            series[index] += 1
            series[-1] += value

    def series(self) -> list[tuple[dict[str, str], list[int], float]]:
        """Every label set's (labels, cumulative bucket counts ending with +Inf, sum)."""
        with self._lock:
            copied = [(key, list(values)) for key, values in self._series.items()]
        out: list[tuple[dict[str, str], list[int], float]] = []
        for key, values in copied:
            cumulative, running = [], 0
            for count in values[:-1]:
                running += int(count)
                cumulative.append(running)
            out.append((dict(key), cumulative, values[-1]))
        return out
