"""Unit tests of the per-tenant token budget (pure, fake clock)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.model import BudgetSettings
from policies.token_budget import TokenBudget
from tests.clocks import ManualClock


def make(tokens: int | None, window_s: float = 60.0) -> tuple[TokenBudget, ManualClock]:
    clock = ManualClock()
    return TokenBudget(BudgetSettings(tokens=tokens, window_s=window_s), clock=clock), clock


def test_no_limit_always_allows() -> None:
    """Without a configured token limit every check passes and nothing is stored."""
    budget, _ = make(None)
    budget.record("acme", 10_000)
    verdict = budget.check("acme")
    assert verdict.allowed
    assert verdict.limit is None
    assert not budget.enabled


def test_zero_tokens_means_no_budget() -> None:
    """`tokens: 0` disables budgets rather than refusing everything."""
    budget, _ = make(0)
    assert budget.check("acme").allowed
    assert not budget.enabled


def test_under_limit_allows_and_over_limit_refuses() -> None:
    """A tenant is refused once its spend in the window reaches the limit."""
    budget, _ = make(100)
    budget.record("acme", 60)
    assert budget.check("acme").allowed
    budget.record("acme", 40)
    verdict = budget.check("acme")
    assert not verdict.allowed
    assert verdict.used == 100
    assert verdict.limit == 100


def test_tenants_are_separate() -> None:
    """One tenant's spend never counts against another tenant."""
    budget, _ = make(100)
    budget.record("acme", 500)
    assert not budget.check("acme").allowed
    assert budget.check("globex").allowed


def test_retry_after_is_time_until_the_window_frees() -> None:
    """retry_after_s is the time until the oldest spend leaves the window."""
    budget, clock = make(100, window_s=60.0)
    budget.record("acme", 150)
    clock.now += 10.0
    verdict = budget.check("acme")
    assert not verdict.allowed
    assert verdict.retry_after_s == 50.0


def test_retry_after_counts_only_as_much_as_needed() -> None:
    """When dropping the oldest spend is enough, the caller is not sent to the end of the window."""
    budget, clock = make(100, window_s=60.0)
    budget.record("acme", 50)
    clock.now += 20.0
    budget.record("acme", 30)
    clock.now += 20.0
    budget.record("acme", 30)  # used 110; dropping the first 50 is enough
    verdict = budget.check("acme")
    assert not verdict.allowed
    assert verdict.retry_after_s == 20.0


def test_spend_expires_after_the_window() -> None:
    """A tenant refused now is allowed again once its spend has aged out."""
    budget, clock = make(100, window_s=60.0)
    budget.record("acme", 100)
    assert not budget.check("acme").allowed
    clock.now += 60.0
    assert budget.check("acme").allowed
    assert budget.used("acme") == 0


def test_non_positive_spend_is_ignored() -> None:
    """Zero or negative token counts (missing usage) do not change the spend."""
    budget, _ = make(100)
    budget.record("acme", 0)
    budget.record("acme", -5)
    assert budget.used("acme") == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(min_value=0.0, max_value=30.0), st.integers(0, 80)),
        min_size=1,
        max_size=40,
    )
)
def test_refused_tenant_is_allowed_at_retry_after(steps: list[tuple[float, int]]) -> None:
    """Whenever a tenant is refused, coming back after retry_after_s (with no new spend) passes."""
    budget, clock = make(100, window_s=60.0)
    for advance, tokens in steps:
        clock.now += advance
        budget.record("acme", tokens)
        verdict = budget.check("acme")
        if verdict.allowed:
            assert verdict.used < 100
            continue
        assert 0 < verdict.retry_after_s <= 60.0 + 1e-6
        clock.now += verdict.retry_after_s
        assert budget.check("acme").allowed
        break


def test_tenants_that_never_return_are_forgotten() -> None:
    """Memory stays bounded: spends whose window has passed are swept away."""
    budget, clock = make(1000, window_s=10.0)
    for i in range(1023):
        budget.record(f"tenant-{i}", 1)
    clock.now += 11.0
    budget.record("last", 1)  # the 1024th record sweeps
    assert set(budget._spend) == {"last"}
