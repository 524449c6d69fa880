"""The overload benchmark's queue-wait figures come from Interlock's own histogram: read from the
Prometheus text, subtracted between two scrapes, and a quantile estimated as Prometheus'
`histogram_quantile` does."""

from __future__ import annotations

import math

from bench.histograms import SUM, Quantile, cumulative_buckets, quantile, subtract

TEXT = """\
# HELP interlock_queue_wait_seconds Time calls waited for admission
# TYPE interlock_queue_wait_seconds histogram
interlock_queue_wait_seconds_bucket{class="background",upstream="up",le="0.01"} 2.0
interlock_queue_wait_seconds_bucket{class="background",upstream="up",le="0.1"} 10.0
interlock_queue_wait_seconds_bucket{class="background",upstream="up",le="+Inf"} 10.0
interlock_queue_wait_seconds_count{class="background",upstream="up"} 10.0
interlock_queue_wait_seconds_sum{class="background",upstream="up"} 0.5
interlock_queue_wait_seconds_bucket{class="interactive",upstream="up",le="0.01"} 5.0
interlock_queue_wait_seconds_bucket{class="interactive",upstream="up",le="0.1"} 5.0
interlock_queue_wait_seconds_bucket{class="interactive",upstream="up",le="+Inf"} 5.0
interlock_queue_wait_seconds_count{class="interactive",upstream="up"} 5.0
interlock_queue_wait_seconds_sum{class="interactive",upstream="up"} 0.0
"""


def test_buckets_are_read_per_label_set_and_summed_across_the_rest() -> None:
    family = "interlock_queue_wait_seconds"
    assert cumulative_buckets(TEXT, family, **{"class": "background"}) == {
        0.01: 2,
        0.1: 10,
        math.inf: 10,
        SUM: 0.5,
    }
    assert cumulative_buckets(TEXT, family, upstream="up") == {
        0.01: 7,
        0.1: 15,
        math.inf: 15,
        SUM: 0.5,
    }
    assert cumulative_buckets(TEXT, family, upstream="other") == {}


def test_a_quantile_is_the_bucket_its_rank_falls_in_beside_the_exact_mean() -> None:
    # 10 observations: 2 up to 10 ms, 8 between 10 and 100 ms, 0.5 s in all.
    buckets = {0.01: 2, 0.1: 10, math.inf: 10, SUM: 0.5}
    assert quantile(0.5, buckets) == Quantile(0.01, 0.1, 10, 0.05)
    assert quantile(0.2, buckets) == Quantile(0.0, 0.01, 10, 0.05)  # rank 2: the first bucket
    assert quantile(0.21, buckets) == Quantile(0.01, 0.1, 10, 0.05)
    found = quantile(0.99, {0.01: 2, 0.1: 3, math.inf: 10, SUM: 3.0})
    assert found == Quantile(0.1, math.inf, 10, 0.3)
    assert found.ms() == "in 100–∞ ms (mean 300.00 ms, 10 calls)"


def test_waits_that_were_all_zero_read_as_such_not_as_the_first_buckets_edge() -> None:
    found = quantile(0.99, {0.005: 111, 0.01: 111, math.inf: 111, SUM: 0.0})
    assert found is not None
    assert found.ms() == "in 0–5 ms (mean 0.00 ms, 111 calls)"


def test_a_window_counts_only_what_was_observed_between_the_scrapes() -> None:
    before = {0.01: 2, 0.1: 10, math.inf: 10, SUM: 0.5}
    after = {0.01: 2, 0.1: 30, math.inf: 31, SUM: 4.5}
    window = subtract(after, before)
    assert window == {0.01: 0, 0.1: 20, math.inf: 21, SUM: 4.0}
    assert quantile(0.5, window) == Quantile(0.01, 0.1, 21, 4.0 / 21)
    assert subtract({0.01: 3, math.inf: 3}, {}) == {0.01: 3, math.inf: 3}
    assert quantile(0.99, subtract(before, before)) is None
    assert quantile(0.99, {}) is None
