"""The admission runtime: the one scheduler shared by the MCP and HTTP proxies.

`Scheduler.admit` asks the pure engine (`policies.admission`) whether a call may enter, and acts
on the answer with asyncio: start now, wait in the run queue (a future resolved by `Slot.release`
of another call, or refused when its wait runs out), wait out an upstream's cooldown, or raise
`AdmissionRefused`. The numbers live in `policies.admission_book.AdmissionBook`; this module only
owns futures and timers. Everything runs on the event loop thread, so no locks are needed: each
state change and the dispatch that follows it happen without an `await` in between.

Cancelling a caller while it waits removes it cleanly; if it was granted a slot in the same
instant, that slot is given back. In `observe` mode nothing is refused or queued: every call
starts, and `Slot.would_reject` says what `enforce` mode would have answered.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from policies.admission import (
    AdmissionRequest,
    Admit,
    Queue,
    Refusal,
    Reject,
    WaitCooldown,
    Waiter,
    bounded_retry_after,
    patience_s,
)
from policies.admission_book import AdmissionBook, Running, ScopeStats
from policies.model import Config
from policies.rate import RateBuckets, RateDecision, RateLimit

__all__ = ["AdmissionRefused", "Scheduler", "SchedulerSnapshot", "ScopeStats", "Slot"]

OnWait = Callable[[str], Awaitable[None]]
SlotDecision = Literal["admitted", "queued_then_admitted"]


class AdmissionRefused(Exception):
    """The call may not start; `refusal` says why, where, and when to come back."""

    def __init__(self, refusal: Refusal) -> None:
        message = f"{refusal.reason} at {refusal.scope}: retry after {refusal.retry_after_s:g}s"
        super().__init__(message)
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class SchedulerSnapshot:
    """Live numbers: per scope running/queued/oldest wait; remaining cooldown per upstream."""

    scopes: Mapping[str, ScopeStats]
    cooldowns: Mapping[str, float]
    waiting_for_cooldown: int
    stopping: bool
    paused: frozenset[str] = frozenset()


class Slot:
    """Permission to run one call; give it back exactly once with `release` (idempotent)."""

    __slots__ = ("_released", "_running", "_scheduler", "decision", "queue_wait_s", "would_reject")

    def __init__(
        self,
        scheduler: Scheduler,
        running: Running,
        *,
        queue_wait_s: float,
        decision: SlotDecision,
        would_reject: Refusal | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._running = running
        self._released = False
        self.queue_wait_s = queue_wait_s
        self.decision: SlotDecision = decision
        self.would_reject = would_reject

    def release(self) -> None:
        """Free the slot; the call's duration feeds the retry_after estimates."""
        if not self._released:
            self._released = True
            self._scheduler._finish(self._running, sample=True)

    async def __aenter__(self) -> Slot:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


@dataclass(slots=True)
class _Pending:
    """A queued call's future and its expiry timer."""

    waiter: Waiter
    future: asyncio.Future[Running]
    timer: asyncio.TimerHandle | None


def _has_rate_limits(config: Config) -> bool:
    """Whether any scope a call can touch has a rate limit (`rate_per_s`)."""
    limits = [config.scope_limits(scope) for scope in ("global", "tenant", "run")]
    limits += [spec.limits for spec in config.upstreams.values()]
    limits += list(config.cost_classes.values())
    return any(limit.rate_per_s is not None for limit in limits)


class Scheduler:
    """Admission for every proxied call; `clock` is monotonic seconds (deadlines use it too)."""

    def __init__(self, config: Config, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._config = config
        self._clock = clock
        self._book = AdmissionBook(config)
        self._rates = RateBuckets()
        self._pending: dict[int, _Pending] = {}
        self._cooldown_ended: dict[str, asyncio.Event] = {}
        self._cooldown_timers: dict[str, asyncio.TimerHandle] = {}
        # Without any rate limit configured, pacing has nothing to do: skip it on every call.
        self._paced = _has_rate_limits(config)

    # -- admission -----------------------------------------------------------------------

    async def admit(self, req: AdmissionRequest, *, on_wait: OnWait | None = None) -> Slot:
        """Wait until `req` may start and return its slot.

        Calls `on_wait("queued")` when the call queues and `on_wait("waiting_for_dependency")`
        while it waits for its upstream's cooldown.

        Raises:
            AdmissionRefused: the call may not start (overloaded, paused, cooldown, deadline,
                shutting_down); never raised in observe mode.
        """
        now = arrived = self._clock()
        if self._config.mode == "observe":
            return self._observe(req, arrived)
        waited = await self._pace(req, arrived, on_wait) if self._paced else False
        told_cooldown = False
        while True:
            if waited:  # the first decision is taken as the call arrives
                now = self._clock()
            decision = self._book.decide(req, now)
            if isinstance(decision, Admit):
                running = self._book.start(req, decision.scopes, now)
                return self._slot(running, arrived, waited)
            if isinstance(decision, Reject):
                raise AdmissionRefused(decision.refusal)
            waited = True
            if isinstance(decision, WaitCooldown):
                notify = on_wait if not told_cooldown else None
                told_cooldown = True
                await self._wait_cooldown(req, decision, notify)
                continue
            running = await self._wait_in_queue(req, decision, on_wait)
            return self._slot(running, arrived, waited)

    def try_admit(self, req: AdmissionRequest) -> Slot | None:
        """A slot if `req` may start this instant, else None: it neither waits nor is refused
        (its caller defers it instead). In observe mode every call starts."""
        now = self._clock()
        if self._config.mode == "observe":
            return self._observe(req, now)
        if self._paced and self._rate(req, now, 0.0).refused_scope is not None:
            return None
        decision = self._book.decide(req, now)
        if not isinstance(decision, Admit):
            return None
        return self._slot(self._book.start(req, decision.scopes, now), now, False)

    def _rate(self, req: AdmissionRequest, now: float, max_wait_s: float) -> RateDecision:
        limits = [
            (scope.name, RateLimit.of(scope.limits.rate_per_s, scope.limits.burst))
            for scope in self._book.scopes(req)
            if scope.limits.rate_per_s is not None
        ]
        return self._rates.reserve(limits, now, max_wait_s)

    async def _pace(self, req: AdmissionRequest, now: float, on_wait: OnWait | None) -> bool:
        """Rate limits first: wait for the call's token if its patience allows, else refuse.

        Raises:
            AdmissionRefused: reason "rate_limited", retry_after_s = time to the next token.
        """
        patience = patience_s(self._config, req.work_class, self._book.scopes(req))
        decision = self._rate(req, now, min(patience, max(req.deadline - now, 0.0)))
        if decision.refused_scope is not None:
            retry_after = bounded_retry_after(self._config, decision.retry_after_s, floor=0.05)
            raise AdmissionRefused(Refusal("rate_limited", decision.refused_scope, retry_after))
        if decision.wait_s <= 0:
            return False
        if on_wait is not None:
            await on_wait("queued")
        await asyncio.sleep(decision.wait_s)  # the token is reserved; this is the pacing itself
        return True

    def _observe(self, req: AdmissionRequest, now: float) -> Slot:
        decision = self._book.decide(req, now)
        would_reject = decision.refusal if isinstance(decision, Reject) else None
        if self._paced:
            rate = self._rate(req, now, 0.0)
            if would_reject is None and rate.refused_scope is not None:
                would_reject = Refusal("rate_limited", rate.refused_scope, rate.retry_after_s)
        running = self._book.start(req, self._book.scopes(req), now)
        return Slot(self, running, queue_wait_s=0.0, decision="admitted", would_reject=would_reject)

    def _slot(self, running: Running, arrived: float, waited: bool) -> Slot:
        decision: SlotDecision = "queued_then_admitted" if waited else "admitted"
        wait = max(running.started_at - arrived, 0.0)
        return Slot(self, running, queue_wait_s=wait, decision=decision)

    async def _wait_in_queue(
        self, req: AdmissionRequest, decision: Queue, on_wait: OnWait | None
    ) -> Running:
        loop = asyncio.get_running_loop()
        waiter = self._book.enqueue(req, decision, self._clock())
        timer = None
        if math.isfinite(decision.deadline):
            delay = max(decision.deadline - self._clock(), 0.0)
            timer = loop.call_later(delay, self._expire, waiter.seq)
        pending = _Pending(waiter, loop.create_future(), timer)
        self._pending[waiter.seq] = pending
        granted = False
        try:
            if on_wait is not None:
                await on_wait("queued")
            # shield: a cancelled caller must not cancel the future a dispatch may resolve
            running = await asyncio.shield(pending.future)
            granted = True
            return running
        finally:
            if not granted:
                self._abandon(pending)

    def _abandon(self, pending: _Pending) -> None:
        """The waiting caller is gone (cancelled, refused, or `on_wait` failed): clean up."""
        self._forget(pending)
        if self._book.withdraw(pending.waiter):
            pending.future.cancel()
            return
        future = pending.future
        # The caller left in the same instant it was granted a slot: give the slot back. (Reading
        # `exception()` also marks a refusal as seen.)
        if future.done() and not future.cancelled() and future.exception() is None:
            self._finish(future.result(), sample=False)

    def _forget(self, pending: _Pending) -> None:
        self._pending.pop(pending.waiter.seq, None)
        if pending.timer is not None:
            pending.timer.cancel()

    def _expire(self, seq: int) -> None:
        pending = self._pending.get(seq)
        if pending is None or not self._book.withdraw(pending.waiter):
            return
        self._forget(pending)
        refusal = self._book.deadline_refusal(pending.waiter)
        pending.future.set_exception(AdmissionRefused(refusal))

    async def _wait_cooldown(
        self, req: AdmissionRequest, decision: WaitCooldown, on_wait: OnWait | None
    ) -> None:
        held = self._book.hold(req, decision.scopes, self._clock())
        try:
            if on_wait is not None:
                await on_wait("waiting_for_dependency")
            ended = self._cooldown_event(req.upstream)
            timeout = min(decision.until, req.deadline) - self._clock()
            try:
                async with asyncio.timeout(max(timeout, 0.0)):
                    await ended.wait()
            except TimeoutError:
                pass  # the next decision sees the deadline or the cooldown still running
        finally:
            self._book.unhold(held)

    # -- release and dispatch ------------------------------------------------------------

    def _finish(self, running: Running, *, sample: bool) -> None:
        self._book.finish(running, self._clock(), sample=sample)
        if self._book.waiting:  # most calls end with nobody queued: nothing to dispatch
            self._dispatch()

    def _dispatch(self) -> None:
        result = self._book.dispatch(self._clock())
        for waiter, running in result.started:
            pending = self._pending.pop(waiter.seq)
            if pending.timer is not None:
                pending.timer.cancel()
            pending.future.set_result(running)
        for waiter, refusal in result.expired:
            pending = self._pending.pop(waiter.seq)
            if pending.timer is not None:
                pending.timer.cancel()
            pending.future.set_exception(AdmissionRefused(refusal))

    # -- cooldowns -----------------------------------------------------------------------

    def start_cooldown(self, upstream: str, delay_s: float) -> None:
        """The upstream said 429/503 with a delay: hold its calls for `delay_s` (capped)."""
        if not delay_s > 0:
            return
        delay = min(delay_s, bounded_retry_after(self._config, delay_s))
        now = self._clock()
        end = self._book.start_cooldown(upstream, now + delay)
        self._cooldown_event(upstream)
        old = self._cooldown_timers.pop(upstream, None)
        if old is not None:
            old.cancel()
        loop = asyncio.get_running_loop()
        self._cooldown_timers[upstream] = loop.call_later(end - now, self.end_cooldown, upstream)

    def _cooldown_event(self, upstream: str) -> asyncio.Event:
        event = self._cooldown_ended.get(upstream)
        if event is None:
            event = self._cooldown_ended[upstream] = asyncio.Event()
        return event

    def end_cooldown(self, upstream: str) -> None:
        """End `upstream`'s cooldown now (its timer does this; operators may too)."""
        self._book.end_cooldown(upstream)
        timer = self._cooldown_timers.pop(upstream, None)
        if timer is not None:
            timer.cancel()
        ended = self._cooldown_ended.pop(upstream, None)
        if ended is not None:
            ended.set()
        self._dispatch()

    def cooldown_remaining(self, upstream: str) -> float:
        """Seconds until `upstream`'s cooldown ends (0 when it is not cooling down)."""
        end = self._book.cooldown_until(upstream)
        return max(end - self._clock(), 0.0) if end is not None else 0.0

    # -- operator controls ---------------------------------------------------------------

    def pause(self, scope: str) -> None:
        """Refuse new calls that touch `scope` (e.g. "tenant:acme") with reason "paused"."""
        self._book.pause(scope)

    def resume(self, scope: str) -> None:
        self._book.resume(scope)

    def paused_scopes(self) -> frozenset[str]:
        """The scopes an operator paused."""
        return self._book.paused_scopes()

    def stop_admitting(self) -> None:
        """Shutdown: refuse new calls and every queued one with reason "shutting_down"."""
        refusal = Refusal("shutting_down", "global", bounded_retry_after(self._config, 0.0))
        for waiter in self._book.stop():
            pending = self._pending.pop(waiter.seq)
            if pending.timer is not None:
                pending.timer.cancel()
            pending.future.set_exception(AdmissionRefused(refusal))
        for upstream in list(self._cooldown_ended):
            self._cooldown_ended.pop(upstream).set()

    def snapshot(self) -> SchedulerSnapshot:
        """Live numbers for metrics and the admin API."""
        now = self._clock()
        return SchedulerSnapshot(
            scopes=self._book.stats(now),
            cooldowns=self._book.cooldowns(now),
            waiting_for_cooldown=self._book.holds_count(),
            stopping=self._book.stopping,
            paused=self._book.paused_scopes(),
        )
