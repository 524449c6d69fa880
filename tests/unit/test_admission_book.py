"""The book's dispatch: the engine's choices, found through its index at a cost that does not
follow the number of calls waiting (distinct runs, distinct tenants, several bands).

Every dispatch here goes through `Desk.dispatch`, which also checks it against the engine over
every queued call (`select_starts`); the property tests do the same on random workloads.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from policies import admission_fairness, admission_search
from policies.admission import (
    AdmissionRequest,
    AdmissionState,
    Admit,
    Queue,
    Reject,
    decide_entry,
    scopes_for,
)
from policies.admission_book import AdmissionBook, Dispatched, Running
from policies.admission_fairness import select_starts
from policies.model import ClassBand, Config, Limits, UpstreamSpec, WorkClass
from tests.unit.test_admission_fairness import NOW, make_config
from tests.unit.test_admission_properties import Driver


class Desk:
    """A book with calls started and queued at chosen times (queued ones behind a full state)."""

    def __init__(self, config: Config) -> None:
        self.book = AdmissionBook(config)

    def running(
        self, tenant: str, band: WorkClass, count: int = 1, *, run_id: str | None = None
    ) -> list[Running]:
        started = []
        for _ in range(count):
            request = AdmissionRequest(tenant, band, "mail", run_id=run_id)
            admitted = decide_entry(self.book.config, AdmissionState(), request, NOW)
            assert isinstance(admitted, Admit)
            started.append(self.book.start(request, admitted.scopes, NOW))
        return started

    def queue(
        self,
        tenant: str,
        band: WorkClass = "background",
        *,
        upstream: str = "mail",
        run_id: str | None = None,
        at: float = NOW,
        deadline: float = NOW + 1000,
        accepted_at: float | None = None,
    ) -> int:
        """Queue a call (deferred work accepted at `accepted_at`, if given); its number."""
        request = AdmissionRequest(
            tenant,
            band,
            upstream,
            run_id=run_id,
            deadline=deadline,
            deferred=accepted_at is not None,
            waiting_since=accepted_at,
        )
        full = {scope.name: 10**9 for scope in scopes_for(self.book.config, request)}
        decision = decide_entry(self.book.config, AdmissionState(running=full), request, at)
        assert isinstance(decision, Queue)
        return self.book.enqueue(request, decision, at).seq

    def dispatch(self, now: float = NOW) -> Dispatched:
        """The book's dispatch, checked against the engine over every queued call."""
        expected = select_starts(self.book.config, self.book.state(), self.book.waiters(), now)
        result = self.book.dispatch(now)
        assert [w.seq for w, _ in result.started] == [w.seq for w in expected.starts]
        return result

    def starts(self, now: float = NOW) -> list[int]:
        return [w.seq for w, _ in self.dispatch(now).started]

    def one_by_one(self, releases: int) -> list[int]:
        """Start and finish one call at a time; the order (by arrival number) they started in."""
        order = []
        for _ in range(releases):
            started = self.dispatch().started
            assert len(started) == 1
            order.append(started[0][0].seq)
            self.book.finish(started[0][1], NOW)
        return order


@pytest.fixture
def judged(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times a queued call is judged for room (`fits`) and a scope's room is computed
    (`has_room`), as a one-element counter the test resets."""
    counter = [0]
    real_fits, real_has_room = admission_search.fits, admission_fairness.has_room

    def fits(*args: Any, **kwargs: Any) -> bool:
        counter[0] += 1
        return real_fits(*args, **kwargs)

    def has_room(*args: Any, **kwargs: Any) -> bool:
        counter[0] += 1
        return real_has_room(*args, **kwargs)

    monkeypatch.setattr(admission_search, "fits", fits)
    monkeypatch.setattr(admission_fairness, "has_room", has_room)
    return counter


def test_a_release_with_thousands_of_runs_waiting_judges_a_few_calls(judged: list[int]) -> None:
    """2,000 calls of distinct agent runs of one tenant wait (runs unlimited): they share one
    queue, so a release judges a handful of calls, and still starts the oldest."""
    desk = Desk(make_config(1))
    queued = [desk.queue("acme", run_id=f"r{i}") for i in range(2000)]
    for expected in queued[:3]:
        judged[0] = 0
        started = desk.book.dispatch(NOW).started
        assert [w.seq for w, _ in started] == [expected]
        assert judged[0] <= 20, judged[0]
        desk.book.finish(started[0][1], NOW)


def test_a_release_with_thousands_of_tenants_waiting_judges_a_few_calls(
    judged: list[int],
) -> None:
    """2,000 tenants wait behind an upstream limited to 4 (each tenant limited to 2): a release
    starts the tenant whose turn it is after a handful of judgements, not one per tenant."""
    limited = UpstreamSpec("mail", "mcp_http", url="http://127.0.0.1:9", limits=Limits(4))
    desk = Desk(Config(upstreams={"mail": limited}, limits={"tenant": Limits(max_running=2)}))
    running = [run for i in range(4) for run in desk.running(f"busy{i}", "background")]
    queued = [desk.queue(f"t{i}") for i in range(2000)]
    for expected in queued[:3]:
        judged[0] = 0
        desk.book.finish(running.pop(0), NOW)
        started = desk.book.dispatch(NOW).started
        assert [w.seq for w, _ in started] == [expected]
        assert judged[0] <= 20, judged[0]
        running.append(started[0][1])


def test_a_release_with_two_bands_of_thousands_of_tenants_judges_a_few_calls(
    judged: list[int],
) -> None:
    """The same with one call in sixteen of band bulk: choosing between the bands (ageing,
    shares) does not read every tenant's queue either. (58 background calls run: all of 64 but
    critical's reserve.)"""
    desk = Desk(make_config(64, tenant=Limits(max_running=4)))
    running = [run for i in range(58) for run in desk.running(f"busy{i}", "background")]
    for i in range(2000):
        desk.queue(f"t{i}", "bulk" if i % 16 == 0 else "background")
    for _ in range(3):
        judged[0] = 0
        desk.book.finish(running.pop(0), NOW)
        started = desk.book.dispatch(NOW).started
        assert len(started) == 1
        assert judged[0] <= 40, judged[0]
        running.append(started[0][1])


def test_a_release_with_thousands_of_tenants_at_their_own_limit_judges_a_few_calls(
    judged: list[int],
) -> None:
    """2,000 tenants each run their one allowed call and wait with another (no global limit):
    when one tenant's call ends, its next call starts after a handful of judgements; the
    others, ahead of it in turn order, are not judged again until one of their calls ends."""
    desk = Desk(make_config(10**6, tenant=Limits(max_running=1)))
    running = [run for i in range(2000) for run in desk.running(f"t{i}", "background")]
    queued = [desk.queue(f"t{i}") for i in range(2000)]
    assert desk.book.dispatch(NOW).started == []  # each tenant is at its own limit
    for k in (1500, 7, 1999):
        judged[0] = 0
        desk.book.finish(running[k], NOW)
        started = desk.book.dispatch(NOW).started
        assert [w.seq for w, _ in started] == [queued[k]]
        assert judged[0] <= 20, judged[0]


def test_two_bands_of_thousands_of_tenants_at_their_own_limit_judge_a_few_calls(
    judged: list[int],
) -> None:
    """The same in two bands (one waiting call in sixteen is bulk): when a background tenant's
    call and a bulk tenant's call end together, choosing between the bands reads neither band's
    tenants at their limit again."""
    desk = Desk(make_config(10**6, tenant=Limits(max_running=1)))
    running = [run for i in range(2000) for run in desk.running(f"t{i}", "background")]
    queued = [desk.queue(f"t{i}", "bulk" if i % 16 == 0 else "background") for i in range(2000)]
    assert desk.book.dispatch(NOW).started == []
    for background, bulk in ((1501, 1504), (7, 32), (1999, 0)):
        judged[0] = 0
        desk.book.finish(running[background], NOW)
        desk.book.finish(running[bulk], NOW)
        started = desk.book.dispatch(NOW).started
        assert sorted(w.seq for w, _ in started) == sorted([queued[background], queued[bulk]])
        assert judged[0] <= 40, judged[0]


def test_runs_of_two_tenants_still_alternate() -> None:
    """Distinct runs share a queue only within one tenant: tenants still take turns."""
    desk = Desk(make_config(1))
    a1, a2, a3 = (desk.queue("a", run_id=f"r{i}") for i in (1, 2, 3))
    b = desk.queue("b", run_id="r4")
    assert desk.one_by_one(4) == [a1, b, a2, a3]


def test_a_limited_run_does_not_hold_up_another_run() -> None:
    """With runs limited to one call each, a waiting call of a busy run does not block a later
    call of an idle run: limited scopes keep their own queues."""
    config = Config(
        upstreams={"mail": UpstreamSpec("mail", "mcp_http", url="http://127.0.0.1:9")},
        limits={"global": Limits(max_running=2), "run": Limits(max_running=1)},
    )
    desk = Desk(config)
    desk.running("acme", "background", run_id="r1")
    (other,) = desk.running("acme", "background", run_id="r0")
    desk.queue("acme", run_id="r1")
    idle_run = desk.queue("acme", run_id="r2")
    assert desk.starts() == []
    desk.book.finish(other, NOW)
    assert desk.starts() == [idle_run]


def test_a_tenant_with_calls_to_two_upstreams_gets_its_oldest_first() -> None:
    """Tenant a waits on files, then on mail: its turn starts the files call (the older)."""
    desk = Desk(make_config(1))
    files, mail = desk.queue("a", upstream="files"), desk.queue("a", upstream="mail")
    assert desk.one_by_one(2) == [files, mail]


def test_turns_decide_across_upstreams() -> None:
    """b waits twice on files, a once on mail (after b's first): b, then a, then b again,
    although files's queue came first."""
    desk = Desk(make_config(1))
    b1 = desk.queue("b", upstream="files")
    a = desk.queue("a", upstream="mail")
    b2 = desk.queue("b", upstream="files")
    assert desk.one_by_one(3) == [b1, a, b2]


def test_a_dispatch_refuses_the_expired_calls_it_meets() -> None:
    """A call whose wait ran out ahead of a live one in the same queue is refused (deadline) by
    the dispatch that starts the live one."""
    desk = Desk(make_config(1))
    expired = desk.queue("a", deadline=NOW + 5)
    live = desk.queue("a", deadline=NOW + 100)
    result = desk.dispatch(NOW + 10)
    assert [(w.seq, r.reason) for w, r in result.expired] == [(expired, "deadline")]
    assert [w.seq for w, _ in result.started] == [live]
    assert not any(True for _ in desk.book.waiters())


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
    assert desk.one_by_one(3) == [first, second, fresh]


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


@pytest.mark.parametrize("seed", range(4))
def test_a_long_random_workload_dispatches_as_the_engine_does(seed: int) -> None:
    """Thousands of steps (hypothesis's cases stay short): up to 200 tenants, live and deferred
    work (accepted up to 50 s earlier), limited runs, cost classes, cooldowns; every dispatch is
    compared with the engine's by the property driver."""
    rng = random.Random(seed)

    def limits(*counts: int | None) -> Limits:
        return Limits(max_running=rng.choice(counts))

    def patience() -> float:
        return rng.choice([4.0, 10.0, 60.0])

    rest = (1.0 - (critical := rng.choice([0.0, 0.1, 0.3]))) / 3
    config = Config(
        upstreams={
            u: UpstreamSpec(u, "http", url="http://127.0.0.1:9", limits=limits(None, 1, 3, 8))
            for u in ("u1", "u2", "u3")
        },
        classes={  # type: ignore[arg-type]
            "critical": ClassBand("critical", critical, patience()),
            "interactive": ClassBand("interactive", rest, rng.choice([0.0, 5.0])),
            "background": ClassBand("background", rng.choice([0.1, rest]), patience()),
            "bulk": ClassBand("bulk", rest, patience()),
        },
        limits={
            "global": limits(2, 5, 16, 40),
            "tenant": limits(None, 1, 2, 4),
            "run": limits(None, 1, 2),
        },
        cost_classes={"browser": limits(None, 1, 3)},
    )
    driver = Driver(config)
    tenants = [f"t{i}" for i in range(rng.choice([3, 30, 200]))]
    bands: list[WorkClass] = ["background", "background", "bulk", "critical", "interactive"]
    for _ in range(3000):
        draw = rng.random()
        if draw < 0.55:
            deferred = rng.random() < 0.2
            request = AdmissionRequest(
                rng.choice(tenants),
                rng.choice(bands),
                rng.choice(["u1", "u2", "u3"]),
                rng.choice([None, "r1", f"r{rng.randrange(100)}"]),
                rng.choice([None, "browser"]),
                deadline=driver.now + rng.uniform(0.5, 100.0),
                deferred=deferred,
                waiting_since=driver.now - rng.uniform(0.0, 50.0) if deferred else None,
            )
            driver.arrive(request)
        elif draw < 0.9:
            driver.finish(rng.randrange(100))
        elif draw < 0.98:
            driver.tick(rng.uniform(0.01, 3.0))
        else:
            driver.cooldown(rng.choice(["u1", "u2", "u3"]), rng.uniform(0.1, 5.0))
    while driver.running:
        driver.finish(0)


def test_a_stopped_book_refuses_what_it_admitted_a_moment_before() -> None:
    """The book's view of its state follows `stop` (it is built once, not per decision)."""
    book = AdmissionBook(make_config(4))
    call = AdmissionRequest("acme", "interactive", "mail")
    assert isinstance(book.decide(call, NOW), Admit)
    book.stop()
    refused = book.decide(call, NOW)
    assert isinstance(refused, Reject)
    assert refused.refusal.reason == "shutting_down"
    assert book.state().stopping


def test_a_full_queue_of_a_scope_without_a_running_limit_estimates_from_its_own_calls() -> None:
    """Service times are kept only where an estimate can be asked: a scope with a running limit
    or a queue bound. A tenant bounded by its queue alone still answers from its calls' times."""
    config = make_config(1, tenant=Limits(max_pending=1))
    book = AdmissionBook(config)
    call = AdmissionRequest("acme", "background", "mail", deadline=NOW + 1000)
    first = book.decide(call, NOW)
    assert isinstance(first, Admit)
    book.finish(book.start(call, first.scopes, NOW), NOW + 4.0)  # a 4 s call of acme
    running = book.decide(call, NOW + 5)
    assert isinstance(running, Admit)
    book.start(call, running.scopes, NOW + 5)  # global (1 running) is full now
    waiting = book.decide(call, NOW + 5)
    assert isinstance(waiting, Queue)
    book.enqueue(call, waiting, NOW + 5)
    refused = book.decide(call, NOW + 5)  # acme's queue holds its one call
    assert isinstance(refused, Reject)
    assert refused.refusal.scope == "tenant:acme"
    assert refused.refusal.retry_after_s == pytest.approx((1 + 1) * 4.0 / 1)
