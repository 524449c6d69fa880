"""One dispatch's search through the book's `TurnIndex`: the call the engine would start next.

It reaches the choice `policies.admission_fairness.select_from_queues` makes over every queue
head, without looking at every head:

- a band's candidate is found in turn order: in each of its groups that is not cooling down and
  has room in its shared scopes, the first tenant (by turn) with a call that fits; the earliest
  turn among the groups wins, and its oldest call that fits is the candidate;
- critical's candidate, if any, starts; otherwise, with candidates in several bands, ageing picks
  the band of the earliest-lifted call that fits (each group's lift heap gives its own), and
  failing that the band furthest below its share: per group, the shared scopes give a floor no
  call of the group can go under, and the scan of its calls stops as soon as one reaches it.

A group whose shared scopes are full is skipped whole, and a tenant whose own scope is full is
parked in the index until one of its calls ends (the shares step does not read it either), so
a release costs O(groups) plus the few tenants that do not fit for another reason (a limited
run), rather than O(tenants waiting). Expired queue heads met on the way are collected in `late`
for the book to refuse.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from policies.admission import AdmissionState, Load, Scope, Waiter, tenant_scope
from policies.admission_fairness import (
    Room,
    Shape,
    fits,
    scope_has_room,
    share_weight,
    usage_of,
)
from policies.admission_turns import Group, SetAside, TurnIndex
from policies.model import WORK_CLASSES, Config, WorkClass

__all__ = ["TurnSearch"]


@dataclass(slots=True)
class _Step:
    """What one pick reads: the counts, the room verdicts and each band's open groups (all valid
    until the next start)."""

    load: Load
    room: Room = field(default_factory=dict)
    opened: dict[WorkClass, list[tuple[Group, tuple[Scope, ...]]]] = field(default_factory=dict)


class TurnSearch:
    """The search of one dispatch over `index` (the book's queues, cooldowns, at `now`)."""

    def __init__(
        self,
        config: Config,
        index: TurnIndex,
        queues: Mapping[Shape, Mapping[int, Waiter]],
        cooldown_until: Mapping[str, float],
        now: float,
    ) -> None:
        self._config = config
        self._index = index
        self._queues = queues
        self._cooldown_until = cooldown_until
        self._now = now
        self.late: dict[int, Waiter] = {}
        self.set_aside = SetAside()

    def next_start(self, state: AdmissionState) -> Waiter | None:
        """The next call to start given the counts in `state`, or None when none fits."""
        step = _Step(Load(state))
        bands = self._index.bands()
        if "critical" in bands and (pick := self._candidate("critical", step)):
            return pick
        candidates: dict[WorkClass, Waiter] = {}
        for band in bands:
            if band != "critical" and (pick := self._candidate(band, step)):
                candidates[band] = pick
        if len(candidates) <= 1:
            return next(iter(candidates.values()), None)
        return candidates[self._pick_band(list(candidates), step)]

    # -- within a band -------------------------------------------------------------------

    def _candidate(self, band: WorkClass, step: _Step) -> Waiter | None:
        """The band's call that would start if the band were chosen."""
        best: tuple[int, str] | None = None
        for group, _shared in self._open_groups(band, step):
            fitting = functools.partial(self._fits_in, band, group, step)
            full = functools.partial(self._tenant_full, band, group[0], step)
            found = self._index.first_in_turn(band, group, fitting, full, self.set_aside)
            if found is not None and (best is None or found < best):
                best = found
        if best is None:
            return None
        heads = [
            head
            for group, shape in self._index.shapes_of(band, best[1])
            if not self._cooling(group[1]) and (head := self._fitting(shape, step))
        ]
        return min(heads, key=lambda head: head.seq)

    def _open_groups(self, band: WorkClass, step: _Step) -> list[tuple[Group, tuple[Scope, ...]]]:
        """The band's groups (with their shared scopes) not cooling down and with room in every
        shared scope; judged once per step."""
        opened = step.opened.get(band)
        if opened is None:
            opened = step.opened[band] = [
                (group, shared)
                for group, shared in self._index.groups(band)
                if not self._cooling(group[1])
                and all(
                    scope_has_room(self._config, s, band, group[0], step.load, step.room)
                    for s in shared
                )
            ]
        return opened

    def _tenant_full(self, band: WorkClass, deferred: bool, step: _Step, tenant: str) -> bool:
        """Whether the tenant's own scope has no room for one more call of `band` (it gets room
        again only when one of the tenant's calls ends)."""
        scope = tenant_scope(self._config, tenant)
        return not scope_has_room(self._config, scope, band, deferred, step.load, step.room)

    def _fits_in(self, band: WorkClass, group: Group, step: _Step, tenant: str) -> bool:
        return any(
            self._fitting(shape, step) is not None
            for shape in self._index.shapes_in(band, group, tenant)
        )

    # -- between bands -------------------------------------------------------------------

    def _pick_band(self, bands: list[WorkClass], step: _Step) -> WorkClass:
        """Ageing first (the earliest-lifted call that fits), else the band furthest below its
        share, ties to the higher-priority band."""
        lifted: tuple[float, int, WorkClass] | None = None
        fitting = functools.partial(fits, self._config, load=step.load, room=step.room)
        for band in bands:
            for group, _shared in self._open_groups(band, step):
                full = functools.partial(self._tenant_full, band, group[0], step)
                found = self._index.first_lifted(
                    band, group, self._now, self._live, fitting, full, self.set_aside
                )
                if found is not None and (lifted is None or found < lifted[:2]):
                    lifted = (*found, band)
        if lifted is not None:
            return lifted[2]
        usage = {band: self._usage(band, step) for band in bands}
        return min(bands, key=lambda band: (usage[band], WORK_CLASSES.index(band)))

    def _usage(self, band: WorkClass, step: _Step) -> float:
        """The band's usage as its best-placed call that fits sees it (`_usage` of the engine).

        No call of a group can be better placed than its floor: its shared scopes as they are,
        its tenant's scope as if the band ran nothing there. A group is read only while it could
        beat the best so far, and only until one of its calls reaches its floor; parked tenants
        (at their own limit) are not read."""
        weight = share_weight(self._config, band)
        if weight <= 0:
            return math.inf
        idle_tenant = tenant_scope(self._config, "")  # every tenant's limits, nothing running
        own_floor = usage_of((idle_tenant,), band, Load(AdmissionState()), weight)
        best = math.inf
        for group, shared in self._open_groups(band, step):
            floor = max(usage_of(shared, band, step.load, weight), own_floor)
            for _tenant, shapes in self._index.tenants_in(band, group):
                if best <= floor:
                    break
                for shape in shapes:
                    if (head := self._fitting(shape, step)) is not None:
                        best = min(best, usage_of(head.scopes, band, step.load, weight))
        return best

    # -- queues --------------------------------------------------------------------------

    def _live(self, shape: Shape) -> Waiter | None:
        """The queue's oldest call still inside its deadline (expired ones go to `late`)."""
        for waiter in self._queues[shape].values():
            if waiter.deadline > self._now:
                return waiter
            self.late[waiter.seq] = waiter
        return None

    def _fitting(self, shape: Shape, step: _Step) -> Waiter | None:
        head = self._live(shape)
        return head if head is not None and fits(self._config, head, step.load, step.room) else None

    def _cooling(self, upstream: str) -> bool:
        return self._cooldown_until.get(upstream, -math.inf) > self._now
