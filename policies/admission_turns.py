"""The book's index of waiting queues by band, *group* and tenant.

A group is every queue of a band that touches the same scopes apart from its tenant and run
scopes (deferred or not, the upstream, the limited shared scopes such as `global`, `upstream:u`
or `cost_class:c`, and the limits of the unlimited ones). Queues of one group therefore all have
room, or all lack it, in those shared scopes, and all cool down together; they differ only in
tenant (and run) scopes, in whose turn it is, and in age.

Per (band, group) the index keeps its tenants with their queues and two heaps: (turn, tenant)
for round-robin, and (lift time, arrival) of each queue's oldest call for ageing. An entry is
current while it still says the truth (the tenant is in the group with that turn; the call is
its queue's oldest live one); others are dropped when they reach the top, and a heap is rebuilt
when stale entries outnumber current ones. The entries of a tenant whose own scope is full are
parked until one of its calls ends (`unpark`, from `AdmissionBook.finish`): nothing else gives
it room. `policies.admission_search` reads it.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from policies.admission import Scope, Waiter
from policies.admission_fairness import Shape
from policies.model import Limits, WorkClass

__all__ = ["Group", "SetAside", "TurnIndex", "group_of"]

Group = tuple[bool, str, tuple[str | Limits, ...]]
_Lift = tuple[float, int, int, Shape]  # (lift_at, seq, tie-breaker, shape) of a queue's head

_OWN_SCOPES = ("tenant:", "run:")


def group_of(shape: Shape) -> Group:
    """The group of a queue's shape: the shape without its band, tenant and own scopes."""
    _band, deferred, _tenant, upstream, keys = shape
    shared = tuple(k for k in keys if not (isinstance(k, str) and k.startswith(_OWN_SCOPES)))
    return (deferred, upstream, shared)


class _Members:
    """One (band, group): its tenants with their queues, the shared scopes, and two heaps: the
    tenants by turn, and the queue heads by lift time (ageing)."""

    __slots__ = ("active", "band", "lifts", "queues", "shared", "tenants", "turns")

    def __init__(self, band: WorkClass, shared: tuple[Scope, ...]) -> None:
        self.band = band
        self.shared = shared
        self.tenants: dict[str, dict[Shape, None]] = {}
        self.active: dict[str, dict[Shape, None]] = {}  # the tenants not parked
        self.queues = 0
        self.turns: list[tuple[int, str]] = []
        self.lifts: list[_Lift] = []


@dataclass(slots=True)
class SetAside:
    """Heap entries taken off during one dispatch because their call did not fit (nothing
    started in the same dispatch can make it fit: starts only add load); put back at its end.
    A tenant's parked entries are kept the same way, with the groups it is inactive in."""

    turns: list[tuple[_Members, tuple[int, str]]] = field(default_factory=list)
    lifts: list[tuple[_Members, _Lift]] = field(default_factory=list)
    resting: list[_Members] = field(default_factory=list)


class TurnIndex:
    """Waiting queues by band, group and tenant, over the book's turn table and queues."""

    def __init__(
        self,
        turns: Mapping[tuple[WorkClass, str], int],
        queues: Mapping[Shape, Mapping[int, Waiter]],
    ) -> None:
        self._turns = turns
        self._queues = queues
        self._bands: dict[WorkClass, dict[Group, _Members]] = {}
        self._ties = itertools.count()
        # Entries of tenants whose own scope was full, until one of their calls ends.
        self._parked: dict[str, SetAside] = {}

    def bands(self) -> list[WorkClass]:
        """Bands with waiting queues."""
        return list(self._bands)

    def add(self, shape: Shape, scopes: tuple[Scope, ...]) -> None:
        """A queue of `shape` now exists with one call (its tenant's turn is in the table)."""
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
        members.queues += 1
        shapes = members.tenants.get(tenant)
        if shapes is None:
            members.tenants[tenant] = members.active[tenant] = {shape: None}
            self._push_turn(members, tenant)
        else:
            shapes[shape] = None
        self.new_head(shape)

    def remove(self, shape: Shape) -> None:
        """The queue of `shape` is empty."""
        band, tenant = shape[0], shape[2]
        groups = self._bands[band]
        group = group_of(shape)
        members = groups[group]
        members.queues -= 1
        shapes = members.tenants[tenant]
        del shapes[shape]
        if not shapes:
            del members.tenants[tenant]
            members.active.pop(tenant, None)
            if not members.tenants:
                del groups[group]
                if not groups:
                    del self._bands[band]

    def new_turn(self, band: WorkClass, tenant: str) -> None:
        """The tenant's turn in `band` changed (it was served and still waits)."""
        for members in self._bands.get(band, {}).values():
            if tenant in members.tenants:
                self._push_turn(members, tenant)

    def new_head(self, shape: Shape) -> None:
        """The queue of `shape` has a new oldest call."""
        members = self._bands[shape[0]][group_of(shape)]
        head = next(iter(self._queues[shape].values()))
        heapq.heappush(members.lifts, (head.lift_at, head.seq, next(self._ties), shape))
        if len(members.lifts) > 2 * members.queues + 16:  # mostly stale: rebuild
            members.lifts = [
                (head.lift_at, head.seq, next(self._ties), shape)
                for shapes in members.tenants.values()
                for shape in shapes
                for head in (next(iter(self._queues[shape].values())),)
            ]
            heapq.heapify(members.lifts)

    def _push_turn(self, members: _Members, tenant: str) -> None:
        heapq.heappush(members.turns, (self._turns[(members.band, tenant)], tenant))
        if len(members.turns) > 2 * len(members.tenants) + 16:  # mostly stale: rebuild
            members.turns = [(self._turns[(members.band, t)], t) for t in members.tenants]
            heapq.heapify(members.turns)

    # -- reading -------------------------------------------------------------------------

    def groups(self, band: WorkClass) -> list[tuple[Group, tuple[Scope, ...]]]:
        """The band's groups with their limited shared scopes."""
        return [(group, m.shared) for group, m in self._bands.get(band, {}).items()]

    def tenants_in(self, band: WorkClass, group: Group) -> Iterator[tuple[str, Iterable[Shape]]]:
        """The group's tenants that are not parked, with their queues, in no particular order
        (a live view: the index must not change while it is read)."""
        members = self._bands.get(band, {}).get(group)
        return iter(members.active.items()) if members is not None else iter(())

    def shapes_in(self, band: WorkClass, group: Group, tenant: str) -> list[Shape]:
        """The queues of `tenant` in one group of `band`."""
        members = self._bands.get(band, {}).get(group)
        return list(members.tenants.get(tenant, ())) if members is not None else []

    def shapes_of(self, band: WorkClass, tenant: str) -> Iterator[tuple[Group, Shape]]:
        """Every queue of `tenant` in `band`, with its group."""
        for group, members in list(self._bands.get(band, {}).items()):
            for shape in list(members.tenants.get(tenant, ())):
                yield group, shape

    def first_in_turn(
        self,
        band: WorkClass,
        group: Group,
        fits: Callable[[str], bool],
        full: Callable[[str], bool],
        set_aside: SetAside,
    ) -> tuple[int, str] | None:
        """The (turn, tenant) of the group whose turn comes first among those that `fits`.

        A tenant whose own scope is `full` is parked until one of its calls ends (`unpark`):
        only that gives it room again. Other tenants that do not fit go to `set_aside`."""
        members = self._bands.get(band, {}).get(group)
        if members is None:
            return None
        heap = members.turns
        while heap:
            turn, tenant = heap[0]
            if tenant not in members.tenants or self._turns.get((band, tenant)) != turn:
                heapq.heappop(heap)  # stale: the tenant left the group or was served since
            elif full(tenant):
                self._park(members, tenant).turns.append((members, heapq.heappop(heap)))
            elif fits(tenant):
                return turn, tenant
            else:
                set_aside.turns.append((members, heapq.heappop(heap)))
        return None

    def first_lifted(
        self,
        band: WorkClass,
        group: Group,
        now: float,
        live_head: Callable[[Shape], Waiter | None],
        fits: Callable[[Waiter], bool],
        full: Callable[[str], bool],
        set_aside: SetAside,
    ) -> tuple[float, int] | None:
        """(lift_at, seq) of the group's earliest-lifted live queue head that `fits`, if it was
        lifted by `now`; heads whose tenant's scope is `full` are parked, other heads that do
        not fit go to `set_aside`."""
        members = self._bands.get(band, {}).get(group)
        if members is None:
            return None
        heap = members.lifts
        while heap and heap[0][0] <= now:
            lift_at, seq, _, shape = heap[0]
            head = live_head(shape) if shape in self._queues else None
            if head is None or head.seq != seq:
                heapq.heappop(heap)  # stale: that call left its queue, or expired
                if head is not None:  # the queue's live head may have no entry yet
                    heapq.heappush(heap, (head.lift_at, head.seq, next(self._ties), shape))
                continue
            if full(head.request.tenant):
                parked = self._park(members, head.request.tenant)
                parked.lifts.append((members, heapq.heappop(heap)))
            elif fits(head):
                return lift_at, seq
            else:
                set_aside.lifts.append((members, heapq.heappop(heap)))
        return None

    def _park(self, members: _Members, tenant: str) -> SetAside:
        """The tenant's own scope is full: it leaves the group's active tenants until `unpark`;
        its heap entries are parked by the caller in what this returns."""
        parked = self._parked.setdefault(tenant, SetAside())
        if members.active.pop(tenant, None) is not None:
            parked.resting.append(members)
        return parked

    def unpark(self, tenant: str) -> None:
        """One of the tenant's calls ended: its parked entries are looked at again."""
        parked = self._parked.pop(tenant, None)
        if parked is None:
            return
        self.restore(parked)
        for members in parked.resting:
            shapes = members.tenants.get(tenant)
            if shapes is not None:
                members.active[tenant] = shapes

    @staticmethod
    def restore(set_aside: SetAside) -> None:
        """Put back the entries set aside during a dispatch (stale ones are dropped later)."""
        for members, turn in set_aside.turns:
            heapq.heappush(members.turns, turn)
        for members, lift in set_aside.lifts:
            heapq.heappush(members.lifts, lift)
