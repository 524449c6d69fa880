"""Retry budgets: a fraction of recent requests per upstream, with a minimum, over a window."""

from __future__ import annotations

from policies.budget import RetryBudget, RetryBudgets
from policies.model import RetrySettings, UpstreamSpec
from tests.clocks import ManualClock


def test_minimum_retries_without_traffic() -> None:
    """With no recent requests the budget still allows the minimum (3), then refuses."""
    budget = RetryBudget(
        RetrySettings(budget_ratio=0.2, budget_min_retries=3), clock=ManualClock(50.0)
    )
    assert [budget.try_spend() for _ in range(4)] == [True, True, True, False]


def test_budget_is_a_fraction_of_recent_requests() -> None:
    """100 recent requests at 20 % allow 20 retries, not 21."""
    budget = RetryBudget(
        RetrySettings(budget_ratio=0.2, budget_min_retries=3), clock=ManualClock(50.0)
    )
    for _ in range(100):
        budget.record_request()
    assert budget.available() == 20
    granted = sum(budget.try_spend() for _ in range(25))
    assert granted == 20
    assert budget.available() == 0


def test_budget_refills_when_the_window_slides_past() -> None:
    """Retries spent more than a window ago no longer count against the budget."""
    clock = ManualClock(50.0)
    settings = RetrySettings(budget_ratio=0.0, budget_min_retries=2, budget_window_s=10.0)
    budget = RetryBudget(settings, clock=clock)
    assert budget.try_spend()
    assert budget.try_spend()
    assert not budget.try_spend()
    clock.now += 5.0
    assert not budget.try_spend()
    clock.now += 5.5
    assert budget.available() == 2


def test_budgets_are_per_upstream_with_their_settings() -> None:
    """Each upstream has its own budget built from its retry settings; unknown ones get defaults."""
    tight = UpstreamSpec(
        "tight",
        "http",
        url="http://127.0.0.1:9",
        retry=RetrySettings(budget_min_retries=1, budget_ratio=0.0),
    )
    budgets = RetryBudgets({"tight": tight}, clock=ManualClock(50.0))
    assert budgets.for_upstream("tight") is budgets.for_upstream("tight")
    assert budgets.for_upstream("tight").try_spend()
    assert not budgets.for_upstream("tight").try_spend()
    assert budgets.for_upstream("other").available() == RetrySettings().budget_min_retries
