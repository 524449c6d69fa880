"""Who may start now: the order in which waiting calls get the room that frees up.

Given the waiting calls and the current counts, `select_starts` repeatedly picks one call among
those that fit every scope they touch, until none fits:

1. **critical first.** A waiting critical call is always picked before any other band, and its
   reserved slots (see `policies.admission`) are never given to another band.
2. **ageing.** Otherwise, a call that has waited past its lift time (`AGEING_FRACTION` of its
   patience) lifts its whole band: the band whose oldest such call was lifted first goes next.
3. **shares.** Otherwise the band furthest below its share goes next: for each candidate, the
   band's running count in each limited scope it touches, divided by (its share among the
   non-critical bands × that scope's max_running); the band with the lowest such usage wins,
   ties going to the higher-priority band. A band with share 0 only gets idle capacity.
4. **round-robin inside the band.** The tenant whose turn is lowest goes (a tenant's turn is set
   when it starts waiting in the band and again each time it is served), so no tenant is served
   twice while another tenant of the band waits with a call that fits; then that tenant's
   oldest fitting call.

Calls of the same *shape* (see `shape_of`) are interchangeable for every rule above except
arrival order, so the engine works on queues of one shape each, looking only at their heads:
a dispatch costs O(shapes × scopes) per start, not O(waiting calls), and the number of shapes
follows the tenants and limited scopes waiting, not the agent runs. Calls to an upstream in
cooldown are not started; a head whose wait has run out is refused (`deadline`) on the way.

This engine is the rules' reference: `AdmissionBook.dispatch` reaches the same choice through
its turn index (`policies.admission_search`) without reading every tenant's queue, and the
tests compare every dispatch of the book with `select_starts`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from policies.admission import (
    AdmissionState,
    Load,
    Refusal,
    Scope,
    Waiter,
    band_of,
    deadline_refusal,
    has_room,
)
from policies.model import WORK_CLASSES, Config, Limits, WorkClass

__all__ = [
    "Dispatch",
    "Room",
    "Shape",
    "fits",
    "scope_has_room",
    "select_from_queues",
    "select_starts",
    "shape_of",
    "share_weight",
    "usage_of",
]

Shape = tuple[WorkClass, bool, str, str, tuple[str | Limits, ...]]
_NON_CRITICAL: tuple[WorkClass, ...] = tuple(b for b in WORK_CLASSES if b != "critical")


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Waiting calls to start now (in order) and waiting calls to refuse now."""

    starts: tuple[Waiter, ...]
    expired: tuple[tuple[Waiter, Refusal], ...]


def shape_of(waiter: Waiter) -> Shape:
    """What makes two waiting calls interchangeable for admission: band, deferred or not (deferred
    work leaves the live reserve free), tenant (round-robin), upstream (cooldowns), the limited
    scopes they count against, and the limits of the others (which set their patience).

    An unlimited scope is keyed by its limits, not its name, so calls of a thousand agent runs
    of one tenant wait in one queue, not a thousand that every release would look at."""
    request = waiter.request
    keys = tuple(
        scope.name if scope.limits.max_running is not None else scope.limits
        for scope in waiter.scopes
    )
    return (request.work_class, request.deferred, request.tenant, request.upstream, keys)


def select_starts(
    config: Config, state: AdmissionState, waiters: Iterable[Waiter], now: float
) -> Dispatch:
    """Which of `waiters` (in arrival order) may start now, given the counts in `state`."""
    queues: dict[Shape, list[Waiter]] = {}
    for waiter in waiters:
        queues.setdefault(shape_of(waiter), []).append(waiter)
    return select_from_queues(config, state, queues.values(), now)


def select_from_queues(
    config: Config, state: AdmissionState, queues: Iterable[Iterable[Waiter]], now: float
) -> Dispatch:
    """`select_starts` over queues that each hold calls of one shape, in arrival order.

    Only queue heads are examined, so an expired call behind a live head is left for the
    caller's own timer (or `AdmissionBook.expire`).
    """
    expired: list[tuple[Waiter, Refusal]] = []
    heads: list[_Head] = []
    for queue in queues:
        rest = iter(queue)
        first = _next_live(rest, config, state, now, expired)
        if first is not None and not _cooling(state, first, now):
            heads.append(_Head(first, rest))
    load = Load(state)
    turns: dict[tuple[WorkClass, str], int] = {}
    next_turn = max(state.turns.values(), default=0) + 1
    starts: list[Waiter] = []
    while heads:
        room: Room = {}  # heads share scopes: judge each once
        fitting = [h for h in heads if fits(config, h.waiter, load, room)]
        if not fitting:
            break
        head = _choose(config, fitting, load, state, turns, now)
        pick = head.waiter
        starts.append(pick)
        load.add(pick.scopes, pick.request.work_class)
        turns[(pick.request.work_class, pick.request.tenant)] = next_turn
        next_turn += 1
        following = _next_live(head.rest, config, state, now, expired)
        if following is None:
            heads.remove(head)
        else:
            head.waiter = following
    return Dispatch(tuple(starts), tuple(expired))


@dataclass(slots=True)
class _Head:
    """The oldest live call of one queue, and the rest of that queue."""

    waiter: Waiter
    rest: Iterator[Waiter]


def _next_live(
    rest: Iterator[Waiter],
    config: Config,
    state: AdmissionState,
    now: float,
    expired: list[tuple[Waiter, Refusal]],
) -> Waiter | None:
    """The next call of a queue still inside its deadline; expired ones are refused on the way."""
    for waiter in rest:
        if waiter.deadline > now:
            return waiter
        expired.append((waiter, deadline_refusal(config, state, waiter)))
    return None


def _cooling(state: AdmissionState, waiter: Waiter, now: float) -> bool:
    return state.cooldown_until.get(waiter.request.upstream, -math.inf) > now


Room = dict[tuple[str, WorkClass, bool], bool]
"""Room in a scope for one more call of a band (deferred or not), judged once per start."""


def fits(config: Config, waiter: Waiter, load: Load, room: Room) -> bool:
    """Whether `waiter` has room in every limited scope it touches (`room` caches the verdicts
    while `load` stays the same)."""
    band, deferred = waiter.request.work_class, waiter.request.deferred
    return all(scope_has_room(config, s, band, deferred, load, room) for s in waiter.scopes)


def scope_has_room(
    config: Config, scope: Scope, band: WorkClass, deferred: bool, load: Load, room: Room
) -> bool:
    """`has_room`, remembered in `room` per (scope, band, deferred)."""
    if scope.limits.max_running is None:
        return True
    key = (scope.name, band, deferred)
    verdict = room.get(key)
    if verdict is None:
        verdict = room[key] = has_room(config, scope, band, load, deferred=deferred)
    return verdict


def _choose(
    config: Config,
    fitting: list[_Head],
    load: Load,
    state: AdmissionState,
    turns: dict[tuple[WorkClass, str], int],
    now: float,
) -> _Head:
    band = _pick_band(config, [h.waiter for h in fitting], load, now)
    in_band = [h for h in fitting if h.waiter.request.work_class == band]

    def turn(head: _Head) -> tuple[int, int]:
        key = (band, head.waiter.request.tenant)
        return (turns.get(key, state.turns.get(key, 0)), head.waiter.seq)

    tenant = min(in_band, key=turn).waiter.request.tenant
    own = (h for h in in_band if h.waiter.request.tenant == tenant)
    return min(own, key=lambda h: h.waiter.seq)


def _pick_band(config: Config, fitting: list[Waiter], load: Load, now: float) -> WorkClass:
    bands = {w.request.work_class for w in fitting}
    if "critical" in bands:
        return "critical"
    lifted = [w for w in fitting if w.lift_at <= now]
    if lifted:
        return min(lifted, key=lambda w: (w.lift_at, w.seq)).request.work_class
    usage = {band: _usage(config, band, fitting, load) for band in bands}
    return min(bands, key=lambda band: (usage[band], WORK_CLASSES.index(band)))


def _usage(config: Config, band: WorkClass, fitting: list[Waiter], load: Load) -> float:
    """How far `band` is into its share, as its best-placed fitting call sees it."""
    weight = share_weight(config, band)
    if weight <= 0:
        return math.inf
    calls = (w for w in fitting if w.request.work_class == band)
    return min((usage_of(w.scopes, band, load, weight) for w in calls), default=math.inf)


def share_weight(config: Config, band: WorkClass) -> float:
    """The band's share among the non-critical bands (0 when it has none)."""
    total = sum(max(band_of(config, b).share, 0.0) for b in _NON_CRITICAL)
    return max(band_of(config, band).share, 0.0) / total if total > 0 else 0.0


def usage_of(scopes: tuple[Scope, ...], band: WorkClass, load: Load, weight: float) -> float:
    """How far one more call of `band` in `scopes` would take the band into its share: the worst
    of its limited scopes."""
    worst = 0.0
    for scope in scopes:
        limit = scope.limits.max_running
        if limit:
            worst = max(worst, (load.running_class(scope.name, band) + 1) / (weight * limit))
    return worst
