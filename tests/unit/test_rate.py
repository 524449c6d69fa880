"""Rate limits as token buckets: pacing within patience, refusal beyond it, bounded memory."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.rate import RateBuckets, RateLimit

TWO_PER_S = RateLimit.of(2.0, 2)


def test_burst_then_refusal_with_the_time_to_the_next_token():
    """Two calls go at once (burst 2); the third, unable to wait, is told when a token frees."""
    buckets = RateBuckets()
    assert buckets.reserve([("tenant:a", TWO_PER_S)], 0.0, 0.0).wait_s == 0
    assert buckets.reserve([("tenant:a", TWO_PER_S)], 0.0, 0.0).wait_s == 0
    third = buckets.reserve([("tenant:a", TWO_PER_S)], 0.0, 0.0)
    assert third.refused
    assert third.refused_scope == "tenant:a"
    assert third.retry_after_s == pytest.approx(0.5)


def test_a_call_that_may_wait_is_paced_not_refused():
    """With patience, the call reserves the next token and is told to wait for it."""
    buckets = RateBuckets()
    for _ in range(2):
        buckets.reserve([("s", TWO_PER_S)], 0.0, 10.0)
    paced = buckets.reserve([("s", TWO_PER_S)], 0.0, 10.0)
    assert not paced.refused
    assert paced.wait_s == pytest.approx(0.5)
    later = buckets.reserve([("s", TWO_PER_S)], 0.0, 10.0)
    assert later.wait_s == pytest.approx(1.0)  # reservations queue up behind each other


def test_refusal_takes_no_token_from_any_scope():
    """All or none: a call refused by one scope leaves every other scope's bucket as it was."""
    buckets = RateBuckets()
    tight = RateLimit.of(1.0, 1)
    buckets.reserve([("tenant:a", tight)], 0.0, 0.0)
    refused = buckets.reserve([("global", TWO_PER_S), ("tenant:a", tight)], 0.0, 0.0)
    assert refused.refused_scope == "tenant:a"
    assert buckets.reserve([("global", TWO_PER_S)], 0.0, 0.0).wait_s == 0
    assert buckets.reserve([("global", TWO_PER_S)], 0.0, 0.0).wait_s == 0


def test_full_buckets_are_forgotten():
    """Buckets refilled to the brim are dropped by the periodic sweep (memory stays bounded)."""
    buckets = RateBuckets()
    limit = RateLimit.of(100.0, 1)
    for i in range(1023):
        buckets.reserve([(f"run:{i}", limit)], 0.0, 0.0)
    assert len(buckets) == 1023
    buckets.reserve([("run:last", limit)], 60.0, 0.0)  # the 1024th call sweeps
    assert len(buckets) == 1


@settings(max_examples=200, deadline=None)
@given(
    rate=st.floats(min_value=0.5, max_value=50.0),
    burst=st.integers(min_value=1, max_value=20),
    gaps=st.lists(st.floats(min_value=0.0, max_value=0.5), min_size=1, max_size=200),
)
def test_never_more_than_burst_plus_rate_times_elapsed(rate: float, burst: int, gaps: list[float]):
    """Over any run of arrivals, calls let through without waiting never exceed
    burst + rate × elapsed: the bucket's promise."""
    buckets = RateBuckets()
    limit = RateLimit.of(rate, burst)
    now, granted = 0.0, 0
    for gap in gaps:
        now += gap
        if not buckets.reserve([("s", limit)], now, 0.0).refused:
            granted += 1
        assert granted <= burst + rate * now + 1e-9
