"""Interlock's own Prometheus histograms, as the benchmarks read them from `/metrics`.

A benchmark scrapes before and after a window and subtracts, so the window's calls alone are
counted. A quantile is given as the bucket its rank falls in (0 as the first bucket's lower
edge), beside the window's exact mean (from `_sum` and `_count`): no interpolation inside the
bucket, which is what Prometheus' `histogram_quantile` adds and what would print 4.95 ms for a
window of waits that were all 0 (all in the first bucket, up to 5 ms).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from aiohttp import ClientSession
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["SUM", "Quantile", "cumulative_buckets", "quantile", "scrape", "subtract"]

Buckets = dict[float, float]
"""Upper bound (`le`, +Inf included) → cumulative count; the key `SUM` holds the `_sum`."""
SUM = -1.0  # no bucket bound is negative


@dataclass(frozen=True, slots=True)
class Quantile:
    lower: float
    upper: float  # math.inf when the rank falls in the +Inf bucket
    count: float  # observations in the window
    mean: float

    def ms(self) -> str:
        """'in 50–100 ms (mean 41.20 ms, 438 calls)' as the tables print it."""
        upper = "∞" if math.isinf(self.upper) else f"{self.upper * 1000:g}"
        return (
            f"in {self.lower * 1000:g}–{upper} ms (mean {self.mean * 1000:.2f} ms, "
            f"{self.count:.0f} calls)"
        )


async def scrape(mcp_url: str) -> str | None:
    """The Prometheus text of the Interlock serving the MCP endpoint `mcp_url` (its `/mcp/NAME`
    route), or None when /metrics does not answer 200."""
    metrics_url = mcp_url.rsplit("/mcp/", 1)[0] + "/metrics"
    async with ClientSession() as session, session.get(metrics_url) as answer:
        return await answer.text() if answer.status == 200 else None


def cumulative_buckets(text: str, family: str, **labels: str) -> Buckets:
    """The `family` histogram's buckets (and its sum, at `SUM`) over every series whose labels
    include `labels`, added up as `sum by (le)` would."""
    found: Buckets = {}
    for metric in text_string_to_metric_families(text):
        if metric.name != family:
            continue
        for sample in metric.samples:
            if any(sample.labels.get(k) != v for k, v in labels.items()):
                continue
            if sample.name == f"{family}_bucket":
                key = float(sample.labels["le"])
            elif sample.name == f"{family}_sum":
                key = SUM
            else:
                continue
            found[key] = found.get(key, 0.0) + sample.value
    return found


def subtract(after: Buckets, before: Buckets) -> Buckets:
    """What was observed between two scrapes (a series absent before counted zero then)."""
    return {le: count - before.get(le, 0.0) for le, count in after.items()}


def quantile(q: float, buckets: Buckets) -> Quantile | None:
    """The bucket the `q` quantile of cumulative `buckets` falls in, or None when nothing was
    observed."""
    bounds = sorted(b for b in buckets if b != SUM)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    total = buckets[bounds[-1]]
    mean = buckets.get(SUM, math.nan) / total
    lower = 0.0
    for upper in bounds:
        if buckets[upper] >= q * total:
            return Quantile(lower, upper, total, mean)
        lower = upper
    return None  # unreachable: the last bucket holds every observation
