"""Retry budgets: retries as a bounded fraction of an upstream's recent requests (Envoy-style).

Retries multiply load exactly when an upstream is struggling. A budget caps them: within a sliding
window of `budget_window_s`, an upstream may see at most `max(budget_min_retries,
budget_ratio × requests)` retries (default 20 % of recent requests, at least 3), shared by all the
calls to it. Counts live in a bounded number of time buckets, so memory does not grow with traffic.
Token (cost) budgets are a different mechanism: see `policies.token_budget`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from policies.model import RetrySettings, UpstreamSpec

__all__ = ["RetryBudget", "RetryBudgets"]

_BUCKETS = 20


@dataclass(slots=True)
class _Bucket:
    index: int
    requests: int = 0
    retries: int = 0


class RetryBudget:
    """The retry allowance of one upstream over a sliding window; clock injected."""

    def __init__(self, settings: RetrySettings, *, clock: Callable[[], float]) -> None:
        self._ratio = max(settings.budget_ratio, 0.0)
        self._minimum = max(settings.budget_min_retries, 0)
        self._granularity_s = max(settings.budget_window_s, 1e-3) / _BUCKETS
        self._clock = clock
        self._buckets: deque[_Bucket] = deque()

    def record_request(self) -> None:
        """Count one new request (first attempts only; retries are counted by `try_spend`)."""
        self._bucket().requests += 1

    def try_spend(self) -> bool:
        """Take one retry from the budget if it has one left; False means "do not retry"."""
        if self.available() <= 0:
            return False
        self._bucket().retries += 1
        return True

    def available(self) -> int:
        """Retries the budget allows right now."""
        self._expire()
        requests = sum(bucket.requests for bucket in self._buckets)
        retries = sum(bucket.retries for bucket in self._buckets)
        allowed = max(self._minimum, math.floor(self._ratio * requests + 1e-9))
        return max(allowed - retries, 0)

    def _bucket(self) -> _Bucket:
        """The current bucket. Old buckets are dropped only when a new one starts (`available`
        drops them itself before it counts), so most calls read the clock once."""
        index = self._index()
        buckets = self._buckets
        if not buckets or buckets[-1].index != index:
            self._expire(index)
            buckets.append(_Bucket(index))
        return buckets[-1]

    def _index(self) -> int:
        return math.floor(self._clock() / self._granularity_s)

    def _expire(self, index: int | None = None) -> None:
        oldest = (self._index() if index is None else index) - _BUCKETS + 1
        while self._buckets and self._buckets[0].index < oldest:
            self._buckets.popleft()


class RetryBudgets:
    """One `RetryBudget` per configured upstream, created on first use."""

    def __init__(
        self, upstreams: Mapping[str, UpstreamSpec], *, clock: Callable[[], float]
    ) -> None:
        self._upstreams = upstreams
        self._clock = clock
        self._budgets: dict[str, RetryBudget] = {}

    def for_upstream(self, name: str) -> RetryBudget:
        """The budget of upstream `name` (unknown names get the default retry settings)."""
        budget = self._budgets.get(name)
        if budget is None:
            spec = self._upstreams.get(name)
            settings = spec.retry if spec is not None else RetrySettings()
            budget = self._budgets[name] = RetryBudget(settings, clock=self._clock)
        return budget
