"""The admission book: the counts that admission decisions read, kept in one place.

The asyncio runtime (`proxy.runtime.scheduler`) owns futures and timers; this book owns the
numbers — running and queued calls per scope, recent service times, cooldowns, pauses,
round-robin turns — and applies the engine's decisions to them. It does no I/O and reads no
clock (callers pass `now`), so property tests drive it directly, without an event loop.

Counts of a scope are dropped as soon as it is idle, and service times are kept for at most
`MAX_TIMED_SCOPES` scopes (least recently updated dropped first), so memory follows the live
work, not the number of tenants or runs ever seen. Per-band counts and service times are kept
only for scopes with a limit (`max_running`, or `max_pending` for service times): no decision
reads them for any other, and a call touches two or three unlimited scopes on its way.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

from policies.admission import (
    AdmissionRequest,
    AdmissionState,
    Decision,
    Queue,
    Refusal,
    Scope,
    ScopeCache,
    Waiter,
    deadline_refusal,
    decide_entry,
)
from policies.admission_fairness import Shape, shape_of
from policies.admission_search import TurnSearch
from policies.admission_turns import TurnIndex
from policies.model import Config, WorkClass

__all__ = [
    "MAX_TIMED_SCOPES",
    "SERVICE_TIME_WEIGHT",
    "AdmissionBook",
    "Dispatched",
    "Hold",
    "Running",
    "ScopeStats",
]

SERVICE_TIME_WEIGHT = 0.2  # weight of the newest sample in the per-scope service-time average
MAX_TIMED_SCOPES = 4096
_K = TypeVar("_K")


@dataclass(frozen=True, slots=True)
class Running:
    """A started call as the book counts it."""

    request: AdmissionRequest
    scopes: tuple[Scope, ...]
    started_at: float


@dataclass(frozen=True, slots=True)
class Hold:
    """A call waiting for its upstream's cooldown: counted as queued, not in the run queue."""

    seq: int
    request: AdmissionRequest
    scopes: tuple[Scope, ...]
    since: float


@dataclass(frozen=True, slots=True)
class Dispatched:
    """What one dispatch did: calls started (with their running record) and calls refused."""

    started: list[tuple[Waiter, Running]]
    expired: list[tuple[Waiter, Refusal]]


@dataclass(frozen=True, slots=True)
class ScopeStats:
    """Live numbers of one scope."""

    running: int
    queued: int
    oldest_wait_s: float


class AdmissionBook:
    """Running/queued counts, waiters, cooldowns and pauses of one scheduler."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._running: dict[str, int] = {}
        self._running_class: dict[tuple[str, WorkClass], int] = {}
        self._queued: dict[str, int] = {}
        self._service: dict[str, float] = {}
        self._cooldown_until: dict[str, float] = {}
        self._turns: dict[tuple[WorkClass, str], int] = {}
        self._band_waiting: dict[tuple[WorkClass, str], int] = {}
        self._waiters: dict[int, Waiter] = {}
        self._queues: dict[Shape, dict[int, Waiter]] = {}  # one FIFO per shape, for dispatch
        self._index = TurnIndex(self._turns, self._queues)  # by band, group and turn
        self._holds: dict[int, Hold] = {}
        self._paused: set[str] = set()
        self._stopping = False
        self._seq = itertools.count(1)
        self._turn = itertools.count(1)
        self.scopes = ScopeCache(config)
        """Every scope a call touches (`policies.admission.scopes_for`), built once per shape."""
        self._state = self._view()

    # -- reading -------------------------------------------------------------------------

    def state(self) -> AdmissionState:
        """A read-only view of the current counts for the engine's pure functions (it reads the
        book's live tables, so one view serves until `stop` changes what it copies)."""
        return self._state

    def _view(self) -> AdmissionState:
        return AdmissionState(
            running=self._running,
            running_by_class=self._running_class,
            queued=self._queued,
            service_time_s=self._service,
            cooldown_until=self._cooldown_until,
            turns=self._turns,
            paused=self._paused,
            stopping=self._stopping,
        )

    def decide(self, request: AdmissionRequest, now: float) -> Decision:
        """May this new call enter? (see `policies.admission.decide_entry`)."""
        return decide_entry(self.config, self._state, request, now, scopes=self.scopes(request))

    def deadline_refusal(self, waiter: Waiter) -> Refusal:
        """The refusal for a queued call whose wait ran out."""
        return deadline_refusal(self.config, self.state(), waiter)

    @property
    def stopping(self) -> bool:
        return self._stopping

    def waiters(self) -> Iterator[Waiter]:
        """Queued calls in arrival order."""
        return iter(self._waiters.values())

    def is_waiting(self, waiter: Waiter) -> bool:
        return waiter.seq in self._waiters

    def holds_count(self) -> int:
        """Calls waiting for an upstream's cooldown."""
        return len(self._holds)

    def running_count(self, scope: str) -> int:
        return self._running.get(scope, 0)

    def cooldown_until(self, upstream: str) -> float | None:
        return self._cooldown_until.get(upstream)

    def stats(self, now: float) -> dict[str, ScopeStats]:
        """Running, queued and oldest wait of every live scope."""
        oldest: dict[str, float] = {}
        waits = [(w.scopes, w.queued_at) for w in self._waiters.values()]
        waits += [(h.scopes, h.since) for h in self._holds.values()]
        for scopes, since in waits:
            for scope in scopes:
                oldest[scope.name] = min(oldest.get(scope.name, since), since)
        names = sorted(set(self._running) | set(self._queued))
        return {
            name: ScopeStats(
                running=self._running.get(name, 0),
                queued=self._queued.get(name, 0),
                oldest_wait_s=max(now - oldest[name], 0.0) if name in oldest else 0.0,
            )
            for name in names
        }

    # -- running calls -------------------------------------------------------------------

    def start(self, request: AdmissionRequest, scopes: tuple[Scope, ...], now: float) -> Running:
        """Count a call as running in all its scopes (and, in each scope with a running limit,
        in its band: only those scopes' band counts are ever read)."""
        band = request.work_class
        running, by_class = self._running, self._running_class
        for scope in scopes:  # counts never go below 0, so one more is never 0: no pop needed
            name = scope.name
            running[name] = running.get(name, 0) + 1
            if scope.limits.max_running is not None:
                key = (name, band)
                by_class[key] = by_class.get(key, 0) + 1
        return Running(request, scopes, now)

    def finish(self, running: Running, now: float, *, sample: bool = True) -> None:
        """Stop counting a call; with `sample`, its duration feeds the service times of its
        limited scopes (an estimated wait is only ever asked of a scope with a limit)."""
        band = running.request.work_class
        duration = max(now - running.started_at, 0.0)
        counts, by_class, service = self._running, self._running_class, self._service
        # Runs once per call: the counts are stepped down here, not through `_bump`.
        for scope in running.scopes:
            name = scope.name
            left = counts.get(name, 0) - 1
            if left:
                counts[name] = left
            else:
                counts.pop(name, None)
            limits = scope.limits
            if limits.max_running is not None:
                key = (name, band)
                left = by_class.get(key, 0) - 1
                if left:
                    by_class[key] = left
                else:
                    by_class.pop(key, None)
            elif limits.max_pending is None:  # unlimited: no estimate ever reads its time
                continue
            if sample:  # re-inserted last: the most recently updated scope
                previous = service.pop(name, None)
                service[name] = (
                    duration
                    if previous is None
                    else previous + SERVICE_TIME_WEIGHT * (duration - previous)
                )
        while len(service) > MAX_TIMED_SCOPES:
            del service[next(iter(service))]
        self._index.unpark(running.request.tenant)  # its own scope has room again

    # -- waiting calls -------------------------------------------------------------------

    def enqueue(self, request: AdmissionRequest, decision: Queue, now: float) -> Waiter:
        """Put a call in the run queue as `decide` told it to."""
        waiter = Waiter(
            next(self._seq), request, decision.scopes, now, decision.deadline, decision.lift_at
        )
        self._waiters[waiter.seq] = waiter
        key = (request.work_class, request.tenant)
        if key not in self._turns:
            self._turns[key] = next(self._turn)
        _bump(self._band_waiting, key, 1)
        shape = shape_of(waiter)
        queue = self._queues.get(shape)
        if queue is None:
            self._queues[shape] = {waiter.seq: waiter}
            self._index.add(shape, waiter.scopes)
        else:
            queue[waiter.seq] = waiter
        self._count_queued(decision.scopes, 1)
        return waiter

    def withdraw(self, waiter: Waiter) -> bool:
        """Take a call out of the run queue (cancelled or expired); False if it was not there."""
        if not self._unqueue(waiter):
            return False
        self._leave_band(waiter, served=False)
        return True

    @property
    def waiting(self) -> bool:
        """Whether any call is queued (there is something for `dispatch` to look at)."""
        return bool(self._waiters)

    def dispatch(self, now: float) -> Dispatched:
        """Start every queued call that may start now (refusing expired queue heads met on the
        way): the engine's choice (`policies.admission_fairness.select_from_queues`), found
        through the turn index (`policies.admission_search`) without reading every queue."""
        if not self._waiters:
            return Dispatched([], [])
        search = TurnSearch(self.config, self._index, self._queues, self._cooldown_until, now)
        started: list[tuple[Waiter, Running]] = []
        try:
            while (pick := search.next_start(self.state())) is not None:
                self._unqueue(pick)
                self._leave_band(pick, served=True)
                started.append((pick, self.start(pick.request, pick.scopes, now)))
        finally:
            self._index.restore(search.set_aside)
        refusals = [(w, self.deadline_refusal(w)) for w in search.late.values()]
        return Dispatched(started, [(w, r) for w, r in refusals if self.withdraw(w)])

    def expire(self, now: float) -> list[tuple[Waiter, Refusal]]:
        """Refuse every queued call whose wait ran out (a full scan; the runtime uses timers)."""
        late = [w for w in self._waiters.values() if w.deadline <= now]
        refusals = [(w, self.deadline_refusal(w)) for w in late]
        for waiter in late:
            self.withdraw(waiter)
        return refusals

    def hold(self, request: AdmissionRequest, scopes: tuple[Scope, ...], now: float) -> Hold:
        """Count a call that waits for a cooldown as queued in its scopes."""
        held = Hold(next(self._seq), request, scopes, now)
        self._holds[held.seq] = held
        self._count_queued(scopes, 1)
        return held

    def unhold(self, held: Hold) -> None:
        """The cooldown wait is over (idempotent)."""
        if self._holds.pop(held.seq, None) is not None:
            self._count_queued(held.scopes, -1)

    # -- upstream and operator controls --------------------------------------------------

    def start_cooldown(self, upstream: str, until: float) -> float:
        """Cool `upstream` down until `until` (an earlier end never shortens it); the end."""
        end = max(until, self._cooldown_until.get(upstream, until))
        self._cooldown_until[upstream] = end
        return end

    def end_cooldown(self, upstream: str) -> None:
        self._cooldown_until.pop(upstream, None)

    def expire_cooldowns(self, now: float) -> None:
        """Forget cooldowns that have ended."""
        for upstream in [u for u, end in self._cooldown_until.items() if end <= now]:
            del self._cooldown_until[upstream]

    def cooldowns(self, now: float) -> dict[str, float]:
        """Remaining cooldown per upstream, for those still cooling."""
        return {u: end - now for u, end in self._cooldown_until.items() if end > now}

    def paused_scopes(self) -> frozenset[str]:
        """The scopes an operator paused."""
        return frozenset(self._paused)

    def pause(self, scope: str) -> None:
        """Refuse new calls touching `scope` (reason "paused") until `resume`."""
        self._paused.add(scope)

    def resume(self, scope: str) -> None:
        self._paused.discard(scope)

    def stop(self) -> list[Waiter]:
        """Refuse every new call from now on; returns (and removes) the queued calls."""
        self._stopping = True
        self._state = self._view()
        queued = list(self._waiters.values())
        for waiter in queued:
            self.withdraw(waiter)
        return queued

    # -- internals -----------------------------------------------------------------------

    def _unqueue(self, waiter: Waiter) -> bool:
        if self._waiters.pop(waiter.seq, None) is None:
            return False
        shape = shape_of(waiter)
        queue = self._queues[shape]
        was_head = next(iter(queue)) == waiter.seq
        del queue[waiter.seq]
        if not queue:
            del self._queues[shape]
            self._index.remove(shape)
        elif was_head:
            self._index.new_head(shape)
        self._count_queued(waiter.scopes, -1)
        return True

    def _count_queued(self, scopes: tuple[Scope, ...], delta: int) -> None:
        for scope in scopes:
            _bump(self._queued, scope.name, delta)

    def _leave_band(self, waiter: Waiter, *, served: bool) -> None:
        key = (waiter.request.work_class, waiter.request.tenant)
        _bump(self._band_waiting, key, -1)
        if key not in self._band_waiting:
            self._turns.pop(key, None)
        elif served:
            self._turns[key] = next(self._turn)
            self._index.new_turn(*key)


def _bump(table: dict[_K, int], key: _K, delta: int) -> None:
    value = table.get(key, 0) + delta
    if value:
        table[key] = value
    else:
        table.pop(key, None)
