"""Property tests of admission: random arrivals, finishes, clock ticks and cooldowns.

A small synchronous driver plays the runtime's part (it calls the book exactly where
`proxy.runtime.scheduler` does: decide on arrival, dispatch after every finish, tick and cooldown
end), and the properties are checked after every step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from policies.admission import (
    AdmissionRequest,
    AdmissionState,
    Admit,
    Load,
    Queue,
    Refusal,
    WaitCooldown,
    critical_reserve,
    decide_entry,
    has_room,
    scopes_for,
)
from policies.admission_book import AdmissionBook, Hold, Running
from policies.admission_fairness import select_starts
from policies.model import WORK_CLASSES, ClassBand, Config, Limits, UpstreamSpec, WorkClass

TENANTS = ("a", "b", "c")
UPSTREAMS = ("u1", "u2")
PROPERTY_SETTINGS = settings(max_examples=100, deadline=None)

maybe_count = st.none() | st.integers(1, 5)


@st.composite
def configs(draw: st.DrawFn) -> Config:
    """Any configuration: bounded or unbounded scopes, queues, patience, shares and caps."""

    def limits(max_wait: bool = True) -> Limits:
        # queueing is where the interesting cases are: a zero that forbids it is drawn rarely
        wait = draw(st.sampled_from([None, None, 2.0, 10.0, 0.0])) if max_wait else None
        pending = draw(st.sampled_from([None, None, 1, 2, 3, 5, 0]))
        return Limits(draw(maybe_count), pending, wait)

    critical_share = draw(st.sampled_from([0.0, 0.1, 0.3]))
    rest = (1.0 - critical_share) / 3
    classes = {
        "critical": ClassBand("critical", critical_share, draw(st.sampled_from([1.0, 30.0]))),
        "interactive": ClassBand("interactive", rest, draw(st.sampled_from([0.0, 5.0]))),
        "background": ClassBand("background", rest, draw(st.sampled_from([1.0, 30.0]))),
        "bulk": ClassBand("bulk", rest, draw(st.sampled_from([0.5, 300.0]))),
    }
    upstreams = {
        name: UpstreamSpec(name, "http", url="http://127.0.0.1:9", limits=limits())
        for name in UPSTREAMS
    }
    return Config(
        upstreams=upstreams,
        classes=classes,  # type: ignore[arg-type]
        limits={"global": limits(), "tenant": limits(), "run": limits(max_wait=False)},
        cost_classes={"browser": limits()},
        retry_after_cap_s=draw(st.sampled_from([0.5, 5.0, 300.0])),
    )


arrivals = st.tuples(
    st.just("arrive"),
    st.sampled_from(TENANTS),
    st.sampled_from(WORK_CLASSES),
    st.sampled_from(UPSTREAMS),
    st.sampled_from([None, "r1"]),
    st.sampled_from([None, "browser"]),
    st.floats(0.5, 100.0),
)
operations = st.lists(
    st.one_of(
        arrivals,
        arrivals,  # twice as likely as the others, so scopes fill and queues build up
        st.tuples(st.just("finish"), st.integers(0, 30)),
        st.tuples(st.just("tick"), st.floats(0.01, 20.0)),
        st.tuples(st.just("cooldown"), st.sampled_from(UPSTREAMS), st.floats(0.1, 30.0)),
    ),
    min_size=10,
    max_size=80,
)


@dataclass
class Driver:
    """Plays the runtime against the book and records every decision."""

    config: Config
    book: AdmissionBook = field(init=False)
    now: float = 0.0
    running: list[Running] = field(default_factory=list)
    holds: list[tuple[Hold, float]] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    on_start: Callable[[AdmissionRequest, bool], None] | None = None
    on_withdraw: Callable[[AdmissionRequest], None] | None = None

    def __post_init__(self) -> None:
        self.book = AdmissionBook(self.config)

    def arrive(self, request: AdmissionRequest) -> Any:
        decision = self.book.decide(request, self.now)
        if isinstance(decision, Admit):
            self._started(self.book.start(request, decision.scopes, self.now), queued=False)
        elif isinstance(decision, Queue):
            self.book.enqueue(request, decision, self.now)
        elif isinstance(decision, WaitCooldown):
            self.holds.append((self.book.hold(request, decision.scopes, self.now), decision.until))
        else:
            self.refusals.append(decision.refusal)
        return decision

    def finish(self, index: int) -> list[AdmissionRequest]:
        """End one running call (if any) and return the calls started in its place."""
        if not self.running:
            return []
        self.book.finish(self.running.pop(index % len(self.running)), self.now)
        return self.dispatch()

    def tick(self, seconds: float) -> None:
        self.now += seconds
        for upstream in UPSTREAMS:
            until = self.book.cooldown_until(upstream)
            if until is not None and until <= self.now:
                self.book.end_cooldown(upstream)
        for waiter, refusal in self.book.expire(self.now):  # the runtime's per-call timers
            self._refused(waiter.request, refusal)
        self.dispatch()
        ready = [(h, until) for h, until in self.holds if until <= self.now]
        for held, until in ready:
            self.holds.remove((held, until))
            self.book.unhold(held)
            self.arrive(held.request)

    def cooldown(self, upstream: str, seconds: float) -> None:
        self.book.start_cooldown(upstream, self.now + seconds)

    def dispatch(self) -> list[AdmissionRequest]:
        # The reference: the engine over every queued call, on the same state, before the book
        # (which may take a shortcut through its own index) dispatches.
        expected = select_starts(self.config, self.book.state(), self.book.waiters(), self.now)
        result = self.book.dispatch(self.now)
        assert [w.seq for w, _ in result.started] == [w.seq for w in expected.starts]
        for waiter, refusal in result.expired:
            self._refused(waiter.request, refusal)
        for _waiter, running in result.started:
            self._started(running, queued=True)
        return [w.request for w, _ in result.started]

    def _refused(self, request: AdmissionRequest, refusal: Refusal) -> None:
        self.refusals.append(refusal)
        if self.on_withdraw:
            self.on_withdraw(request)

    def _started(self, running: Running, *, queued: bool) -> None:
        self.running.append(running)
        if self.on_start:
            self.on_start(running.request, queued)

    def apply(self, operation: tuple[Any, ...]) -> None:
        kind, *args = operation
        if kind == "arrive":
            tenant, band, upstream, run_id, cost, deadline_in = args
            self.arrive(
                AdmissionRequest(
                    tenant, band, upstream, run_id, cost, deadline=self.now + deadline_in
                )
            )
        elif kind == "finish":
            self.finish(args[0])
        elif kind == "tick":
            self.tick(args[0])
        else:
            self.cooldown(*args)


def scope_limit(config: Config, scope: str) -> int | None:
    kind, _, name = scope.partition(":")
    if kind in ("global", "tenant", "run"):
        return config.scope_limits(kind).max_running
    if kind == "upstream":
        return config.upstreams[name].limits.max_running
    if kind == "cost_class":
        return config.cost_classes[name].max_running
    return None


@PROPERTY_SETTINGS
@given(config=configs(), ops=operations)
def test_no_scope_ever_runs_more_than_its_max_running(config: Config, ops: list[Any]) -> None:
    """Whatever arrives, finishes or cools down, every scope stays within max_running."""
    driver = Driver(config)
    for operation in ops:
        driver.apply(operation)
        for scope, stats in driver.book.stats(driver.now).items():
            limit = scope_limit(config, scope)
            assert limit is None or stats.running <= limit, (scope, stats)


@PROPERTY_SETTINGS
@given(config=configs(), ops=operations)
def test_every_refusal_has_a_positive_bounded_retry_after(config: Config, ops: list[Any]) -> None:
    """Every refusal, at entry or after queueing, carries 0 < retry_after_s ≤ the cap."""
    driver = Driver(config)
    for operation in ops:
        driver.apply(operation)
    for refusal in driver.refusals:
        assert 0 < refusal.retry_after_s <= config.retry_after_cap_s, refusal


def _two_blocked_queues() -> tuple[Config, list[Any]]:
    """Tenant a waits on its own limit while b waits on u1; then one call of a on u1 ends."""
    config = Config(
        upstreams={
            u: UpstreamSpec(u, "http", url="http://127.0.0.1:9", limits=Limits(1))
            for u in UPSTREAMS
        },
        limits={"tenant": Limits(1)},
    )
    ops = [("arrive", "a", "background", "u1", None, None, 50.0)]
    ops += [("arrive", "a", "background", "u2", None, None, 50.0)] * 2
    ops += [("arrive", "b", "background", "u1", None, None, 50.0), ("finish", 0)]
    return config, ops


@PROPERTY_SETTINGS
@given(config=configs(), ops=operations)
@example(*_two_blocked_queues())
def test_no_waiting_call_that_fits_is_left_waiting(config: Config, ops: list[Any]) -> None:
    """Work-conserving: after every step, no queued call could start now."""
    driver = Driver(config)
    for operation in ops:
        driver.apply(operation)
        state = driver.book.state()
        for waiter in driver.book.waiters():
            cooling = state.cooldown_until.get(waiter.request.upstream, 0.0) > driver.now
            live = waiter.deadline > driver.now
            band = waiter.request.work_class
            fits = all(has_room(config, s, band, Load(state)) for s in waiter.scopes)
            assert cooling or not live or not fits, waiter


def single_scope_config(max_running: int, critical_share: float) -> Config:
    rest = (1.0 - critical_share) / 3
    classes = {
        "critical": ClassBand("critical", critical_share, 1000.0),
        "interactive": ClassBand("interactive", rest, 0.0),
        "background": ClassBand("background", rest, 1000.0),
        "bulk": ClassBand("bulk", rest, 1000.0),
    }
    return Config(
        upstreams={"u1": UpstreamSpec("u1", "http", url="http://127.0.0.1:9")},
        classes=classes,  # type: ignore[arg-type]
        limits={"global": Limits(max_running=max_running)},
    )


flood_arrival = st.tuples(
    st.just("arrive"), st.sampled_from(TENANTS), st.sampled_from(WORK_CLASSES)
)
flood = st.lists(
    st.one_of(
        flood_arrival,
        flood_arrival,  # twice as likely as the others, so queues build up
        st.tuples(st.just("finish"), st.integers(0, 30)),
        st.tuples(st.just("tick"), st.floats(0.01, 5.0)),
    ),
    min_size=20,
    max_size=100,
)


@PROPERTY_SETTINGS
@given(
    max_running=st.integers(2, 8),
    share=st.sampled_from([0.1, 0.25, 0.5]),
    ops=flood,
    flood_size=st.integers(0, 40),
)
def test_critical_calls_are_never_starved_by_other_bands(
    max_running: int, share: float, ops: list[Any], flood_size: int
) -> None:
    """Under any flood of other bands, critical starts at once within its reserve and is
    always the first to start when a slot frees while it waits."""
    config = single_scope_config(max_running, share)
    reserve = critical_reserve(config, max_running)
    driver = Driver(config)
    for i in range(flood_size):
        driver.arrive(
            AdmissionRequest(TENANTS[i % 3], "bulk" if i % 2 else "background", "u1", deadline=1e9)
        )
    for kind, *args in ops:
        if kind == "arrive":
            tenant, band = args
            critical_running = driver.book.state().running_by_class.get(("global", "critical"), 0)
            decision = driver.arrive(
                AdmissionRequest(tenant, band, "u1", deadline=driver.now + 1e6)
            )
            if band == "critical" and critical_running < reserve:
                assert isinstance(decision, Admit)
        elif kind == "finish":
            critical_waiting = any(
                w.request.work_class == "critical" for w in driver.book.waiters()
            )
            started = driver.finish(args[0])
            if critical_waiting and started:
                assert started[0].work_class == "critical"
            if critical_waiting:
                assert started or not driver.running
        else:
            driver.tick(args[0])


@dataclass
class RoundRobinWatch:
    """Records, per band, when each tenant began waiting and was last served."""

    events: int = 0
    waiting: dict[tuple[WorkClass, str], int] = field(default_factory=dict)
    since: dict[tuple[WorkClass, str], int] = field(default_factory=dict)
    last_served: dict[tuple[WorkClass, str], int] = field(default_factory=dict)

    def queued(self, request: AdmissionRequest) -> None:
        self.events += 1
        key = (request.work_class, request.tenant)
        self.waiting[key] = self.waiting.get(key, 0) + 1
        self.since.setdefault(key, self.events)

    def left(self, request: AdmissionRequest) -> None:
        key = (request.work_class, request.tenant)
        self.waiting[key] -= 1
        if not self.waiting[key]:
            del self.waiting[key], self.since[key]

    def served(self, request: AdmissionRequest, from_queue: bool) -> None:
        self.events += 1
        band, tenant = key = (request.work_class, request.tenant)
        previous = self.last_served.get(key)
        if previous is not None:
            for (other_band, other), began in self.since.items():
                starved = other_band == band and other != tenant and began < previous
                assert not starved, f"{tenant} served twice in {band} while {other} waited"
        self.last_served[key] = self.events
        if from_queue:
            self.left(request)
            if key in self.since:
                self.since[key] = self.events


@PROPERTY_SETTINGS
@given(max_running=st.integers(2, 6), ops=flood)
def test_no_tenant_is_served_twice_while_another_of_its_band_waits(
    max_running: int, ops: list[Any]
) -> None:
    """Inside a band, a waiting tenant is served before any other tenant is served again."""
    config = single_scope_config(max_running, 0.1)
    watch = RoundRobinWatch()
    driver = Driver(config, on_start=watch.served, on_withdraw=watch.left)
    for kind, *args in ops:
        if kind == "arrive":
            tenant, band = args
            request = AdmissionRequest(tenant, band, "u1", deadline=driver.now + 1e6)
            if isinstance(driver.arrive(request), Queue):
                watch.queued(request)
        elif kind == "finish":
            driver.finish(args[0])
        else:
            driver.tick(args[0])


many_tenant_arrival = st.tuples(
    st.just("arrive"),
    st.sampled_from([f"t{i}" for i in range(12)]),
    st.sampled_from(["background", "background", "bulk", "bulk", "critical"]),
    st.sampled_from(UPSTREAMS),
    st.sampled_from([None, "r1", "r2", "r3"]),
    st.sampled_from([None, "browser"]),
    st.floats(0.5, 100.0),
)
many_tenants = st.lists(
    st.one_of(
        *[many_tenant_arrival] * 4,  # arrivals dominate, so queues build up in several bands
        st.tuples(st.just("finish"), st.integers(0, 30)),
        st.tuples(st.just("finish"), st.integers(0, 30)),
        st.tuples(st.just("tick"), st.floats(0.01, 5.0)),
        st.tuples(st.just("cooldown"), st.sampled_from(UPSTREAMS), st.floats(0.1, 10.0)),
    ),
    min_size=40,
    max_size=150,
)


@st.composite
def crowded_configs(draw: st.DrawFn) -> Config:
    """Small limits and patient bands: queues form at almost every step."""

    def small(*counts: int | None) -> Limits:
        return Limits(max_running=draw(st.sampled_from(counts)))

    critical_share = draw(st.sampled_from([0.0, 0.1, 0.3]))
    rest = (1.0 - critical_share) / 3
    patience = st.sampled_from([4.0, 10.0, 60.0])  # short ones: calls age while others wait
    classes = {
        "critical": ClassBand("critical", critical_share, draw(patience)),
        "interactive": ClassBand("interactive", rest, 0.0),
        "background": ClassBand("background", draw(st.sampled_from([0.1, rest])), draw(patience)),
        "bulk": ClassBand("bulk", rest, draw(patience)),
    }
    upstreams = {
        name: UpstreamSpec(name, "http", url="http://127.0.0.1:9", limits=small(None, 1, 2, 3))
        for name in UPSTREAMS
    }
    return Config(
        upstreams=upstreams,
        classes=classes,  # type: ignore[arg-type]
        limits={
            "global": small(1, 2, 3, 5),
            "tenant": small(None, 1, 2, 3),
            "run": small(None, None, 1),
        },
        cost_classes={"browser": small(None, 1, 2)},
    )


@settings(max_examples=300, deadline=None)
@given(config=crowded_configs(), ops=many_tenants)
def test_the_book_starts_what_the_reference_engine_starts(config: Config, ops: list[Any]) -> None:
    """Many tenants, mostly one band (where the book may use its turn index), with and without
    critical and a second band (where it may not): every dispatch starts exactly the calls, in
    the order, that the engine over every queued call would (`Driver.dispatch` compares)."""
    driver = Driver(config)
    for operation in ops:
        driver.apply(operation)
    while driver.running:  # drain: every release dispatches, and is compared
        driver.finish(0)


def _critical_reserve_in_use() -> Config:
    """Global limited to 5, of which critical keeps 1 (30 %): with 4 calls of other bands running,
    a fifth one of theirs does not fit (the last slot is critical's)."""
    classes = {
        "critical": ClassBand("critical", 0.3, 30.0),
        "interactive": ClassBand("interactive", 0.3, 0.0),
        "background": ClassBand("background", 0.2, 30.0),
        "bulk": ClassBand("bulk", 0.2, 300.0),
    }
    upstreams = {name: UpstreamSpec(name, "http", url="http://127.0.0.1:9") for name in UPSTREAMS}
    return Config(
        upstreams=upstreams,
        classes=classes,  # type: ignore[arg-type]
        limits={"global": Limits(5, None, None)},
    )


@PROPERTY_SETTINGS
@given(
    config=configs(),
    tenant=st.sampled_from(TENANTS),
    band=st.sampled_from(WORK_CLASSES),
    upstream=st.sampled_from(UPSTREAMS),
    run_id=st.sampled_from([None, "r1"]),
    cost_class=st.sampled_from([None, "browser"]),
    running=st.lists(
        st.tuples(st.integers(0, 5), st.sampled_from(WORK_CLASSES), st.integers(0, 6)), max_size=8
    ),
)
@example(_critical_reserve_in_use(), "a", "interactive", "u1", None, None, [(0, "interactive", 4)])
def test_a_new_call_is_admitted_exactly_when_every_scope_has_room(
    config: Config,
    tenant: str,
    band: WorkClass,
    upstream: str,
    run_id: str | None,
    cost_class: str | None,
    running: list[tuple[int, WorkClass, int]],
) -> None:
    """`decide_entry` answers the common question (does a new call fit everywhere?) without a
    `Load`: its answer must be `has_room` of every scope, however the running calls are spread
    over the bands, critical's reserve included."""
    request = AdmissionRequest(tenant, band, upstream, run_id=run_id, cost_class=cost_class)
    scopes = scopes_for(config, request)
    counts: dict[str, int] = {}
    by_class: dict[tuple[str, WorkClass], int] = {}
    for index, other, count in running:  # each scope its own counts
        scope = scopes[index % len(scopes)]
        counts[scope.name] = counts.get(scope.name, 0) + count
        key = (scope.name, other)
        by_class[key] = by_class.get(key, 0) + count
    state = AdmissionState(running=counts, running_by_class=by_class)
    decision = decide_entry(config, state, request, 0.0, scopes=scopes)
    load = Load(state)
    room = all(has_room(config, scope, band, load) for scope in scopes)
    assert isinstance(decision, Admit) == room
