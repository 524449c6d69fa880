"""`ledger.in_flight.CallsInFlight`: what the commit delay waits for."""

from __future__ import annotations

from ledger.in_flight import CallsInFlight
from tests.clocks import ManualClock


def test_a_call_counts_from_its_claim_until_it_reports_its_end() -> None:
    calls = CallsInFlight(lease_s=30, clock=ManualClock(100.0))
    calls.started("a")
    calls.started("b")
    assert calls.count() == 2
    calls.ended("a")
    calls.ended("a")  # a second report of the same end changes nothing
    assert calls.count() == 1


def test_a_call_that_never_reports_stops_counting_once_its_lease_would_have_lapsed() -> None:
    clock = ManualClock(100.0)
    calls = CallsInFlight(lease_s=30, clock=clock)
    calls.started("silent")
    clock.now += 20
    calls.started("recent")
    clock.now += 11  # "silent" is 31 s old, "recent" 11 s
    assert calls.count() == 1
    calls.ended("recent")
    assert calls.count() == 0


def test_a_next_attempt_of_the_same_entry_counts_from_its_own_claim() -> None:
    clock = ManualClock(100.0)
    calls = CallsInFlight(lease_s=30, clock=clock)
    calls.started("retried")
    calls.started("other")
    clock.now += 25
    calls.started("retried")  # its next attempt: a new lease from now
    clock.now += 10  # "other" is 35 s old; "retried" 10 s since its next attempt
    assert calls.count() == 1
