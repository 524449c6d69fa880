"""The book's index of waiting queues by band, *group* and tenant, in round-robin turn order.

A group is every queue of a band that touches the same scopes apart from its tenant and run
scopes (deferred or not, the upstream, the limited shared scopes such as `global`, `upstream:u`
or `cost_class:c`, and the limits of the unlimited ones). Queues of one group therefore all have
room, or all lack it, in those shared scopes, and all cool down together; they differ only in
tenant (and run) scopes, and in whose turn it is.

Per (band, group) the index keeps its tenants and a heap of (turn, tenant) entries. An entry is
current while the tenant is still in the group with that turn; older ones are dropped when they
reach the top, and the heap is rebuilt when stale entries outnumber current ones. This lets the
book find the tenant whose turn it is among those that fit, skipping a whole group whose shared
scopes are full in O(1), instead of looking at every waiting tenant (see
`AdmissionBook.dispatch`).
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Iterator, Mapping

from policies.admission import AdmissionState, Load, Scope, Waiter
from policies.admission_fairness import Room, Shape, fits, scope_has_room
from policies.model import Config, Limits, WorkClass

__all__ = ["Group", "TurnIndex", "TurnSearch", "group_of"]

SetAside = list[tuple[WorkClass, "Group", tuple[int, str]]]

Group = tuple[bool, str, tuple[str | Limits, ...]]
_OWN_SCOPES = ("tenant:", "run:")


def group_of(shape: Shape) -> Group:
    """The group of a queue's shape: the shape without its band, tenant and own scopes."""
    _band, deferred, _tenant, upstream, keys = shape
    shared = tuple(k for k in keys if not (isinstance(k, str) and k.startswith(_OWN_SCOPES)))
    return (deferred, upstream, shared)


class _Members:
    """One (band, group): its tenants with their shapes, the turn heap, the shared scopes."""

    __slots__ = ("band", "heap", "shared", "tenants")

    def __init__(self, band: WorkClass, shared: tuple[Scope, ...]) -> None:
        self.band = band
        self.tenants: dict[str, dict[Shape, None]] = {}
        self.heap: list[tuple[int, str]] = []
        self.shared = shared

    def push(self, turn: int, tenant: str, turns: dict[tuple[WorkClass, str], int]) -> None:
        heapq.heappush(self.heap, (turn, tenant))
        if len(self.heap) > 2 * len(self.tenants) + 16:  # mostly stale: rebuild from the truth
            self.heap = [(turns[(self.band, t)], t) for t in self.tenants]
            heapq.heapify(self.heap)


class TurnIndex:
    """Waiting queues by band, group and tenant; turns are read from the book's table."""

    def __init__(self, turns: dict[tuple[WorkClass, str], int]) -> None:
        self._turns = turns
        self._bands: dict[WorkClass, dict[Group, _Members]] = {}

    def bands(self) -> list[WorkClass]:
        """Bands with waiting queues."""
        return list(self._bands)

    def add(self, shape: Shape, scopes: tuple[Scope, ...]) -> None:
        """A queue of `shape` now exists (its tenant's turn is already in the turn table)."""
        band, tenant = shape[0], shape[2]
        groups = self._bands.setdefault(band, {})
        group = group_of(shape)
        members = groups.get(group)
        if members is None:
            shared = tuple(
                s
                for s in scopes
                if s.limits.max_running is not None and not s.name.startswith(_OWN_SCOPES)
            )
            members = groups[group] = _Members(band, shared)
        shapes = members.tenants.get(tenant)
        if shapes is None:
            members.tenants[tenant] = {shape: None}
            members.push(self._turns[(band, tenant)], tenant, self._turns)
        else:
            shapes[shape] = None

    def remove(self, shape: Shape) -> None:
        """The queue of `shape` is empty."""
        band, tenant = shape[0], shape[2]
        groups = self._bands[band]
        group = group_of(shape)
        members = groups[group]
        shapes = members.tenants[tenant]
        del shapes[shape]
        if not shapes:
            del members.tenants[tenant]
            if not members.tenants:
                del groups[group]
                if not groups:
                    del self._bands[band]

    def new_turn(self, band: WorkClass, tenant: str) -> None:
        """The tenant's turn in `band` changed (it was served and still waits)."""
        turn = self._turns[(band, tenant)]
        for members in self._bands.get(band, {}).values():
            if tenant in members.tenants:
                members.push(turn, tenant, self._turns)

    def groups(self, band: WorkClass) -> list[tuple[Group, tuple[Scope, ...]]]:
        """The band's groups with their limited shared scopes."""
        return [(group, m.shared) for group, m in self._bands.get(band, {}).items()]

    def shapes_in(self, band: WorkClass, group: Group, tenant: str) -> list[Shape]:
        """The queues of `tenant` in one group of `band`."""
        members = self._bands.get(band, {}).get(group)
        return list(members.tenants.get(tenant, ())) if members is not None else []

    def shapes_of(self, band: WorkClass, tenant: str) -> Iterator[tuple[Group, Shape]]:
        """Every queue of `tenant` in `band`, with its group."""
        for group, members in list(self._bands.get(band, {}).items()):
            for shape in list(members.tenants.get(tenant, ())):
                yield group, shape

    def first_fitting(
        self,
        band: WorkClass,
        group: Group,
        fits: Callable[[str], bool],
        set_aside: SetAside,
    ) -> tuple[int, str] | None:
        """The (turn, tenant) of the group whose turn comes first among those that `fits`.

        Tenants that do not fit are taken off the heap into `set_aside` (nothing started in the
        same dispatch can make them fit: starts only add load); `restore` puts them back.
        """
        members = self._bands.get(band, {}).get(group)
        if members is None:
            return None
        heap = members.heap
        while heap:
            turn, tenant = heap[0]
            if tenant not in members.tenants or self._turns.get((band, tenant)) != turn:
                heapq.heappop(heap)  # stale: the tenant left the group or was served since
                continue
            if fits(tenant):
                return turn, tenant
            set_aside.append((band, group, heapq.heappop(heap)))
        return None

    def restore(self, set_aside: SetAside) -> None:
        """Put back the entries `first_fitting` set aside (stale ones are dropped later)."""
        for band, group, entry in set_aside:
            members = self._bands.get(band, {}).get(group)
            if members is not None:
                heapq.heappush(members.heap, entry)


class TurnSearch:
    """One dispatch's search through a `TurnIndex`: the call the engine would start next.

    Critical first (when `bands` lists it first), then, band by band: skip a group that cools
    down or has a full shared scope; in each other group, the first tenant in turn order with a
    call that fits; the earliest turn among the groups wins, and starts its oldest call that
    fits. Expired queue heads met on the way are collected in `late`.
    """

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
        self.set_aside: SetAside = []

    def next_start(self, bands: list[WorkClass], state: AdmissionState) -> Waiter | None:
        """The next call to start given the counts in `state`, or None when none fits."""
        load, room = Load(state), Room()
        for band in bands:
            best: tuple[int, str] | None = None
            for group, shared in self._index.groups(band):
                deferred, upstream, _ = group
                if self._cooling(upstream) or not all(
                    scope_has_room(self._config, s, band, deferred, load, room) for s in shared
                ):
                    continue
                fitting = functools.partial(self._fits_in, band, group, load, room)
                found = self._index.first_fitting(band, group, fitting, self.set_aside)
                if found is not None and (best is None or found < best):
                    best = found
            if best is not None:
                heads = [
                    head
                    for group, shape in self._index.shapes_of(band, best[1])
                    if not self._cooling(group[1])
                    and (head := self._fitting_head(shape, load, room)) is not None
                ]
                return min(heads, key=lambda head: head.seq)
        return None

    def _fits_in(self, band: WorkClass, group: Group, load: Load, room: Room, tenant: str) -> bool:
        return any(
            self._fitting_head(shape, load, room) is not None
            for shape in self._index.shapes_in(band, group, tenant)
        )

    def _fitting_head(self, shape: Shape, load: Load, room: Room) -> Waiter | None:
        """The queue's oldest call still inside its deadline, if it fits."""
        for waiter in self._queues[shape].values():
            if waiter.deadline > self._now:
                return waiter if fits(self._config, waiter, load, room) else None
            self.late[waiter.seq] = waiter
        return None

    def _cooling(self, upstream: str) -> bool:
        return self._cooldown_until.get(upstream, -math.inf) > self._now
