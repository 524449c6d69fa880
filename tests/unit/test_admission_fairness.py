"""Who may start now: critical first, ageing, shares between bands, round-robin between tenants."""

from __future__ import annotations

from collections import Counter
from itertools import count

from policies.admission import AdmissionRequest, AdmissionState, Queue, Waiter, decide_entry
from policies.admission_book import AdmissionBook
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
