"""Admission entry decisions: scopes, limits, critical reserve, patience, cooldowns, retry_after."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from policies.admission import (
    AdmissionRequest,
    AdmissionState,
    Admit,
    Queue,
    Refusal,
    Reject,
    ScopeCache,
    WaitCooldown,
    Waiter,
    critical_reserve,
    deadline_refusal,
    decide_entry,
    scopes_for,
)
from policies.model import ClassBand, Config, Limits, UpstreamSpec, WorkClass

NOW = 100.0
NO_LIMITS = Limits()


def make_config(
    *,
    global_limits: Limits = NO_LIMITS,
    tenant: Limits = NO_LIMITS,
    run: Limits = NO_LIMITS,
    upstream: Limits = NO_LIMITS,
    cost_classes: dict[str, Limits] | None = None,
    cap: float = 300.0,
    critical_share: float = 0.10,
) -> Config:
    classes = {
        "critical": ClassBand("critical", critical_share, 30.0),
        "interactive": ClassBand("interactive", 0.60, 0.0),
        "background": ClassBand("background", 0.25, 30.0),
        "bulk": ClassBand("bulk", 0.05, 300.0),
    }
    return Config(
        upstreams={
            "mail": UpstreamSpec("mail", "mcp_http", url="http://127.0.0.1:9", limits=upstream)
        },
        classes=classes,  # type: ignore[arg-type]
        limits={"global": global_limits, "tenant": tenant, "run": run},
        cost_classes=cost_classes or {},
        retry_after_cap_s=cap,
    )


def request(work_class: WorkClass = "background", **fields: Any) -> AdmissionRequest:
    return AdmissionRequest(
        tenant=fields.pop("tenant", "acme"),
        work_class=work_class,
        upstream=fields.pop("upstream", "mail"),
        deadline=fields.pop("deadline", NOW + 60.0),
        **fields,
    )


def running(scope: str, count: int, critical: int = 0) -> AdmissionState:
    """A state where `scope` runs `count` calls: `critical` critical ones, the rest background."""
    by_class = {(scope, "critical"): critical, (scope, "background"): count - critical}
    return AdmissionState(running={scope: count}, running_by_class=by_class)  # type: ignore[arg-type]


def test_scopes_cover_every_level_the_call_touches() -> None:
    """Global, tenant, run, upstream, a configured cost class, and the class band, in that order."""
    config = make_config(cost_classes={"browser": Limits(max_running=2)})
    names = [s.name for s in scopes_for(config, request(run_id="r1", cost_class="browser"))]
    assert names == [
        "global",
        "tenant:acme",
        "run:r1",
        "upstream:mail",
        "cost_class:browser",
        "class:background",
    ]
    unconfigured = [s.name for s in scopes_for(config, request(cost_class="gpu"))]
    assert unconfigured == ["global", "tenant:acme", "upstream:mail", "class:background"]


def test_the_scope_cache_gives_each_call_shape_its_own_scopes() -> None:
    """Calls that differ in any field scopes depend on (tenant, run, upstream, cost class, band)
    never share an entry; a repeated shape gets the very tuple `scopes_for` built the first time."""
    config = make_config(cost_classes={"browser": Limits(max_running=2)})
    files = UpstreamSpec(
        "files", "mcp_http", url="http://127.0.0.1:9", limits=Limits(max_running=3)
    )
    config = replace(config, upstreams={**config.upstreams, "files": files})
    cache = ScopeCache(config)
    shapes = [
        request(),
        request(tenant="globex"),
        request(run_id="r1"),
        request(run_id="r2"),
        request(upstream="files"),
        request(cost_class="browser"),
        request("critical"),
        request("critical", tenant="globex", run_id="r1", cost_class="browser"),
    ]
    for shape in shapes:
        assert cache(shape) == scopes_for(config, shape)
    again = request(run_id="r1", deadline=NOW + 5.0, tool="other", side_effect=False)
    assert cache(again) is cache(request(run_id="r1"))
    assert cache(again) == scopes_for(config, again)


def test_the_scope_cache_stays_bounded() -> None:
    """One tenant or run id per call cannot grow the cache without bound; it still answers right."""
    config = make_config()
    cache = ScopeCache(config, max_shapes=8)
    for n in range(50):
        shape = request(tenant=f"t{n}", run_id=f"r{n}")
        assert cache(shape) == scopes_for(config, shape)
        assert len(cache) <= 8


def test_decide_entry_uses_the_scopes_it_is_given() -> None:
    """A caller that already holds the call's scopes (the book's cache) passes them in."""
    config = make_config(global_limits=Limits(max_running=1))
    scopes = scopes_for(config, request())
    decision = decide_entry(config, AdmissionState(), request(), NOW, scopes=scopes)
    assert isinstance(decision, Admit)
    assert decision.scopes is scopes
    full = decide_entry(config, running("global", 1), request(), NOW, scopes=scopes)
    assert isinstance(full, Queue)
    assert full.scopes is scopes


def test_admits_when_every_scope_has_room() -> None:
    """A call that fits everywhere starts at once."""
    config = make_config(global_limits=Limits(max_running=10))
    decision = decide_entry(config, running("global", 5), request(), NOW)
    assert isinstance(decision, Admit)


@pytest.mark.parametrize(
    ("max_running", "share", "reserve"),
    [
        (1, 0.1, 0),
        (2, 0.1, 0),
        (9, 0.1, 0),
        (10, 0.1, 1),
        (19, 0.1, 1),
        (30, 0.1, 3),
        (100, 0.1, 10),
        (8, 0.0, 0),
        (4, 1.0, 3),
    ],
)
def test_critical_reserve(max_running: int, share: float, reserve: int) -> None:
    """floor(share × N), never the whole scope, none with share 0 or a scope too small."""
    assert critical_reserve(make_config(critical_share=share), max_running) == reserve


def test_reserve_refuses_other_bands_but_admits_critical() -> None:
    """With 9 of 10 slots busy, the last one is critical's: background queues, critical starts."""
    config = make_config(global_limits=Limits(max_running=10))
    state = running("global", 9)
    assert isinstance(decide_entry(config, state, request("background"), NOW), Queue)
    assert isinstance(decide_entry(config, state, request("critical"), NOW), Admit)


def test_reserve_is_released_while_critical_runs_in_it() -> None:
    """Once critical calls fill their reserve, the remaining slots are open to every band."""
    config = make_config(global_limits=Limits(max_running=10))
    assert isinstance(decide_entry(config, running("global", 8, critical=1), request(), NOW), Admit)


def test_interactive_fails_fast_with_the_full_scope_and_a_retry_after() -> None:
    """Interactive calls never queue: a full tenant refuses them with a positive retry_after."""
    config = make_config(tenant=Limits(max_running=1))
    decision = decide_entry(config, running("tenant:acme", 1), request("interactive"), NOW)
    assert isinstance(decision, Reject)
    assert (decision.refusal.reason, decision.refusal.scope) == ("overloaded", "tenant:acme")
    assert decision.refusal.retry_after_s >= 1.0


def test_queue_deadline_is_the_earliest_of_caller_deadline_and_patience() -> None:
    """Patience is min(band max_wait_s, scope max_wait_s); the caller's deadline may cut it."""
    config = make_config(global_limits=Limits(max_running=1), upstream=Limits(max_wait_s=5.0))
    state = running("global", 1)
    patient = decide_entry(config, state, request("bulk"), NOW)
    assert isinstance(patient, Queue)
    assert patient.deadline == NOW + 5.0
    assert patient.lift_at == NOW + 2.5
    hurried = decide_entry(config, state, request("bulk", deadline=NOW + 2.0), NOW)
    assert isinstance(hurried, Queue)
    assert hurried.deadline == NOW + 2.0


def test_scope_max_wait_zero_makes_every_band_fail_fast() -> None:
    """A scope with max_wait_s 0 allows no queueing, whatever the band."""
    config = make_config(upstream=Limits(max_running=1, max_wait_s=0.0))
    decision = decide_entry(config, running("upstream:mail", 1), request("bulk"), NOW)
    assert isinstance(decision, Reject)
    assert decision.refusal.scope == "upstream:mail"


def test_full_pending_queue_refuses() -> None:
    """When a scope's pending queue is at max_pending, a call that would queue is refused."""
    config = make_config(global_limits=Limits(max_running=1, max_pending=2))
    state = AdmissionState(
        running={"global": 1}, running_by_class={("global", "background"): 1}, queued={"global": 2}
    )
    decision = decide_entry(config, state, request(), NOW)
    assert isinstance(decision, Reject)
    assert (decision.refusal.reason, decision.refusal.scope) == ("overloaded", "global")


def test_retry_after_is_queue_ahead_times_service_time_over_slots() -> None:
    """(queued ahead + 1) × mean service time / max_running, clamped to [1 s, cap]."""
    config = make_config(tenant=Limits(max_running=2, max_pending=100))
    state = AdmissionState(
        running={"tenant:acme": 2},
        running_by_class={("tenant:acme", "background"): 2},
        queued={"tenant:acme": 9},
        service_time_s={"tenant:acme": 2.0},
    )
    refused = decide_entry(config, state, request("interactive"), NOW)
    assert isinstance(refused, Reject)
    assert refused.refusal.retry_after_s == pytest.approx(10.0)
    capped = decide_entry(
        make_config(tenant=Limits(max_running=2), cap=4.0), state, request("interactive"), NOW
    )
    assert isinstance(capped, Reject)
    assert capped.refusal.retry_after_s == 4.0
    tiny_cap = make_config(tenant=Limits(max_running=2), cap=0.25)
    quick = AdmissionState(
        running={"tenant:acme": 2},
        running_by_class={("tenant:acme", "background"): 2},
        service_time_s={"tenant:acme": 0.001},
    )
    floored = decide_entry(tiny_cap, quick, request("interactive"), NOW)
    assert isinstance(floored, Reject)
    assert floored.refusal.retry_after_s == 0.25


def test_refusal_names_the_scope_with_the_longest_wait() -> None:
    """When several scopes are full, the refusal names the one that will take longest to clear."""
    config = make_config(global_limits=Limits(max_running=1), tenant=Limits(max_running=1))
    state = AdmissionState(
        running={"global": 1, "tenant:acme": 1},
        running_by_class={("global", "background"): 1, ("tenant:acme", "background"): 1},
        service_time_s={"global": 1.0, "tenant:acme": 20.0},
    )
    decision = decide_entry(config, state, request("interactive"), NOW)
    assert isinstance(decision, Reject)
    assert (decision.refusal.scope, decision.refusal.retry_after_s) == ("tenant:acme", 20.0)


def test_cooldown_refuses_fast_calls_with_the_remaining_time() -> None:
    """During a cooldown, a call that may not wait is refused with exactly the time left."""
    state = AdmissionState(cooldown_until={"mail": NOW + 7.5})
    decision = decide_entry(make_config(), state, request("interactive"), NOW)
    assert isinstance(decision, Reject)
    assert decision.refusal == Refusal("cooldown", "upstream:mail", 7.5)


def test_cooldown_waits_when_it_ends_before_the_deadline() -> None:
    """A queueing band waits out a cooldown that ends before its deadline, else is refused."""
    state = AdmissionState(cooldown_until={"mail": NOW + 7.5})
    waits = decide_entry(make_config(), state, request("background", deadline=NOW + 60), NOW)
    assert isinstance(waits, WaitCooldown)
    assert waits.until == NOW + 7.5
    late = decide_entry(make_config(), state, request("background", deadline=NOW + 5), NOW)
    assert isinstance(late, Reject)
    assert (late.refusal.reason, late.refusal.retry_after_s) == ("cooldown", 7.5)


def test_cooldown_of_another_upstream_or_past_is_ignored() -> None:
    """Only the call's own upstream's running cooldown matters."""
    state = AdmissionState(cooldown_until={"other": NOW + 10, "mail": NOW - 1})
    assert isinstance(decide_entry(make_config(), state, request(), NOW), Admit)


def test_paused_scope_stopping_and_passed_deadline_refuse() -> None:
    """A paused scope, a shutdown, or a deadline already past each refuse with their reason."""
    config = make_config()
    paused = decide_entry(config, AdmissionState(paused={"tenant:acme"}), request(), NOW)
    assert isinstance(paused, Reject)
    assert (paused.refusal.reason, paused.refusal.scope) == ("paused", "tenant:acme")
    stopping = decide_entry(config, AdmissionState(stopping=True), request(), NOW)
    assert isinstance(stopping, Reject)
    assert stopping.refusal.reason == "shutting_down"
    late = decide_entry(config, AdmissionState(), request(deadline=NOW), NOW)
    assert isinstance(late, Reject)
    assert late.refusal.reason == "deadline"
    for decision in (paused, stopping, late):
        assert 0 < decision.refusal.retry_after_s <= config.retry_after_cap_s


def test_deadline_refusal_names_the_scope_the_call_waited_for() -> None:
    """A queued call that times out is told which full scope held it up."""
    config = make_config(upstream=Limits(max_running=1))
    scopes = scopes_for(config, request())
    waiter = Waiter(1, request(), scopes, NOW, NOW + 5, NOW + 2)
    refusal = deadline_refusal(config, running("upstream:mail", 1), waiter)
    assert (refusal.reason, refusal.scope) == ("deadline", "upstream:mail")
    assert refusal.retry_after_s >= 1.0
    free = deadline_refusal(config, AdmissionState(), waiter)
    assert free.scope == "class:background"


def test_missing_class_bands_fall_back_to_the_design_defaults() -> None:
    """Without configured classes, interactive fails fast and critical keeps a reserve."""
    config = Config(upstreams={}, limits={"global": Limits(max_running=10)})
    state = running("global", 9)
    assert isinstance(decide_entry(config, state, request("interactive"), NOW), Reject)
    assert isinstance(decide_entry(config, state, request("critical"), NOW), Admit)
    assert isinstance(decide_entry(config, state, request("bulk"), NOW), Queue)


def test_deferred_work_leaves_the_share_of_bands_that_cannot_wait() -> None:
    """In a scope of 10, deferred bulk work stops at 3 running (critical keeps 1, interactive its
    6): the next deferred call queues while a live bulk call and an interactive call still start."""
    config = make_config(upstream=Limits(max_running=10))
    state = AdmissionState(
        running={"upstream:mail": 3},
        running_by_class={("upstream:mail", "bulk"): 3},  # type: ignore[dict-item]
    )
    deferred = request("bulk", deferred=True)
    assert isinstance(decide_entry(config, state, deferred, NOW), Queue)
    assert isinstance(decide_entry(config, state, request("bulk"), NOW), Admit)
    assert isinstance(decide_entry(config, state, request("interactive"), NOW), Admit)
    fewer = AdmissionState(
        running={"upstream:mail": 2},
        running_by_class={("upstream:mail", "bulk"): 2},  # type: ignore[dict-item]
    )
    assert isinstance(decide_entry(config, fewer, deferred, NOW), Admit)


def test_deferred_work_may_use_what_interactive_calls_leave_above_their_share() -> None:
    """Once interactive calls fill their own share, deferred work counts only the rest: 6
    interactive and 2 deferred running in 10 leave room for one more deferred call."""
    config = make_config(upstream=Limits(max_running=10))
    state = AdmissionState(
        running={"upstream:mail": 8},
        running_by_class={  # type: ignore[dict-item]
            ("upstream:mail", "interactive"): 6,
            ("upstream:mail", "bulk"): 2,
        },
    )
    assert isinstance(decide_entry(config, state, request("bulk", deferred=True), NOW), Admit)


def test_deferred_work_ages_from_when_it_was_accepted() -> None:
    """A deferred call that has waited in the ledger is lifted earlier: its ageing counts from
    `waiting_since`, never from a time in the future."""
    config = make_config(global_limits=Limits(max_running=1))
    state = running("global", 1)
    fresh = decide_entry(config, state, request("bulk", deadline=NOW + 1000), NOW)
    old = decide_entry(
        config, state, request("bulk", deadline=NOW + 1000, waiting_since=NOW - 200), NOW
    )
    future = decide_entry(
        config, state, request("bulk", deadline=NOW + 1000, waiting_since=NOW + 50), NOW
    )
    assert isinstance(fresh, Queue)
    assert isinstance(old, Queue)
    assert isinstance(future, Queue)
    assert fresh.lift_at == NOW + 150.0
    assert old.lift_at == NOW - 50.0
    assert future.lift_at == fresh.lift_at
