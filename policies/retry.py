"""Retry policy: when an upstream attempt may be repeated, and after how long.

Three pure parts and one factory:

- `server_delay_s` reads the delay an upstream asked for: `retry-after-ms`, `Retry-After`
  (delay-seconds or HTTP-date), OpenAI's `x-ratelimit-reset-requests`/`-tokens` durations
  ("6m0s", "1s", "120ms") and Anthropic's `anthropic-ratelimit-*-reset` RFC 3339 times.
- `not_executed_statuses`, `certainly_not_executed` and `may_retry`: a side-effecting call is
  retried only when the upstream certainly did not act on it: nothing was sent, or it answered a
  status that proves it: 429 from anyone, 503/529 only from a declared model provider (`kind`
  openai or anthropic), and the upstream's own `not_executed_statuses`. A 503 from any other
  upstream may come from a gateway whose backend already acted. A read-only call is retried on
  any transient failure. `x-should-retry: false` always wins.
- `backoff_s`: exponential backoff with full jitter, never shorter than what the server asked.
- `retrying(...)`: a `tenacity.AsyncRetrying` that stops on attempts *and* on the deadline (a
  delay that would end past the deadline gives up at once rather than sleeping), retries only what
  `may_retry` allows, spends the upstream's retry budget, and takes an injectable `sleep`.

The proxy describes its own exceptions with `AttemptFailure` (through the `describe` callable), so
this module stays free of transport types.
"""

from __future__ import annotations

import math
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Literal

import tenacity

from policies.budget import RetryBudget
from policies.model import RetrySettings, UpstreamSpec

__all__ = [
    "NOT_EXECUTED_STATUSES",
    "PROVIDER_NOT_EXECUTED_STATUSES",
    "TRANSIENT_STATUSES",
    "AttemptFailure",
    "FailureKind",
    "backoff_s",
    "certainly_not_executed",
    "may_retry",
    "not_executed_statuses",
    "parse_duration_s",
    "retrying",
    "server_delay_s",
    "should_retry_header",
]

FailureKind = Literal["not_sent", "answered", "lost", "timeout"]
"""not_sent: nothing left the proxy (connect refused, no process); answered: the upstream
replied with an error status; lost: sent, the answer never came whole; timeout: sent, then the
attempt timed out."""

# Statuses that prove an upstream refused *before* processing: rate limited, from anyone; and
# unavailable / overloaded from a model provider, which sends them itself (no gateway between).
NOT_EXECUTED_STATUSES = frozenset({429})
PROVIDER_NOT_EXECUTED_STATUSES = frozenset({503, 529})
# Statuses worth retrying for a call that is safe to repeat (read-only or inference).
TRANSIENT_STATUSES = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})

_OPENAI_RESETS = ("requests", "tokens")
_ANTHROPIC_RESETS = ("requests", "tokens", "input-tokens", "output-tokens")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(h|ms|m|s|us|µs|ns)")
_DURATION_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


@dataclass(frozen=True, slots=True)
class AttemptFailure:
    """How one upstream attempt failed, in the policy's words."""

    kind: FailureKind
    status: int | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


def parse_duration_s(text: str) -> float | None:
    """Parse a Go-style duration ("6m0s", "1s", "120ms", "1h2m3.5s") into seconds, else None."""
    value = text.strip()
    total, position = 0.0, 0
    for match in _DURATION_PART.finditer(value):
        if match.start() != position:
            return None
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        position = match.end()
    return total if value and position == len(value) else None


def server_delay_s(headers: Mapping[str, str], *, now: float) -> float | None:
    """The delay (seconds, ≥ 0) the upstream asked for before the next request, or None.

    `now` is the wall clock (Unix seconds) for the date forms. The most precise header wins:
    `retry-after-ms`, then `Retry-After`, then the providers' rate-limit reset headers (the
    longest reset among the limits reported exhausted, or among all when none says which).
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    if (delay := _float_or_none(lowered.get("retry-after-ms"))) is not None:
        return max(delay / 1000.0, 0.0)
    if (text := lowered.get("retry-after")) is not None:
        delay = _float_or_none(text)
        if delay is None:
            delay = _seconds_until(_http_date(text), now)
        if delay is not None:
            return max(delay, 0.0)
    return _provider_reset_s(lowered, now)


def should_retry_header(headers: Mapping[str, str]) -> bool | None:
    """The upstream's explicit `x-should-retry` verdict (true/false), or None when absent."""
    value = next((v for k, v in headers.items() if k.lower() == "x-should-retry"), None)
    if value is None:
        return None
    text = value.strip().lower()
    return True if text == "true" else False if text == "false" else None


def not_executed_statuses(spec: UpstreamSpec) -> frozenset[int]:
    """The statuses by which `spec` proves it did not execute a request (see module docstring)."""
    statuses = NOT_EXECUTED_STATUSES | spec.not_executed_statuses
    if spec.provider != "generic":
        statuses |= PROVIDER_NOT_EXECUTED_STATUSES
    return statuses


def certainly_not_executed(
    failure: AttemptFailure, not_executed: frozenset[int] = NOT_EXECUTED_STATUSES
) -> bool:
    """True when the upstream certainly did not act: nothing was sent, or it answered one of
    the `not_executed` statuses (the upstream's, from `not_executed_statuses`)."""
    if failure.kind == "not_sent":
        return True
    return failure.kind == "answered" and failure.status in not_executed


def may_retry(
    failure: AttemptFailure,
    *,
    side_effect: bool,
    not_executed: frozenset[int] = NOT_EXECUTED_STATUSES,
) -> bool:
    """Whether policy allows another attempt after `failure`.

    `x-should-retry: false` forbids it. A side-effecting call is retried only when it certainly
    did not execute (nothing sent, or a status in `not_executed`): a timeout, a lost connection
    or another 5xx may have acted, so it is never retried. A read-only call is retried on
    transient failures (not on a plain 4xx), or when the upstream says `x-should-retry: true`.
    """
    verdict = should_retry_header(failure.headers)
    if verdict is False:
        return False
    if certainly_not_executed(failure, not_executed):
        return True
    if side_effect:
        return False
    if verdict is True or failure.kind in ("lost", "timeout"):
        return True
    return failure.status in TRANSIENT_STATUSES


def backoff_s(
    attempt: int,
    settings: RetrySettings,
    *,
    server_delay: float | None = None,
    random_unit: Callable[[], float] = random.random,
) -> float:
    """Delay before attempt `attempt + 1`: full jitter up to min(max_delay, base·2^(attempt-1)).

    A server-given delay is a floor: the result is never shorter than what the upstream asked.
    """
    exponent = min(max(attempt - 1, 0), 64)
    ceiling = min(settings.max_delay_s, settings.base_delay_s * 2.0**exponent)
    jittered = random_unit() * ceiling
    return max(jittered, server_delay or 0.0)


def retrying(
    settings: RetrySettings,
    *,
    side_effect: bool,
    deadline: float,
    clock: Callable[[], float],
    describe: Callable[[BaseException], AttemptFailure | None],
    budget: RetryBudget | None = None,
    max_attempts: int | None = None,
    not_executed: frozenset[int] = NOT_EXECUTED_STATUSES,
    sleep: Callable[[float], Awaitable[None]] | None = None,
    wall_clock: Callable[[], float] = time.time,
    random_unit: Callable[[], float] = random.random,
    before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
    counted: bool = False,
) -> tenacity.AsyncRetrying:
    """A tenacity retry loop for one proxied call.

    Use as `async for attempt in retrying(...): with attempt: ...`. The loop retries an exception
    only if `describe` maps it to an `AttemptFailure` that `may_retry` accepts, given the
    upstream's `not_executed` statuses (a positive
    predicate: anything else, cancellation included, propagates at once). It stops after
    `max_attempts` (default `settings.max_attempts`), when the next delay would end at or past
    `deadline` (on `clock`), or when `budget` has no retry left; the last exception is re-raised.
    `sleep` defaults to tenacity's asyncio sleep; tests pass their own. `counted`: the caller
    already counted this request in `budget` (its first attempt ran before the loop was built).
    """
    limit = max_attempts if max_attempts is not None else settings.max_attempts

    def failure_of(state: tenacity.RetryCallState) -> AttemptFailure | None:
        outcome = state.outcome
        error = outcome.exception() if outcome is not None and outcome.failed else None
        return describe(error) if error is not None else None

    def retryable(state: tenacity.RetryCallState) -> bool:
        failure = failure_of(state)
        return failure is not None and may_retry(
            failure, side_effect=side_effect, not_executed=not_executed
        )

    def wait(state: tenacity.RetryCallState) -> float:
        failure = failure_of(state)
        asked = server_delay_s(failure.headers, now=wall_clock()) if failure else None
        return backoff_s(
            state.attempt_number, settings, server_delay=asked, random_unit=random_unit
        )

    def stop(state: tenacity.RetryCallState) -> bool:
        if state.attempt_number >= limit:
            return True
        if clock() + state.upcoming_sleep >= deadline:
            return True  # the wait would end past the deadline: give up now, do not sleep
        return budget is not None and not budget.try_spend()

    def count_request(state: tenacity.RetryCallState) -> None:
        if budget is not None and state.attempt_number == 1 and not counted:
            budget.record_request()

    options: dict[str, object] = {}
    if sleep is not None:
        options["sleep"] = sleep
    return tenacity.AsyncRetrying(
        stop=stop,
        wait=wait,
        retry=retryable,
        before=count_request,
        before_sleep=before_sleep,
        reraise=True,
        **options,  # type: ignore[arg-type]
    )


def _float_or_none(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _http_date(text: str) -> datetime | None:
    try:
        return parsedate_to_datetime(text.strip())
    except (TypeError, ValueError, IndexError):
        return None


def _rfc3339(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        return None


def _seconds_until(moment: datetime | None, now: float) -> float | None:
    if moment is None:
        return None
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return aware.timestamp() - now


def _provider_reset_s(lowered: Mapping[str, str], now: float) -> float | None:
    resets: list[tuple[float, bool]] = []  # (delay, reported exhausted)
    for limit in _OPENAI_RESETS:
        text = lowered.get(f"x-ratelimit-reset-{limit}")
        delay = parse_duration_s(text) if text is not None else None
        if delay is not None:
            exhausted = lowered.get(f"x-ratelimit-remaining-{limit}", "").strip() == "0"
            resets.append((delay, exhausted))
    for limit in _ANTHROPIC_RESETS:
        text = lowered.get(f"anthropic-ratelimit-{limit}-reset")
        delay = _seconds_until(_rfc3339(text), now) if text is not None else None
        if delay is not None:
            remaining = lowered.get(f"anthropic-ratelimit-{limit}-remaining", "")
            resets.append((delay, remaining.strip() == "0"))
    if not resets:
        return None
    spent = [delay for delay, exhausted in resets if exhausted]
    return max(max(spent or [delay for delay, _ in resets]), 0.0)
