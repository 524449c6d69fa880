"""Rate limits in the scheduler: interactive calls over the rate are refused with the time to the
next token; background calls are paced (told `queued`) and then admitted."""

from __future__ import annotations

import time

import pytest

from policies.model import Limits
from proxy.runtime.scheduler import AdmissionRefused, Scheduler
from tests.integration.test_scheduler import WaitStates, bounded, call, make_config

RATED = Limits(max_running=10, max_pending=10, rate_per_s=5.0, burst=1)


async def test_interactive_call_over_the_rate_is_refused_with_time_to_next_token():
    """A second interactive call within 200 ms of the first is refused `rate_limited`."""
    scheduler = Scheduler(make_config(tenant=RATED))
    first = await bounded(scheduler.admit(call("interactive")))
    first.release()
    with pytest.raises(AdmissionRefused) as refused:
        await scheduler.admit(call("interactive"))
    refusal = refused.value.refusal
    assert refusal.reason == "rate_limited"
    assert refusal.scope == "tenant:acme"
    assert 0 < refusal.retry_after_s <= 0.2


async def test_background_calls_are_paced_not_refused():
    """Three background calls at once through a 5/s bucket start about 200 ms apart."""
    scheduler = Scheduler(make_config(tenant=RATED))
    waits = WaitStates()
    started = time.monotonic()
    slots = []
    for _ in range(3):
        slot = await bounded(scheduler.admit(call("background"), on_wait=waits))
        slots.append((time.monotonic() - started, slot.decision))
        slot.release()
    assert [decision for _, decision in slots] == [
        "admitted",
        "queued_then_admitted",
        "queued_then_admitted",
    ]
    assert slots[2][0] >= 0.35  # two tokens' worth of waiting: the pacing really happened
    assert waits.states == ["queued", "queued"]


async def test_other_tenants_have_their_own_bucket():
    """Rate is per scope: tenant b is not slowed by tenant a."""
    scheduler = Scheduler(make_config(tenant=RATED))
    (await bounded(scheduler.admit(call("interactive", tenant="a")))).release()
    (await bounded(scheduler.admit(call("interactive", tenant="b")))).release()


async def test_observe_mode_reports_would_reject_for_the_rate():
    """In observe mode a call over the rate runs, with `would_reject` saying why."""
    scheduler = Scheduler(make_config(tenant=RATED, mode="observe"))
    (await bounded(scheduler.admit(call("interactive")))).release()
    slot = await bounded(scheduler.admit(call("interactive")))
    assert slot.would_reject is not None
    assert slot.would_reject.reason == "rate_limited"
    slot.release()
