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

Calls whose wait has run out are returned as refusals (`deadline`), and calls to an upstream in
cooldown are not started.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from policies.admission import (
    AdmissionState,
    Load,
    Refusal,
    Waiter,
    band_of,
    deadline_refusal,
    has_room,
)
from policies.model import WORK_CLASSES, Config, WorkClass

__all__ = ["Dispatch", "select_starts"]

_NON_CRITICAL: tuple[WorkClass, ...] = tuple(b for b in WORK_CLASSES if b != "critical")


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Waiting calls to start now (in order) and waiting calls to refuse now."""

    starts: tuple[Waiter, ...]
    expired: tuple[tuple[Waiter, Refusal], ...]


def select_starts(
    config: Config, state: AdmissionState, waiters: Iterable[Waiter], now: float
) -> Dispatch:
    """Which waiting calls may start now, given the counts in `state`."""
    expired: list[tuple[Waiter, Refusal]] = []
    pool: list[Waiter] = []
    for waiter in waiters:
        if waiter.deadline <= now:
            expired.append((waiter, deadline_refusal(config, state, waiter)))
        elif state.cooldown_until.get(waiter.request.upstream, -math.inf) <= now:
            pool.append(waiter)
    load = Load(state)
    turns: dict[tuple[WorkClass, str], int] = {}
    next_turn = max(state.turns.values(), default=0) + 1
    starts: list[Waiter] = []
    while pool:
        fitting = [w for w in pool if _fits(config, w, load)]
        if not fitting:
            break
        pick = _choose(config, fitting, load, state, turns, now)
        starts.append(pick)
        pool.remove(pick)
        load.add(pick.scopes, pick.request.work_class)
        turns[(pick.request.work_class, pick.request.tenant)] = next_turn
        next_turn += 1
    return Dispatch(tuple(starts), tuple(expired))


def _fits(config: Config, waiter: Waiter, load: Load) -> bool:
    band = waiter.request.work_class
    return all(has_room(config, scope, band, load) for scope in waiter.scopes)


def _choose(
    config: Config,
    fitting: list[Waiter],
    load: Load,
    state: AdmissionState,
    turns: dict[tuple[WorkClass, str], int],
    now: float,
) -> Waiter:
    band = _pick_band(config, fitting, load, now)
    in_band = [w for w in fitting if w.request.work_class == band]

    def turn(waiter: Waiter) -> tuple[int, int]:
        key = (band, waiter.request.tenant)
        return (turns.get(key, state.turns.get(key, 0)), waiter.seq)

    tenant = min(in_band, key=turn).request.tenant
    return min((w for w in in_band if w.request.tenant == tenant), key=lambda w: w.seq)


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
    total = sum(max(band_of(config, b).share, 0.0) for b in _NON_CRITICAL)
    weight = max(band_of(config, band).share, 0.0) / total if total > 0 else 0.0
    if weight <= 0:
        return math.inf
    best = math.inf
    for waiter in fitting:
        if waiter.request.work_class != band:
            continue
        worst = 0.0
        for scope in waiter.scopes:
            limit = scope.limits.max_running
            if limit:
                used = (load.running_class(scope.name, band) + 1) / (weight * limit)
                worst = max(worst, used)
        best = min(best, worst)
    return best
