"""Run a call's attempts, paying for the retry machinery only once an attempt has failed.

Most calls succeed at the first attempt: `run_attempts` counts the request in the upstream's
retry budget and runs that attempt directly. Only when it raises an upstream error is the
tenacity loop (`policies.retry.retrying`) built; the failure is replayed into it as its first
attempt, so the loop decides exactly as it would have had it run from the start.
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable
from typing import TypeVar

import tenacity

from policies.budget import RetryBudget
from proxy.errors import UpstreamError

__all__ = ["run_attempts"]

T = TypeVar("T")


async def run_attempts(
    attempt: Callable[[], Awaitable[T]],
    budget: RetryBudget,
    retry_loop: Callable[[], tenacity.AsyncRetrying],
) -> T:
    """Run `attempt` until it succeeds or `retry_loop()` (built with `counted=True`) stops.

    Raises:
        Whatever the last attempt raised, as the retry loop re-raises it.
    """
    budget.record_request()
    try:
        return await attempt()
    except UpstreamError as exc:  # only upstream errors may be retried (describe_failure)
        first: UpstreamError | None = exc
    state: tenacity.AttemptManager | None = None
    try:
        async for state in retry_loop():
            with state:
                if first is not None:
                    failure, first = first, None
                    try:
                        raise failure
                    finally:
                        del failure  # this frame stays in the error's traceback
                result = await attempt()
    except BaseException as error:
        # tenacity keeps the failed outcome (this very error) in its retry state and in the frames
        # that re-raised it, and the error's traceback runs through those frames: cycles that kept
        # every frame of the failed call (its request, what was read of an answer) until the
        # garbage collector's next run. The finished frames' locals are let go (the traceback
        # keeps its lines), and so is the outcome, so they are freed with the error.
        if state is not None:
            state.retry_state.outcome = None
        traceback.clear_frames(error.__traceback__)
        raise
    return result
