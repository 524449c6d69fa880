"""Admission: may this new call enter now, wait, or be refused — as pure decisions.

A call touches several *scopes*, each with its limits: `global`, `tenant:<t>`, `run:<r>` (with a
run id), `upstream:<u>`, `cost_class:<c>` (when set and configured) and `class:<band>` (counted,
never limited). It may start only when every scope has room. Work classes are priority bands:
in a scope limited to N running calls, `critical` keeps a reserve of floor(share × N) slots (never
all N) that no other band may take; other bands share the rest, work-conserving. A small scope
(10 % of N < 1) keeps no reserve, so `max_running: 2` really admits two calls; critical calls
still start first whenever a slot frees there. Which waiting call starts next is
`policies.admission_fairness`.

A band's patience is min(band max_wait_s, max_wait_s of every scope the call touches that sets
one). With patience 0 (interactive, by default) a call that does not fit is refused at once.
While its upstream cools down, a call that may queue waits the cooldown out if it ends before the
call's deadline (the upstream said when to come back, so patience does not cut this wait short);
otherwise it is refused with reason `cooldown`. Calls waiting out a cooldown count as queued.

`retry_after_s` is never a guess from nowhere: for a full scope it is (calls queued there + 1) ×
recent mean service time / max_running; for a cooldown it is the remaining cooldown. It is
clamped to [`RETRY_AFTER_FLOOR_S`, `config.retry_after_cap_s`] (the floor is 1 s because HTTP
`Retry-After` counts whole seconds, and an answer of "0" invites a hot retry loop); a remaining
cooldown is reported exactly (it is known), bounded by the cap, and never zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from typing import Literal

from policies.model import WORK_CLASSES, ClassBand, Config, Limits, WorkClass

__all__ = [
    "AGEING_FRACTION",
    "DEFAULT_BANDS",
    "DEFAULT_SERVICE_TIME_S",
    "PAUSED_RETRY_AFTER_S",
    "RETRY_AFTER_FLOOR_S",
    "AdmissionRequest",
    "AdmissionState",
    "Admit",
    "Decision",
    "Load",
    "Queue",
    "Refusal",
    "RefusalReason",
    "Reject",
    "Scope",
    "ScopeCache",
    "WaitCooldown",
    "Waiter",
    "band_of",
    "blocking_scope",
    "bounded_retry_after",
    "critical_reserve",
    "deadline_refusal",
    "decide_entry",
    "has_room",
    "live_reserve",
    "patience_s",
    "scopes_for",
    "tenant_scope",
]

RefusalReason = Literal[
    "overloaded", "paused", "cooldown", "budget", "deadline", "shutting_down", "rate_limited"
]

RETRY_AFTER_FLOOR_S = 1.0
DEFAULT_SERVICE_TIME_S = 1.0  # assumed until a scope has finished calls to measure
PAUSED_RETRY_AFTER_S = 30.0  # a pause has no known end; ask callers to check back in a while
AGEING_FRACTION = 0.5  # a waiter is lifted once it has used this much of its patience
_DEFAULT_CAP_S = 300.0
_MIN_COOLDOWN_RETRY_S = 0.001
# ceil() of a product like 0.1 × 30 must not round 3.0000000000000004 up to 4
_SHARE_EPSILON = 1e-9

DEFAULT_BANDS: Mapping[WorkClass, ClassBand] = {
    "critical": ClassBand("critical", 0.10, 30.0),
    "interactive": ClassBand("interactive", 0.60, 0.0),
    "background": ClassBand("background", 0.25, 30.0),
    "bulk": ClassBand("bulk", 0.05, 300.0, defer=True),
}


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """One call asking to start; `deadline` is absolute on the scheduler's monotonic clock."""

    tenant: str
    work_class: WorkClass
    upstream: str
    run_id: str | None = None
    cost_class: str | None = None
    tool: str | None = None
    side_effect: bool = True
    deadline: float = math.inf
    arrived_at: float = 0.0
    deferred: bool = False
    """Deferred work (accepted earlier, run now by the dispatcher): it never takes the share of a
    band that cannot wait (see `live_reserve`)."""
    waiting_since: float | None = None
    """When deferred work began to wait (it was accepted), on the same clock: its ageing counts
    from then, not from when the dispatcher brought it to the scheduler."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a call may not start, where it was refused, and when to come back (> 0 s)."""

    reason: RefusalReason
    scope: str
    retry_after_s: float


@dataclass(frozen=True, slots=True)
class Scope:
    """One place where work accumulates, with its limits."""

    name: str
    limits: Limits
    reserve: int = field(compare=False)
    """Slots only critical calls may take (`critical_reserve` of `limits.max_running`): fixed by
    the configuration, so worked out once where the scope is built, not on every decision."""


@dataclass(frozen=True, slots=True)
class Admit:
    """Start now."""

    scopes: tuple[Scope, ...]


@dataclass(frozen=True, slots=True)
class Queue:
    """Wait for room until `deadline`; from `lift_at` on, ageing lifts the call."""

    deadline: float
    lift_at: float
    scopes: tuple[Scope, ...]


@dataclass(frozen=True, slots=True)
class WaitCooldown:
    """The upstream is cooling down until `until`; wait, then ask again."""

    until: float
    scopes: tuple[Scope, ...]


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse now."""

    refusal: Refusal


Decision = Admit | Queue | WaitCooldown | Reject


@dataclass(frozen=True, slots=True)
class Waiter:
    """A queued call: `seq` orders arrivals, `deadline` ends its wait, `lift_at` starts ageing."""

    seq: int
    request: AdmissionRequest
    scopes: tuple[Scope, ...]
    queued_at: float
    deadline: float
    lift_at: float


@dataclass(frozen=True, slots=True)
class AdmissionState:
    """What the decisions read. The runtime passes read-only views of its own tables.

    `running_by_class` is keyed by (scope, band), and only read for scopes with a running limit
    (the book counts no others); `turns` by (band, tenant): the lower, the sooner
    that tenant's turn in its band (round-robin). `cooldown_until` is per upstream name.
    """

    running: Mapping[str, int] = field(default_factory=dict)
    running_by_class: Mapping[tuple[str, WorkClass], int] = field(default_factory=dict)
    queued: Mapping[str, int] = field(default_factory=dict)
    service_time_s: Mapping[str, float] = field(default_factory=dict)
    cooldown_until: Mapping[str, float] = field(default_factory=dict)
    turns: Mapping[tuple[WorkClass, str], int] = field(default_factory=dict)
    paused: Set[str] = frozenset()
    stopping: bool = False


class Load:
    """Running counts as one decision sees them: the state plus calls it already started."""

    __slots__ = ("_added", "_added_class", "_state")

    def __init__(self, state: AdmissionState) -> None:
        self._state = state
        self._added: dict[str, int] = {}
        self._added_class: dict[tuple[str, WorkClass], int] = {}

    def running(self, scope: str) -> int:
        return self._state.running.get(scope, 0) + self._added.get(scope, 0)

    def running_class(self, scope: str, band: WorkClass) -> int:
        key = (scope, band)
        return self._state.running_by_class.get(key, 0) + self._added_class.get(key, 0)

    def add(self, scopes: tuple[Scope, ...], band: WorkClass) -> None:
        for scope in scopes:
            self._added[scope.name] = self._added.get(scope.name, 0) + 1
            key = (scope.name, band)
            self._added_class[key] = self._added_class.get(key, 0) + 1


def band_of(config: Config, work_class: WorkClass) -> ClassBand:
    """The configured band of a work class, else the DESIGN.md default."""
    return config.classes.get(work_class) or DEFAULT_BANDS[work_class]


def _scope(config: Config, name: str, limits: Limits) -> Scope:
    limit = limits.max_running
    return Scope(name, limits, 0 if limit is None else critical_reserve(config, limit))


def tenant_scope(config: Config, tenant: str) -> Scope:
    """The tenant's own scope, as every call of the tenant touches it."""
    return _scope(config, f"tenant:{tenant}", config.scope_limits("tenant"))


def scopes_for(config: Config, request: AdmissionRequest) -> tuple[Scope, ...]:
    """Every scope a call touches, broadest first."""
    scopes = [
        _scope(config, "global", config.scope_limits("global")),
        tenant_scope(config, request.tenant),
    ]
    if request.run_id is not None:
        scopes.append(_scope(config, f"run:{request.run_id}", config.scope_limits("run")))
    spec = config.upstreams.get(request.upstream)
    upstream_limits = spec.limits if spec else Limits()
    scopes.append(_scope(config, f"upstream:{request.upstream}", upstream_limits))
    if request.cost_class is not None and request.cost_class in config.cost_classes:
        cost = config.cost_classes[request.cost_class]
        scopes.append(_scope(config, f"cost_class:{request.cost_class}", cost))
    scopes.append(_scope(config, f"class:{request.work_class}", Limits()))
    return tuple(scopes)


_MAX_SHAPES = 4096


class ScopeCache:
    """`scopes_for`, built once per call shape (tenant, run, upstream, cost class and band) and
    reused: a call's scopes are the same for every call of its shape under one configuration.

    At most `max_shapes` are kept; past that the cache starts over (tenants and run ids come from
    callers, so their number has no bound of its own).
    """

    __slots__ = ("_config", "_known", "_max")

    def __init__(self, config: Config, *, max_shapes: int = _MAX_SHAPES) -> None:
        self._config = config
        self._known: dict[tuple[str, str | None, str, str | None, WorkClass], tuple[Scope, ...]]
        self._known = {}
        self._max = max_shapes

    def __len__(self) -> int:
        return len(self._known)

    def __call__(self, request: AdmissionRequest) -> tuple[Scope, ...]:
        shape = (
            request.tenant,
            request.run_id,
            request.upstream,
            request.cost_class,
            request.work_class,
        )
        scopes = self._known.get(shape)
        if scopes is None:
            scopes = scopes_for(self._config, request)
            if len(self._known) >= self._max:
                self._known.clear()
            self._known[shape] = scopes
        return scopes


def critical_reserve(config: Config, max_running: int) -> int:
    """Slots of a scope limited to `max_running` that only critical calls may take."""
    share = band_of(config, "critical").share
    if max_running < 2 or share <= 0:
        return 0
    return min(max_running - 1, math.floor(share * max_running + _SHARE_EPSILON))


def live_reserve(config: Config, scope: Scope, band: WorkClass, load: Load) -> int:
    """Slots of `scope` that deferred work of `band` leaves free: the unfilled shares of the
    other bands that cannot wait for a slot (max_wait_s 0, interactive by default). A flood of
    deferred work therefore never refuses such calls while they are within their share."""
    limit = scope.limits.max_running
    if limit is None:
        return 0
    reserve = 0
    for other in WORK_CLASSES:
        spec = band_of(config, other)
        if other in (band, "critical") or spec.max_wait_s > 0 or spec.share <= 0:
            continue
        share = min(limit - 1, math.floor(spec.share * limit + _SHARE_EPSILON))
        reserve += max(0, share - load.running_class(scope.name, other))
    return reserve


def has_room(
    config: Config, scope: Scope, band: WorkClass, load: Load, *, deferred: bool = False
) -> bool:
    """Whether one more call of `band` fits in `scope`, respecting critical's reserve (and, for
    deferred work, `live_reserve`)."""
    limit = scope.limits.max_running
    if limit is None:
        return True
    unfilled = live_reserve(config, scope, band, load) if deferred else 0
    critical = 0 if band == "critical" else load.running_class(scope.name, "critical")
    return _room_in(scope, band, load.running(scope.name), critical, unfilled)


def _room_in(scope: Scope, band: WorkClass, running: int, critical: int, unfilled: int = 0) -> bool:
    """Whether one more call of `band` fits in `scope` (limited to `max_running`) where `running`
    calls run, `critical` of them critical, and `unfilled` slots are kept for others: critical
    calls may take any slot left; other bands leave critical's unfilled reserve free."""
    limit = scope.limits.max_running
    assert limit is not None, "only a scope with a running limit can be full"
    if band == "critical":
        return running + unfilled < limit
    return running + 1 + unfilled + max(0, scope.reserve - critical) <= limit


def _all_fit(state: AdmissionState, scopes: tuple[Scope, ...], band: WorkClass) -> bool:
    """Whether a live call of `band` fits in every scope (`has_room` of each, read straight from
    the state: the question every admitted call asks, answered without a `Load`)."""
    running, by_class = state.running, state.running_by_class
    for scope in scopes:
        if scope.limits.max_running is not None:
            name = scope.name
            if not _room_in(scope, band, running.get(name, 0), by_class.get((name, "critical"), 0)):
                return False
    return True


def patience_s(config: Config, band: WorkClass, scopes: tuple[Scope, ...]) -> float:
    """How long a call of `band` touching `scopes` may wait for room."""
    wait = band_of(config, band).max_wait_s
    for scope in scopes:
        limit = scope.limits.max_wait_s
        if limit is not None and limit < wait:
            wait = limit
    return max(wait, 0.0)


def bounded_retry_after(
    config: Config, seconds: float, *, floor: float = RETRY_AFTER_FLOOR_S
) -> float:
    """`seconds` clamped to [floor, cap], where the floor never exceeds the (positive) cap."""
    cap = config.retry_after_cap_s
    cap = cap if math.isfinite(cap) and cap > 0 else _DEFAULT_CAP_S
    if math.isnan(seconds):
        return cap
    return min(max(seconds, min(floor, cap)), cap)


def _estimated_wait_s(state: AdmissionState, scope: Scope) -> float:
    slots = max(scope.limits.max_running or 1, 1)
    mean = state.service_time_s.get(scope.name, DEFAULT_SERVICE_TIME_S)
    return (state.queued.get(scope.name, 0) + 1) * mean / slots


def blocking_scope(
    config: Config,
    state: AdmissionState,
    load: Load,
    scopes: tuple[Scope, ...],
    band: WorkClass,
    *,
    deferred: bool = False,
) -> tuple[Scope, float] | None:
    """The full scope with the longest estimated wait, and that wait; None when all have room."""
    worst: tuple[Scope, float] | None = None
    for scope in scopes:
        if scope.limits.max_running is None:  # no running limit: always room (`has_room`)
            continue
        if not has_room(config, scope, band, load, deferred=deferred):
            wait = _estimated_wait_s(state, scope)
            if worst is None or wait > worst[1]:
                worst = (scope, wait)
    return worst


def deadline_refusal(config: Config, state: AdmissionState, waiter: Waiter) -> Refusal:
    """The refusal of a queued call whose wait ran out, naming the scope it was waiting for."""
    band = waiter.request.work_class
    blocked = blocking_scope(
        config, state, Load(state), waiter.scopes, band, deferred=waiter.request.deferred
    )
    if blocked is None:
        return Refusal("deadline", f"class:{band}", bounded_retry_after(config, 0.0))
    return Refusal("deadline", blocked[0].name, bounded_retry_after(config, blocked[1]))


def decide_entry(
    config: Config,
    state: AdmissionState,
    request: AdmissionRequest,
    now: float,
    *,
    scopes: tuple[Scope, ...] | None = None,
) -> Decision:
    """May this new call start now? Admit, Queue (with its deadline), WaitCooldown or Reject.

    `scopes`: the call's `scopes_for`, when the caller holds them already (`ScopeCache`).
    """
    if scopes is None:
        scopes = scopes_for(config, request)
    if state.stopping:
        return Reject(Refusal("shutting_down", "global", bounded_retry_after(config, 0.0)))
    if request.deadline <= now:
        return Reject(Refusal("deadline", "global", bounded_retry_after(config, 0.0)))
    if state.paused:
        paused = next((s for s in scopes if s.name in state.paused), None)
        if paused is not None:
            retry = bounded_retry_after(config, PAUSED_RETRY_AFTER_S)
            return Reject(Refusal("paused", paused.name, retry))
    until = state.cooldown_until.get(request.upstream, -math.inf)
    if until > now:
        patience = patience_s(config, request.work_class, scopes)
        if patience > 0 and until < request.deadline and _full_queue(state, scopes) is None:
            return WaitCooldown(until, scopes)
        retry = bounded_retry_after(config, until - now, floor=_MIN_COOLDOWN_RETRY_S)
        return Reject(Refusal("cooldown", f"upstream:{request.upstream}", retry))
    if not request.deferred and _all_fit(state, scopes, request.work_class):
        return Admit(scopes)  # the common case: patience and queues only matter to one that waits
    blocked = blocking_scope(
        config, state, Load(state), scopes, request.work_class, deferred=request.deferred
    )
    if blocked is None:
        return Admit(scopes)
    patience = patience_s(config, request.work_class, scopes)
    full = _full_queue(state, scopes)
    if patience <= 0:
        retry = bounded_retry_after(config, blocked[1])
        return Reject(Refusal("overloaded", blocked[0].name, retry))
    if full is not None:
        retry = bounded_retry_after(config, _estimated_wait_s(state, full))
        return Reject(Refusal("overloaded", full.name, retry))
    deadline = min(request.deadline, now + patience)
    since = now if request.waiting_since is None else min(request.waiting_since, now)
    return Queue(deadline, since + AGEING_FRACTION * patience, scopes)


def _full_queue(state: AdmissionState, scopes: tuple[Scope, ...]) -> Scope | None:
    for scope in scopes:
        limit = scope.limits.max_pending
        if limit is not None and state.queued.get(scope.name, 0) >= limit:
            return scope
    return None
