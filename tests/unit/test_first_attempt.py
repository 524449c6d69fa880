"""`run_attempts`: the first attempt runs without a retry loop; a failure is replayed into one."""

from __future__ import annotations

import pytest
import tenacity

from policies.budget import RetryBudget
from policies.model import RetrySettings
from policies.retry import retrying
from proxy.errors import UpstreamNotReached, UpstreamTimeout
from proxy.runtime.retries import run_attempts
from proxy.runtime.upstream_pressure import describe_failure

SETTINGS = RetrySettings(max_attempts=3, base_delay_s=0.0, max_delay_s=0.0)


def _budget(ratio: float) -> RetryBudget:
    """A budget allowing `ratio` retries per request, no minimum, on a clock that stands still."""
    settings = RetrySettings(budget_ratio=ratio, budget_min_retries=0, budget_window_s=10.0)
    return RetryBudget(settings, clock=lambda: 0.0)


def _script(outcomes: list[BaseException | str]) -> tuple[list[int], object]:
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(len(calls) + 1)
        outcome = outcomes[len(calls) - 1]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return calls, attempt


def _loop_factory(budget: RetryBudget, built: list[int], *, side_effect: bool):
    async def no_sleep(_seconds: float) -> None:
        return None

    def loop() -> tenacity.AsyncRetrying:
        built.append(1)
        return retrying(
            SETTINGS,
            side_effect=side_effect,
            deadline=1e12,
            clock=lambda: 0.0,
            describe=describe_failure,
            budget=budget,
            sleep=no_sleep,
            counted=True,
        )

    return loop


async def test_a_first_success_builds_no_loop_and_counts_one_request() -> None:
    """A call answered at once never builds the tenacity loop and counts one budget request."""
    budget = _budget(1.0)
    calls, attempt = _script(["ok"])
    built: list[int] = []
    got = await run_attempts(attempt, budget, _loop_factory(budget, built, side_effect=False))
    assert (got, calls, built) == ("ok", [1], [])
    assert budget.available() == 1  # one request counted: one retry allowed


async def test_a_failed_first_attempt_is_retried_by_the_loop() -> None:
    """A retryable first failure is replayed into the loop, which runs the next attempts."""
    budget = _budget(3.0)
    calls, attempt = _script([UpstreamNotReached("down"), UpstreamTimeout("slow"), "ok"])
    built: list[int] = []
    got = await run_attempts(attempt, budget, _loop_factory(budget, built, side_effect=False))
    assert (got, calls, built) == ("ok", [1, 2, 3], [1])
    assert budget.available() == 1  # 3 × 1 request − 2 retries: the replay is not counted twice


async def test_a_failure_policy_does_not_retry_is_raised_after_one_attempt() -> None:
    """A side-effecting call that timed out is not retried: the first failure is re-raised."""
    budget = _budget(3.0)
    first = UpstreamTimeout("slow")
    calls, attempt = _script([first, "never"])
    built: list[int] = []
    with pytest.raises(UpstreamTimeout) as raised:
        await run_attempts(attempt, budget, _loop_factory(budget, built, side_effect=True))
    assert raised.value is first
    assert calls == [1]
