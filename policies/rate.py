"""Rate limits: how often calls may start, per scope (token buckets), as pure decisions.

Rate (frequency) is a mechanism of its own, next to admission (how many run at once) and budgets
(cost per window). A scope with `rate_per_s` refills that many tokens a second up to `burst`;
every call that touches it takes one. When a bucket is empty a call that may wait (its patience
covers the time to the next token) reserves its token now and is told how long to wait — work is
paced, not refused; a call that may not wait is refused with the exact time to the next token.

Memory stays bounded: a bucket that has refilled completely is the same as no bucket, so such
buckets are dropped on a periodic sweep (tenants and runs come and go).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RateBuckets", "RateDecision", "RateLimit"]

_SWEEP_EVERY = 1024


@dataclass(frozen=True, slots=True)
class RateLimit:
    """`rate_per_s` tokens a second, at most `burst` saved up (burst ≥ 1)."""

    rate_per_s: float
    burst: float

    @classmethod
    def of(cls, rate_per_s: float, burst: int | None) -> RateLimit:
        return cls(rate_per_s, float(burst) if burst else max(1.0, math.ceil(rate_per_s)))


@dataclass(frozen=True, slots=True)
class RateDecision:
    """Go now (`wait_s` 0), go after `wait_s` (token reserved), or refused at `scope`."""

    wait_s: float = 0.0
    refused_scope: str | None = None
    retry_after_s: float = 0.0

    @property
    def refused(self) -> bool:
        return self.refused_scope is not None


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated: float
    limit: RateLimit


class RateBuckets:
    """The token buckets of every rate-limited scope; the clock is passed in as `now`."""

    def __init__(self) -> None:
        self._buckets: dict[str, _Bucket] = {}
        self._calls = 0

    def __len__(self) -> int:
        return len(self._buckets)

    def reserve(
        self, limits: Sequence[tuple[str, RateLimit]], now: float, max_wait_s: float
    ) -> RateDecision:
        """Take one token from every scope in `limits`, all or none.

        A scope whose bucket is empty makes the call wait for its token if that wait fits in
        `max_wait_s` (the token is reserved: the bucket goes below zero), else refuses it.
        """
        if not limits:
            return RateDecision()
        self._calls += 1
        if self._calls % _SWEEP_EVERY == 0:
            self._sweep(now)
        levels = [(scope, limit, self._level(scope, limit, now)) for scope, limit in limits]
        wait_s, worst = 0.0, ""
        for scope, limit, tokens in levels:
            need = (1.0 - tokens) / limit.rate_per_s if tokens < 1.0 else 0.0
            if need > wait_s:
                wait_s, worst = need, scope
        if wait_s > max_wait_s:
            return RateDecision(refused_scope=worst, retry_after_s=wait_s)
        for scope, limit, tokens in levels:
            self._buckets[scope] = _Bucket(tokens - 1.0, now, limit)
        return RateDecision(wait_s=wait_s)

    def _level(self, scope: str, limit: RateLimit, now: float) -> float:
        bucket = self._buckets.get(scope)
        if bucket is None:
            return limit.burst
        return _refilled(bucket, limit, now)

    def _sweep(self, now: float) -> None:
        """Drop buckets that have refilled completely (a full bucket is no bucket)."""
        for scope, bucket in list(self._buckets.items()):
            if _refilled(bucket, bucket.limit, now) >= bucket.limit.burst:
                del self._buckets[scope]


def _refilled(bucket: _Bucket, limit: RateLimit, now: float) -> float:
    tokens = bucket.tokens + max(now - bucket.updated, 0.0) * limit.rate_per_s
    return min(tokens, limit.burst)
