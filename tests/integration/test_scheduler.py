"""The asyncio scheduler with real tasks: queueing, deadlines, cancellation, cooldowns, shutdown."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from policies.admission import AdmissionRequest
from policies.model import ClassBand, Config, Limits, UpstreamSpec, WorkClass
from proxy.runtime.scheduler import AdmissionRefused, Scheduler, Slot

BOUND_S = 5.0  # every wait in these tests ends within this
T = TypeVar("T")


def make_config(
    *,
    upstream: Limits | None = None,
    tenant: Limits | None = None,
    mode: str = "enforce",
    cap: float = 300.0,
) -> Config:
    classes = {
        "critical": ClassBand("critical", 0.10, 30.0),
        "interactive": ClassBand("interactive", 0.60, 0.0),
        "background": ClassBand("background", 0.25, 30.0),
        "bulk": ClassBand("bulk", 0.05, 300.0),
    }
    limits = upstream or Limits(max_running=1, max_pending=10)
    return Config(
        upstreams={
            "mail": UpstreamSpec("mail", "mcp_http", url="http://127.0.0.1:9", limits=limits)
        },
        classes=classes,  # type: ignore[arg-type]
        limits={"tenant": tenant or Limits()},
        mode=mode,  # type: ignore[arg-type]
        retry_after_cap_s=cap,
    )


def call(
    work_class: WorkClass = "background", deadline_in: float = 30.0, tenant: str = "acme"
) -> AdmissionRequest:
    return AdmissionRequest(tenant, work_class, "mail", deadline=time.monotonic() + deadline_in)


class WaitStates:
    """An `on_wait` callback that records the states and lets the test wait for one."""

    def __init__(self) -> None:
        self.states: list[str] = []
        self._events: dict[str, asyncio.Event] = {}

    async def __call__(self, state: str) -> None:
        self.states.append(state)
        self._event(state).set()

    def _event(self, state: str) -> asyncio.Event:
        return self._events.setdefault(state, asyncio.Event())

    async def reached(self, state: str) -> None:
        async with asyncio.timeout(BOUND_S):
            await self._event(state).wait()


async def bounded(awaitable: Awaitable[T]) -> T:
    async with asyncio.timeout(BOUND_S):
        return await awaitable


def queued(scheduler: Scheduler, scope: str = "upstream:mail") -> int:
    stats = scheduler.snapshot().scopes.get(scope)
    return stats.queued if stats else 0


def running(scheduler: Scheduler, scope: str = "upstream:mail") -> int:
    stats = scheduler.snapshot().scopes.get(scope)
    return stats.running if stats else 0


async def test_admit_and_release_count_running_calls() -> None:
    """An admitted call runs until released; releasing twice frees one slot only."""
    scheduler = Scheduler(make_config(upstream=Limits(max_running=3)))
    first = await scheduler.admit(call())
    async with await scheduler.admit(call()) as second:
        assert running(scheduler) == 2
        assert (second.decision, second.would_reject) == ("admitted", None)
    first.release()
    first.release()
    assert running(scheduler) == 0
    assert scheduler.snapshot().scopes == {}


async def test_queued_call_starts_when_a_slot_frees() -> None:
    """A background call queues (and says so), then starts when the running call releases."""
    scheduler = Scheduler(make_config())
    holder = await scheduler.admit(call())
    waits = WaitStates()
    task = asyncio.create_task(scheduler.admit(call(), on_wait=waits))
    await waits.reached("queued")
    snapshot = scheduler.snapshot().scopes["upstream:mail"]
    assert (snapshot.running, snapshot.queued) == (1, 1)
    assert snapshot.oldest_wait_s >= 0
    holder.release()
    slot = await bounded(task)
    assert slot.decision == "queued_then_admitted"
    assert slot.queue_wait_s > 0
    assert (running(scheduler), queued(scheduler)) == (1, 0)
    slot.release()


async def test_interactive_call_is_refused_at_once_when_full() -> None:
    """Interactive work fails fast with overloaded, the full scope and a positive retry_after."""
    scheduler = Scheduler(make_config())
    holder = await scheduler.admit(call())
    with pytest.raises(AdmissionRefused) as refused:
        await bounded(scheduler.admit(call("interactive")))
    assert (refused.value.refusal.reason, refused.value.refusal.scope) == (
        "overloaded",
        "upstream:mail",
    )
    assert refused.value.refusal.retry_after_s > 0
    holder.release()


async def test_queued_call_past_its_deadline_is_refused_and_removed() -> None:
    """A call whose deadline passes while queued gets a deadline refusal and leaves no trace."""
    scheduler = Scheduler(make_config())
    holder = await scheduler.admit(call())
    with pytest.raises(AdmissionRefused) as refused:
        await bounded(scheduler.admit(call(deadline_in=0.05)))
    assert (refused.value.refusal.reason, refused.value.refusal.scope) == (
        "deadline",
        "upstream:mail",
    )
    assert queued(scheduler) == 0
    holder.release()
    assert running(scheduler) == 0


async def test_cancelled_waiter_leaves_no_slot_or_queue_entry() -> None:
    """Cancelling a queued caller removes it; the next release does not hand it a slot."""
    scheduler = Scheduler(make_config())
    holder = await scheduler.admit(call())
    waits = WaitStates()
    task = asyncio.create_task(scheduler.admit(call(), on_wait=waits))
    await waits.reached("queued")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await bounded(task)
    assert queued(scheduler) == 0
    holder.release()
    assert running(scheduler) == 0


async def test_cancel_in_the_instant_of_the_grant_gives_the_slot_back() -> None:
    """A waiter granted a slot and cancelled before it resumed returns that slot."""
    scheduler = Scheduler(make_config())
    holder = await scheduler.admit(call())
    waits = WaitStates()
    task = asyncio.create_task(scheduler.admit(call(), on_wait=waits))
    await waits.reached("queued")
    holder.release()  # grants the waiter synchronously...
    assert running(scheduler) == 1
    task.cancel()  # ...which is cancelled before it ever runs again
    with pytest.raises(asyncio.CancelledError):
        await bounded(task)
    assert (running(scheduler), queued(scheduler)) == (0, 0)


async def test_failing_on_wait_callback_withdraws_the_waiter() -> None:
    """If telling the client it waits fails, the call leaves the queue and the error propagates."""
    scheduler = Scheduler(make_config())
    holder = await scheduler.admit(call())

    async def broken(state: str) -> None:
        raise ConnectionResetError(state)

    with pytest.raises(ConnectionResetError):
        await bounded(scheduler.admit(call(), on_wait=broken))
    assert queued(scheduler) == 0
    holder.release()


async def test_slots_never_exceed_max_running_under_concurrency() -> None:
    """Forty concurrent tasks through ten slots (one kept for critical): at most nine run."""
    scheduler = Scheduler(make_config(upstream=Limits(max_running=10, max_pending=100)))
    active = peak = 0

    async def worker(i: int) -> None:
        nonlocal active, peak
        async with await scheduler.admit(call(tenant=f"t{i % 5}")):
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0)  # yield so other tasks interleave
            active -= 1

    async with asyncio.timeout(BOUND_S):
        await asyncio.gather(*(worker(i) for i in range(40)))
    assert peak == 9  # ten slots, one reserved for critical
    assert scheduler.snapshot().scopes == {}


async def test_cooldown_holds_calls_until_it_ends() -> None:
    """During a cooldown a background call waits for the dependency, then starts when it ends."""
    scheduler = Scheduler(make_config(upstream=Limits(max_running=2)))
    scheduler.start_cooldown("mail", 20.0)
    assert 19.0 < scheduler.cooldown_remaining("mail") <= 20.0
    assert "mail" in scheduler.snapshot().cooldowns
    waits = WaitStates()
    task = asyncio.create_task(scheduler.admit(call(), on_wait=waits))
    await waits.reached("waiting_for_dependency")
    assert scheduler.snapshot().waiting_for_cooldown == 1
    assert queued(scheduler) == 1
    scheduler.end_cooldown("mail")
    slot = await bounded(task)
    assert slot.decision == "queued_then_admitted"
    assert scheduler.cooldown_remaining("mail") == 0.0
    assert waits.states == ["waiting_for_dependency"]
    slot.release()


async def test_cooldown_timer_ends_the_cooldown_by_itself() -> None:
    """A short cooldown ends on its own timer and releases the call that waited for it."""
    scheduler = Scheduler(make_config())
    scheduler.start_cooldown("mail", 0.05)
    slot = await bounded(scheduler.admit(call()))
    assert slot.queue_wait_s >= 0.04
    assert scheduler.snapshot().cooldowns == {}
    slot.release()


async def test_cooldown_refuses_calls_that_cannot_wait_it_out() -> None:
    """Interactive calls, and calls whose deadline comes first, are refused with the time left."""
    scheduler = Scheduler(make_config())
    scheduler.start_cooldown("mail", 10.0)
    for request in (call("interactive"), call("background", deadline_in=2.0)):
        with pytest.raises(AdmissionRefused) as refused:
            await bounded(scheduler.admit(request))
        refusal = refused.value.refusal
        assert (refusal.reason, refusal.scope) == ("cooldown", "upstream:mail")
        assert 9.0 < refusal.retry_after_s <= 10.0


async def test_cooldown_is_never_shortened_and_is_capped() -> None:
    """A later, shorter Retry-After keeps the longer cooldown; none lasts past the cap."""
    scheduler = Scheduler(make_config(cap=30.0))
    scheduler.start_cooldown("mail", 10.0)
    scheduler.start_cooldown("mail", 1.0)
    assert scheduler.cooldown_remaining("mail") > 9.0
    scheduler.start_cooldown("mail", 10_000.0)
    assert scheduler.cooldown_remaining("mail") <= 30.0
    scheduler.start_cooldown("other", 0.0)
    assert scheduler.cooldown_remaining("other") == 0.0
    scheduler.end_cooldown("mail")


async def test_queued_calls_wait_for_a_cooldown_that_starts_after_them() -> None:
    """A call already queued is not started while its upstream cools down, and is after."""
    scheduler = Scheduler(make_config())
    holder = await scheduler.admit(call())
    waits = WaitStates()
    task = asyncio.create_task(scheduler.admit(call(), on_wait=waits))
    await waits.reached("queued")
    scheduler.start_cooldown("mail", 20.0)
    holder.release()
    assert (running(scheduler), queued(scheduler)) == (0, 1)
    scheduler.end_cooldown("mail")
    slot = await bounded(task)
    slot.release()


async def test_stop_admitting_refuses_waiters_and_new_calls() -> None:
    """Shutdown refuses queued calls, calls waiting on a cooldown, and every new call."""
    scheduler = Scheduler(make_config(upstream=Limits(max_running=1)))
    holder = await scheduler.admit(call())
    queued_waits, cooling_waits = WaitStates(), WaitStates()
    in_queue = asyncio.create_task(scheduler.admit(call(), on_wait=queued_waits))
    await queued_waits.reached("queued")
    scheduler.start_cooldown("mail", 20.0)
    cooling = asyncio.create_task(scheduler.admit(call(), on_wait=cooling_waits))
    await cooling_waits.reached("waiting_for_dependency")
    scheduler.stop_admitting()
    for task in (in_queue, cooling):
        with pytest.raises(AdmissionRefused) as refused:
            await bounded(task)
        assert refused.value.refusal.reason == "shutting_down"
    with pytest.raises(AdmissionRefused):
        await bounded(scheduler.admit(call("critical")))
    assert scheduler.snapshot().stopping
    holder.release()
    scheduler.end_cooldown("mail")


async def test_observe_mode_never_refuses_but_reports_what_it_would_do() -> None:
    """In observe mode every call starts at once; would_reject tells what enforce would answer."""
    scheduler = Scheduler(make_config(mode="observe"))
    first = await bounded(scheduler.admit(call()))
    second = await bounded(scheduler.admit(call("interactive")))
    third = await bounded(scheduler.admit(call("background")))
    assert first.would_reject is None
    assert second.would_reject is not None
    assert second.would_reject.reason == "overloaded"
    assert third.would_reject is None  # enforce would have queued it, not refused it
    assert {s.decision for s in (first, second, third)} == {"admitted"}
    assert running(scheduler) == 3
    for slot in (first, second, third):
        slot.release()


async def test_pause_refuses_a_scope_until_resumed() -> None:
    """An operator pause refuses calls touching the scope with reason paused."""
    scheduler = Scheduler(make_config())
    scheduler.pause("tenant:acme")
    with pytest.raises(AdmissionRefused) as refused:
        await bounded(scheduler.admit(call()))
    assert (refused.value.refusal.reason, refused.value.refusal.scope) == ("paused", "tenant:acme")
    other: Slot = await bounded(scheduler.admit(call(tenant="other")))
    other.release()
    scheduler.resume("tenant:acme")
    (await bounded(scheduler.admit(call()))).release()


async def test_measured_service_time_drives_retry_after() -> None:
    """A scope whose calls took 8 s answers retry_after 8 s to the next call it cannot take."""
    now = [500.0]

    def clock() -> float:
        return now[0]

    scheduler = Scheduler(make_config(tenant=Limits(max_running=1)), clock=clock)
    request = AdmissionRequest("acme", "interactive", "mail", deadline=10_000.0)
    slot = await bounded(scheduler.admit(request))
    now[0] += 8.0
    slot.release()
    holder = await bounded(scheduler.admit(request))
    with pytest.raises(AdmissionRefused) as refused:
        await bounded(scheduler.admit(request))
    assert refused.value.refusal.scope == "tenant:acme"
    assert refused.value.refusal.retry_after_s == pytest.approx(8.0)
    holder.release()
