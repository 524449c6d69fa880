"""The tenacity retry loop: positive predicate, attempts and deadline, server delays, budget."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from policies.budget import RetryBudget
from policies.model import RetrySettings
from policies.retry import AttemptFailure, retrying

SETTINGS = RetrySettings(max_attempts=4, base_delay_s=0.5, max_delay_s=8.0)


class FakeTime:
    """A monotonic clock that only moves when the retry loop sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Failed(Exception):
    """A test attempt failure that carries its own policy description."""

    def __init__(
        self, kind: str, status: int | None = None, headers: Mapping[str, str] | None = None
    ):
        super().__init__(kind)
        self.failure = AttemptFailure(kind, status, headers or {})  # type: ignore[arg-type]


def describe(error: BaseException) -> AttemptFailure | None:
    return error.failure if isinstance(error, Failed) else None


async def run(
    outcomes: list[BaseException | str],
    *,
    side_effect: bool = True,
    deadline_in: float = 60.0,
    budget: RetryBudget | None = None,
    jitter: float = 1.0,
) -> tuple[str | None, int, FakeTime, BaseException | None]:
    """Drive one retry loop over scripted outcomes; return result, attempts, time and error."""
    time = FakeTime()
    attempts = 0
    result: str | None = None
    error: BaseException | None = None
    loop = retrying(
        SETTINGS,
        side_effect=side_effect,
        deadline=time.now + deadline_in,
        clock=time,
        describe=describe,
        budget=budget,
        sleep=time.sleep,
        wall_clock=lambda: 0.0,
        random_unit=lambda: jitter,
    )
    try:
        async for attempt in loop:
            with attempt:
                outcome = outcomes[attempts]
                attempts += 1
                if isinstance(outcome, BaseException):
                    raise outcome
                result = outcome
    except BaseException as exc:
        error = exc
    return result, attempts, time, error


async def test_side_effect_is_retried_when_nothing_was_sent() -> None:
    """Connection refused twice, then success: three attempts with growing jittered waits."""
    result, attempts, time, error = await run([Failed("not_sent"), Failed("not_sent"), "ok"])
    assert (result, attempts, error) == ("ok", 3, None)
    assert time.sleeps == [0.5, 1.0]


async def test_side_effect_that_timed_out_is_never_retried() -> None:
    """A timeout after sending may have acted: the loop gives up after one attempt."""
    result, attempts, time, error = await run([Failed("timeout"), "ok"])
    assert (result, attempts, time.sleeps) == (None, 1, [])
    assert isinstance(error, Failed)


async def test_read_only_call_is_retried_after_a_timeout() -> None:
    """A read-only call is safe to repeat after a timeout."""
    result, attempts, _, error = await run([Failed("timeout"), "ok"], side_effect=False)
    assert (result, attempts, error) == ("ok", 2, None)


async def test_server_delay_is_honoured() -> None:
    """A 429 with Retry-After: 3 waits 3 s even when the jitter would wait less."""
    refused = Failed("answered", 429, {"Retry-After": "3"})
    result, _, time, _ = await run([refused, "ok"], jitter=0.0)
    assert result == "ok"
    assert time.sleeps == [3.0]


async def test_delay_past_the_deadline_gives_up_now() -> None:
    """Retry-After beyond the deadline ends the loop at once instead of sleeping."""
    refused = Failed("answered", 503, {"Retry-After": "120"})
    result, attempts, time, error = await run([refused, "ok"], deadline_in=10.0)
    assert (result, attempts, time.sleeps) == (None, 1, [])
    assert error is refused


async def test_stops_after_max_attempts_and_reraises_the_last_failure() -> None:
    """Four attempts at most; the caller sees the last upstream failure, not a RetryError."""
    failures = [Failed("answered", 429) for _ in range(5)]
    _, attempts, time, error = await run(list(failures))
    assert attempts == 4
    assert len(time.sleeps) == 3
    assert error is failures[3]


async def test_undescribed_errors_and_cancellation_are_not_retried() -> None:
    """The predicate is positive: a bug or a cancellation propagates after one attempt."""
    _, attempts, _, error = await run([ValueError("bug"), "ok"], side_effect=False)
    assert attempts == 1
    assert isinstance(error, ValueError)
    _, attempts, _, error = await run([asyncio.CancelledError(), "ok"], side_effect=False)
    assert attempts == 1
    assert isinstance(error, asyncio.CancelledError)


async def test_retry_budget_stops_retries_when_spent() -> None:
    """With a budget of 3 retries (no recent traffic), the fourth retry is refused."""
    time = FakeTime()
    budget = RetryBudget(RetrySettings(budget_ratio=0.2, budget_min_retries=3), clock=time)
    _, attempts, _, _ = await run([Failed("not_sent")] * 3 + ["ok"], budget=budget)
    assert attempts == 4
    assert budget.available() == 0
    _, attempts, _, error = await run([Failed("not_sent"), "ok"], budget=budget)
    assert attempts == 1
    assert isinstance(error, Failed)


@pytest.mark.parametrize("status", [400, 500])
async def test_side_effect_answered_error_is_not_retried(status: int) -> None:
    """A 500 to a side-effecting call may have acted; a 400 will not change: neither is retried."""
    _, attempts, _, _ = await run([Failed("answered", status), "ok"])
    assert attempts == 1
