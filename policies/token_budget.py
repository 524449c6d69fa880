"""Per-tenant token budgets over a sliding window: pure accounting, clock injected.

A budget is a cost limit (tokens per tenant per window), separate from admission (current
capacity) and rate limits (frequency). Usage is only known when a model call finishes, so the
check happens at admission time against what was already spent: a tenant at or over its budget
is refused until enough of the window has passed for its spend to fall below the limit.

Spend is kept in a bounded number of buckets per tenant (`_BUCKETS` per window), so memory does
not grow with the request rate. A bucket expires with its *latest* entry, which makes
`retry_after_s` conservative: a caller told to come back then is never refused again for the
same spend.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from policies.model import BudgetSettings

__all__ = ["BudgetVerdict", "TokenBudget"]

_BUCKETS = 64
_MIN_RETRY_AFTER_S = 0.001
_EPSILON_S = 1e-6
_SWEEP_EVERY = 1024


@dataclass(frozen=True, slots=True)
class BudgetVerdict:
    """Whether a tenant may start a costly call now and, if not, when it may."""

    allowed: bool
    used: int
    limit: int | None
    retry_after_s: float = 0.0


@dataclass(slots=True)
class _Bucket:
    index: int
    last_at: float
    tokens: int


@dataclass(slots=True)
class _Spend:
    buckets: deque[_Bucket]
    total: int = 0


class TokenBudget:
    """Token spend per tenant in a sliding window of `settings.window_s` seconds."""

    def __init__(self, settings: BudgetSettings, *, clock: Callable[[], float]) -> None:
        self._limit = settings.tokens if settings.tokens and settings.tokens > 0 else None
        self._window_s = settings.window_s
        self._granularity_s = settings.window_s / _BUCKETS
        self._clock = clock
        self._spend: dict[str, _Spend] = {}
        self._records = 0

    @property
    def enabled(self) -> bool:
        """True when a token limit is configured."""
        return self._limit is not None

    def used(self, tenant: str) -> int:
        """Tokens the tenant spent inside the current window."""
        spend = self._current(tenant, self._clock())
        return spend.total if spend else 0

    def check(self, tenant: str) -> BudgetVerdict:
        """May `tenant` start a costly call now? Refused while its spend is at or over the limit."""
        if self._limit is None:
            return BudgetVerdict(allowed=True, used=0, limit=None)
        now = self._clock()
        spend = self._current(tenant, now)
        used = spend.total if spend else 0
        if spend is None or used < self._limit:
            return BudgetVerdict(allowed=True, used=used, limit=self._limit)
        return BudgetVerdict(
            allowed=False,
            used=used,
            limit=self._limit,
            retry_after_s=self._time_until_below_limit(spend, now),
        )

    def record(self, tenant: str, tokens: int) -> None:
        """Add `tokens` spent by `tenant` now (non-positive amounts are ignored)."""
        if self._limit is None or tokens <= 0:
            return
        now = self._clock()
        self._records += 1
        if self._records % _SWEEP_EVERY == 0:
            # Tenants that spent once and never came back would otherwise stay forever.
            for name in list(self._spend):
                self._current(name, now)
        spend = self._current(tenant, now) or self._spend.setdefault(tenant, _Spend(deque()))
        index = int(now // self._granularity_s)
        last = spend.buckets[-1] if spend.buckets else None
        if last is not None and last.index == index:
            last.tokens += tokens
            last.last_at = now
        else:
            spend.buckets.append(_Bucket(index=index, last_at=now, tokens=tokens))
        spend.total += tokens

    def _current(self, tenant: str, now: float) -> _Spend | None:
        """The tenant's spend with buckets older than the window dropped (None if nothing left)."""
        spend = self._spend.get(tenant)
        if spend is None:
            return None
        # the epsilon makes "come back after retry_after_s" pass despite float rounding
        horizon = now + _EPSILON_S
        while spend.buckets and spend.buckets[0].last_at + self._window_s <= horizon:
            spend.total -= spend.buckets.popleft().tokens
        if not spend.buckets:
            del self._spend[tenant]
            return None
        return spend

    def _time_until_below_limit(self, spend: _Spend, now: float) -> float:
        assert self._limit is not None
        remaining = spend.total
        for bucket in spend.buckets:
            remaining -= bucket.tokens
            if remaining < self._limit:
                return max(bucket.last_at + self._window_s - now, _MIN_RETRY_AFTER_S)
        return self._window_s  # unreachable: an empty window is below any positive limit
