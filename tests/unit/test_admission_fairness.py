"""Who may start now: critical first, ageing, shares between bands, round-robin between tenants."""

from __future__ import annotations

from collections import Counter
from itertools import count
from typing import Any

from policies import admission_book, admission_fairness
from policies.admission import (
    AdmissionRequest,
    AdmissionState,
    Admit,
    Queue,
    Waiter,
    decide_entry,
)
from policies.admission_book import AdmissionBook, Running
from policies.admission_fairness import select_starts
from policies.model import ClassBand, Config, Limits, UpstreamSpec, WorkClass

NOW = 1000.0


def make_config(
    global_running: int, *, tenant: Limits | None = None, bulk_wait: float = 300.0
) -> Config:
    classes = {
        "critical": ClassBand("critical", 0.10, 30.0),
        "interactive": ClassBand("interactive", 0.60, 10.0),
        "background": ClassBand("background", 0.25, 30.0),
        "bulk": ClassBand("bulk", 0.05, bulk_wait),
    }
    return Config(
        upstreams={
            "mail": UpstreamSpec("mail", "mcp_http", url="http://127.0.0.1:9"),
            "files": UpstreamSpec("files", "mcp_http", url="http://127.0.0.1:9"),
        },
        classes=classes,  # type: ignore[arg-type]
        limits={"global": Limits(max_running=global_running), "tenant": tenant or Limits()},
    )


class Queued:
    """Builds waiters the way the book would, with increasing arrival numbers."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.seq = count(1)

    def __call__(
        self,
        work_class: WorkClass,
        tenant: str = "acme",
        *,
        at: float = NOW,
        upstream: str = "mail",
    ) -> Waiter:
        request = AdmissionRequest(tenant, work_class, upstream, deadline=at + 1000)
        full = AdmissionState(running={"global": 10**6})
        decision = decide_entry(self.config, full, request, at)
        assert isinstance(decision, Queue)
        return Waiter(
            next(self.seq), request, decision.scopes, at, decision.deadline, decision.lift_at
        )


def busy(running: int, band: WorkClass = "background") -> AdmissionState:
    """A state where `running` calls of `band` run in the global scope."""
    return AdmissionState(running={"global": running}, running_by_class={("global", band): running})


def test_critical_starts_first_even_when_it_came_last() -> None:
    """One slot frees: the critical waiter takes it, however many others waited before it."""
    config = make_config(10)
    queued = Queued(config)
    waiters = [queued("background") for _ in range(5)] + [queued("critical")]
    result = select_starts(config, busy(9), waiters, NOW)
    assert [w.request.work_class for w in result.starts] == ["critical"]


def test_other_bands_never_take_the_critical_reserve() -> None:
    """With only the reserved slot free, non-critical waiters stay queued."""
    config = make_config(10)
    queued = Queued(config)
    result = select_starts(config, busy(9), [queued("background"), queued("bulk")], NOW)
    assert result.starts == ()


def test_round_robin_between_tenants_inside_a_band() -> None:
    """Tenant A queued three calls before B's one: the order is A, B, A, A."""
    config = make_config(1)  # one slot (a scope this small keeps no critical reserve)
    book = AdmissionBook(config)
    for tenant in ("a", "a", "a", "b"):
        request = AdmissionRequest(tenant, "background", "mail", deadline=NOW + 100)
        decision = decide_entry(config, busy(10**6), request, NOW)
        assert isinstance(decision, Queue)
        book.enqueue(request, decision, NOW)
    order = []
    for _ in range(4):
        started = book.dispatch(NOW).started
        assert len(started) == 1
        order.append(started[0][0].request.tenant)
        assert book.dispatch(NOW).started == []
        book.finish(started[0][1], NOW)
    assert order == ["a", "b", "a", "a"]


def test_shares_weight_bands_against_each_other() -> None:
    """90 free non-critical slots: background (25 %) gets about 5× the slots of bulk (5 %)."""
    config = make_config(100)
    queued = Queued(config)
    waiters = [queued("background", f"t{i}") for i in range(100)]
    waiters += [queued("bulk", f"t{i}") for i in range(100)]
    result = select_starts(config, AdmissionState(), waiters, NOW)
    counts = Counter(w.request.work_class for w in result.starts)
    assert counts["background"] + counts["bulk"] == 90
    assert abs(counts["background"] - 75) <= 1
    assert abs(counts["bulk"] - 15) <= 1


def test_work_conserving_a_lone_band_uses_all_idle_capacity() -> None:
    """With nobody else waiting, bulk takes every slot except critical's reserve."""
    config = make_config(10)
    queued = Queued(config)
    result = select_starts(
        config, AdmissionState(), [queued("bulk", f"t{i}") for i in range(20)], NOW
    )
    assert len(result.starts) == 9


def test_ageing_lifts_a_band_past_its_patience() -> None:
    """A bulk call that waited past half its patience goes before a fresher background call."""
    config = make_config(10, bulk_wait=20.0)
    queued = Queued(config)
    old_bulk = queued("bulk", "b", at=NOW - 15)
    fresh = queued("background", "a", at=NOW - 1)
    bulk_heavy = busy(8, "bulk")  # by shares alone, background would go next
    result = select_starts(config, bulk_heavy, [fresh, old_bulk], NOW)
    assert [w.request.work_class for w in result.starts] == ["bulk"]
    young_bulk = queued("bulk", "b", at=NOW - 5)
    result = select_starts(config, bulk_heavy, [young_bulk, fresh], NOW)
    assert [w.request.work_class for w in result.starts] == ["background"]


def test_only_calls_that_fit_are_started() -> None:
    """A tenant at its own limit is skipped; another tenant's call takes the slot."""
    config = make_config(10, tenant=Limits(max_running=1))
    queued = Queued(config)
    state = AdmissionState(
        running={"global": 1, "tenant:a": 1},
        running_by_class={("global", "background"): 1, ("tenant:a", "background"): 1},
    )
    result = select_starts(
        config, state, [queued("background", "a"), queued("background", "b")], NOW
    )
    assert [w.request.tenant for w in result.starts] == ["b"]


def test_expired_waiters_are_refused_and_cooling_upstreams_wait() -> None:
    """A waiter past its deadline is refused; one for a cooling upstream does not start."""
    config = make_config(10)
    queued = Queued(config)
    expired = queued("background", at=NOW - 100)
    cooling = queued("background", upstream="files")
    ready = queued("background")
    state = AdmissionState(cooldown_until={"files": NOW + 5})
    result = select_starts(config, state, [expired, cooling, ready], NOW - 100 + 31)
    assert [w.seq for w, _ in result.expired] == [expired.seq]
    assert result.expired[0][1].reason == "deadline"
    assert [w.seq for w in result.starts] == [ready.seq]


def test_a_waiting_deferred_call_is_not_started_into_the_live_reserve() -> None:
    """A slot frees in a scope of 10 with 3 bulk calls running and interactive calls unable to
    wait: the waiting live bulk call starts, the waiting deferred one (same band, same scopes)
    does not, since interactive's share (6) and critical's reserve (1) stay free of it."""
    bands = {
        "critical": ClassBand("critical", 0.10, 30.0),
        "interactive": ClassBand("interactive", 0.60, 0.0),
        "background": ClassBand("background", 0.25, 30.0),
        "bulk": ClassBand("bulk", 0.05, 300.0),
    }
    config = Config(
        upstreams={"mail": UpstreamSpec("mail", "mcp_http", url="http://127.0.0.1:9")},
        classes=bands,  # type: ignore[arg-type]
        limits={"global": Limits(max_running=10)},
    )
    state = AdmissionState(
        running={"global": 3},
        running_by_class={("global", "bulk"): 3},  # type: ignore[dict-item]
    )
    waiters = []
    for seq, deferred in ((1, True), (2, False)):
        request = AdmissionRequest("acme", "bulk", "mail", deadline=NOW + 1000, deferred=deferred)
        decision = decide_entry(config, AdmissionState(running={"global": 10}), request, NOW)
        assert isinstance(decision, Queue)
        waiters.append(
            Waiter(seq, request, decision.scopes, NOW, decision.deadline, decision.lift_at)
        )
    starts = select_starts(config, state, waiters, NOW).starts
    assert [w.seq for w in starts] == [2]


def _queue_runs(book: AdmissionBook, config: Config, runs: list[tuple[str, str]]) -> None:
    """Queue one background call per (tenant, run id) behind a full global scope."""
    for tenant, run in runs:
        request = AdmissionRequest(tenant, "background", "mail", run_id=run, deadline=NOW + 100)
        decision = decide_entry(config, busy(10**6), request, NOW)
        assert isinstance(decision, Queue)
        book.enqueue(request, decision, NOW)


def test_a_release_looks_at_queue_heads_per_tenant_not_per_run(monkeypatch: Any) -> None:
    """2,000 calls of distinct agent runs wait (runs unlimited): each release examines a few
    queue heads, not one per run, and still starts the oldest call first."""
    config = make_config(1)
    book = AdmissionBook(config)
    _queue_runs(book, config, [("acme", f"r{i}") for i in range(2000)])
    examined = 0
    real_next_live = admission_fairness._next_live

    def counting(rest: Any, *args: Any) -> Any:
        nonlocal examined
        examined += 1
        return real_next_live(rest, *args)

    monkeypatch.setattr(admission_fairness, "_next_live", counting)
    order = []
    for _ in range(3):
        examined = 0
        started = book.dispatch(NOW).started
        assert [w.request.run_id for w, _ in started] == [f"r{len(order)}"]
        assert examined <= 2, examined
        order.append(started[0][0].request.run_id)
        book.finish(started[0][1], NOW)


def test_runs_of_two_tenants_still_alternate() -> None:
    """Distinct runs share a queue only within one tenant: tenants still take turns."""
    config = make_config(1)
    book = AdmissionBook(config)
    _queue_runs(book, config, [("a", "r1"), ("a", "r2"), ("a", "r3"), ("b", "r4")])
    order = []
    for _ in range(4):
        started = book.dispatch(NOW).started
        order.append(started[0][0].request.run_id)
        book.finish(started[0][1], NOW)
    assert order == ["r1", "r4", "r2", "r3"]


def test_a_limited_run_does_not_hold_up_another_run() -> None:
    """With runs limited to one call each, a waiting call of a busy run does not block a later
    call of an idle run: limited scopes keep their own queues."""
    config = Config(
        upstreams={"mail": UpstreamSpec("mail", "mcp_http", url="http://127.0.0.1:9")},
        limits={"global": Limits(max_running=2), "run": Limits(max_running=1)},
    )
    book = AdmissionBook(config)
    busy_run = AdmissionRequest("acme", "background", "mail", run_id="r1", deadline=NOW + 100)
    admitted = book.decide(busy_run, NOW)
    assert isinstance(admitted, Admit)
    book.start(busy_run, admitted.scopes, NOW)
    book.start(
        AdmissionRequest("acme", "background", "mail", run_id="r0"), admitted.scopes[:2], NOW
    )
    _queue_runs(book, config, [("acme", "r1"), ("acme", "r2")])
    running = book.dispatch(NOW).started
    assert running == []
    other = AdmissionRequest("acme", "background", "mail", run_id="r0")
    book.finish(Running(other, admitted.scopes[:2], NOW), NOW)
    started = book.dispatch(NOW).started
    assert [w.request.run_id for w, _ in started] == ["r2"]


def test_a_release_with_thousands_of_tenants_waiting_checks_room_a_few_times(
    monkeypatch: Any,
) -> None:
    """2,000 tenants wait behind an upstream limited to 4 (each tenant limited to 2): a release
    starts the tenant whose turn it is with a handful of room checks, not one per tenant."""
    config = Config(
        upstreams={
            "mail": UpstreamSpec(
                "mail", "mcp_http", url="http://127.0.0.1:9", limits=Limits(max_running=4)
            )
        },
        limits={"tenant": Limits(max_running=2)},
    )
    book = AdmissionBook(config)
    running = []
    for i in range(4):
        request = AdmissionRequest(f"busy{i}", "background", "mail", deadline=NOW + 100)
        admitted = book.decide(request, NOW)
        assert isinstance(admitted, Admit)
        running.append(book.start(request, admitted.scopes, NOW))
    for i in range(2000):
        request = AdmissionRequest(f"t{i}", "background", "mail", deadline=NOW + 100)
        decision = book.decide(request, NOW)
        assert isinstance(decision, Queue)
        book.enqueue(request, decision, NOW)
    checks = 0
    real_has_room = admission_fairness.has_room

    def counting(*args: Any, **kwargs: Any) -> bool:
        nonlocal checks
        checks += 1
        return real_has_room(*args, **kwargs)

    for module in (admission_fairness, admission_book):
        monkeypatch.setattr(module, "has_room", counting, raising=False)
    for expected in ("t0", "t1", "t2"):
        checks = 0
        book.finish(running.pop(0), NOW)
        started = book.dispatch(NOW).started
        assert [w.request.tenant for w, _ in started] == [expected]
        assert checks <= 20, checks
        running.append(started[0][1])


def _serve_one_at_a_time(book: AdmissionBook, calls: list[tuple[str, str]]) -> list[int]:
    """Queue (tenant, upstream) background calls behind a full global scope of 1, then release
    that slot call by call; the order in which the queued calls (by arrival number) started."""
    config = book.config
    for tenant, upstream in calls:
        request = AdmissionRequest(tenant, "background", upstream, deadline=NOW + 100)
        decision = decide_entry(config, busy(10**6), request, NOW)
        assert isinstance(decision, Queue)
        book.enqueue(request, decision, NOW)
    order = []
    for _ in calls:
        started = book.dispatch(NOW).started
        assert len(started) == 1
        order.append(started[0][0].seq)
        book.finish(started[0][1], NOW)
    return order


def test_a_tenant_with_calls_to_two_upstreams_gets_its_oldest_first() -> None:
    """Tenant a waits on files, then on mail: its turn starts the files call (the older)."""
    book = AdmissionBook(make_config(1))
    assert _serve_one_at_a_time(book, [("a", "files"), ("a", "mail")]) == [1, 2]


def test_turns_decide_across_upstreams() -> None:
    """b waits twice on files, a once on mail (after b's first): b, then a, then b again,
    although files's queue came first."""
    book = AdmissionBook(make_config(1))
    assert _serve_one_at_a_time(book, [("b", "files"), ("a", "mail"), ("b", "files")]) == [1, 2, 3]


def test_a_dispatch_refuses_the_expired_calls_it_meets() -> None:
    """A call whose wait ran out ahead of a live one in the same queue is refused (deadline) by
    the dispatch that starts the live one."""
    book = AdmissionBook(make_config(1))
    for deadline in (NOW + 5, NOW + 100):
        request = AdmissionRequest("a", "background", "mail", deadline=deadline)
        decision = decide_entry(book.config, busy(10**6), request, NOW)
        assert isinstance(decision, Queue)
        book.enqueue(request, decision, NOW)
    result = book.dispatch(NOW + 10)
    assert [(w.seq, r.reason) for w, r in result.expired] == [(1, "deadline")]
    assert [w.seq for w, _ in result.started] == [2]
    assert not any(True for _ in book.waiters())


class Desk:
    """A book with calls started and queued at chosen times (queued ones behind a full state)."""

    def __init__(self, config: Config) -> None:
        self.book = AdmissionBook(config)

    def running(self, tenant: str, band: WorkClass, count: int = 1) -> None:
        for _ in range(count):
            request = AdmissionRequest(tenant, band, "mail")
            scopes = decide_entry(self.book.config, AdmissionState(), request, NOW)
            assert isinstance(scopes, Admit)
            self.book.start(request, scopes.scopes, NOW)

    def queue(
        self,
        tenant: str,
        band: WorkClass,
        *,
        at: float = NOW,
        deadline: float = NOW + 1000,
        accepted_at: float | None = None,
    ) -> int:
        """Queue a call (deferred work accepted at `accepted_at`, if given); its number."""
        request = AdmissionRequest(
            tenant,
            band,
            "mail",
            deadline=deadline,
            deferred=accepted_at is not None,
            waiting_since=accepted_at,
        )
        decision = decide_entry(self.book.config, busy(10**6), request, at)
        assert isinstance(decision, Queue)
        return self.book.enqueue(request, decision, at).seq

    def dispatch(self, now: float = NOW) -> Any:
        """The book's dispatch, checked against the engine over every queued call."""
        expected = select_starts(self.book.config, self.book.state(), self.book.waiters(), now)
        result = self.book.dispatch(now)
        assert [w.seq for w, _ in result.started] == [w.seq for w in expected.starts]
        return result

    def starts(self, now: float = NOW) -> list[int]:
        return [w.seq for w, _ in self.dispatch(now).started]


def test_a_lifted_call_that_does_not_fit_does_not_lift_its_band() -> None:
    """x's old bulk call waits on x's own limit; y's fresh bulk call and a's fresh background
    call fit: shares decide (background), not x's age."""
    desk = Desk(make_config(10, tenant=Limits(max_running=1), bulk_wait=20.0))
    desk.running("x", "bulk")
    desk.queue("x", "bulk", at=NOW - 15)  # lifted at NOW - 5, but x is at its limit
    desk.queue("y", "bulk", at=NOW - 1)
    background = desk.queue("a", "background", at=NOW - 1)
    assert desk.starts()[0] == background


def test_the_next_call_of_a_queue_keeps_its_age() -> None:
    """b's two old bulk calls go before a's fresh background call (ageing), one per release:
    the second is the queue's head only once the first has left."""
    desk = Desk(make_config(1, bulk_wait=20.0))
    first = desk.queue("b", "bulk", at=NOW - 15)
    second = desk.queue("b", "bulk", at=NOW - 15)
    fresh = desk.queue("a", "background", at=NOW - 1)
    order = []
    for _ in range(3):
        started = desk.dispatch().started
        order.append(started[0][0].seq)
        desk.book.finish(started[0][1], NOW)
    assert order == [first, second, fresh]


def test_an_expired_head_does_not_hide_the_age_of_the_call_behind_it() -> None:
    """b's first bulk call expired, its second is lifted: the second starts (ageing) ahead of
    a's fresh background call, and the first is refused."""
    desk = Desk(make_config(1, bulk_wait=20.0))
    expired = desk.queue("b", "bulk", at=NOW - 15, deadline=NOW - 1)
    lifted = desk.queue("b", "bulk", at=NOW - 15)
    desk.queue("a", "background", at=NOW - 1)
    result = desk.dispatch()
    assert [w.seq for w, _ in result.started] == [lifted]
    assert [w.seq for w, _ in result.expired] == [expired]


def test_usage_is_the_best_placed_call_of_a_band() -> None:
    """Bulk: p runs one call, q none; background: r runs six (tenants limited to 10). Bulk's
    best-placed call (q's) is further below its share than background's, so bulk goes next
    (p's call: p's turn comes first)."""
    desk = Desk(make_config(100, tenant=Limits(max_running=10)))
    desk.running("p", "bulk")
    desk.running("r", "background", count=6)
    p_call = desk.queue("p", "bulk")
    desk.queue("q", "bulk")
    desk.queue("r", "background")
    assert desk.starts()[:1] == [p_call]


def test_deferred_work_accepted_earlier_behind_a_younger_head_keeps_its_age() -> None:
    """Deferred bulk work of b: the queue's head was accepted a second ago, the call behind it
    fifteen seconds ago (lifted). Once the head is withdrawn, the old one goes before a's fresh
    background call."""
    desk = Desk(make_config(1, bulk_wait=20.0))
    young = desk.queue("b", "bulk", accepted_at=NOW - 1)
    old = desk.queue("b", "bulk", accepted_at=NOW - 15)
    desk.queue("a", "background", at=NOW - 1)
    waiter = next(w for w in desk.book.waiters() if w.seq == young)
    assert desk.book.withdraw(waiter)
    assert desk.starts() == [old]
