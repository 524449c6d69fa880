"""The dispatcher's memory of deferred calls a pause held back: an entry is held only while it is
still waiting work this replica sees and its scope is still paused (pauses are per replica: another
replica may run the work, or the caller cancel it, while this one's pause lasts)."""

from __future__ import annotations

from datetime import UTC, datetime

from aiohttp import web

from ledger.views import Candidate
from policies.config import parse_config_text
from proxy.runtime.deferred import Dispatcher
from proxy.runtime.scheduler import Scheduler
from proxy.state import CONFIG, SCHEDULER

_CONFIG = """
listen: "127.0.0.1:1"
upstreams:
  mail: {mcp: "http://127.0.0.1:9/mcp"}
"""


def _candidate(entry_id: str) -> Candidate:
    created = datetime(2026, 12, 5, tzinfo=UTC)
    return Candidate(entry_id, "acme", "mail", "send", "bulk", None, created)


def _dispatcher() -> tuple[Dispatcher, Scheduler]:
    config = parse_config_text(_CONFIG)
    app = web.Application()
    scheduler = Scheduler(config)
    app[CONFIG], app[SCHEDULER] = config, scheduler
    return Dispatcher(app), scheduler


def test_held_back_calls_that_stop_waiting_are_forgotten_while_the_pause_lasts() -> None:
    dispatcher, scheduler = _dispatcher()
    scheduler.pause("tenant:acme")
    for n in range(1000):  # refused while paused, one after another, then run elsewhere
        dispatcher.held_back(f"entry-{n}", "tenant:acme")
        dispatcher._pick([_candidate(f"entry-{n}")])
    assert dispatcher.held_back_count == 1  # the one still waiting, not a thousand


def test_a_held_back_call_is_offered_again_once_the_pause_is_lifted() -> None:
    dispatcher, scheduler = _dispatcher()
    scheduler.pause("tenant:acme")
    dispatcher.held_back("entry-1", "tenant:acme")
    assert dispatcher._pick([_candidate("entry-1")]) == []
    scheduler.resume("tenant:acme")
    assert dispatcher._pick([_candidate("entry-1")]) == [_candidate("entry-1")]
    assert dispatcher.held_back_count == 0
