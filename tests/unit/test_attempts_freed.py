"""A failed call's attempts are freed as soon as the caller lets go of the error, without waiting
for the garbage collector (`proxy.runtime.retries.run_attempts`).

tenacity keeps each attempt's outcome in its retry state, and the error it re-raises carries a
traceback through the frame that holds that state: a reference cycle. Left in place, every frame
of a failed call (its request, an answer read up to its size limit) waited for the collector's
next run, which `serve` makes less frequent (`proxy.runtime.heap`)."""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator

import pytest
import tenacity

from policies.budget import RetryBudget
from policies.model import RetrySettings
from policies.retry import retrying
from proxy.errors import UpstreamNotReached
from proxy.runtime.retries import run_attempts
from proxy.runtime.upstream_pressure import describe_failure


class _Held:
    """Stands in for what an attempt's frame holds (a request, the part of an answer read)."""


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("attempts", [1, 3])
async def test_a_failed_calls_frames_are_freed_with_its_error(
    collector_off: None, attempts: int
) -> None:
    held: list[weakref.ref[_Held]] = []

    async def attempt() -> str:
        data = _Held()  # referenced only by this frame, and so by the error's traceback
        held.append(weakref.ref(data))
        raise UpstreamNotReached("refused")

    settings = RetrySettings(max_attempts=attempts, base_delay_s=0.0, max_delay_s=0.0)
    budget = RetryBudget(settings, clock=time.monotonic)

    def loop() -> tenacity.AsyncRetrying:
        return retrying(
            settings,
            side_effect=False,
            deadline=time.monotonic() + 60,
            clock=time.monotonic,
            describe=describe_failure,
            budget=budget,
            counted=True,
        )

    async def forward() -> str:  # a caller's frame: the error's traceback runs through it too
        call = _Held()
        held.append(weakref.ref(call))
        return await run_attempts(attempt, budget, loop)

    with pytest.raises(UpstreamNotReached):
        await forward()
    assert len(held) == 1 + attempts
    assert [ref() for ref in held] == [None] * (1 + attempts), "kept alive by a cycle"
