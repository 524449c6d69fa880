"""Admission: CPU per release as the number of waiting calls grows.

In-process, on the real `AdmissionBook` (no event loop, no I/O): a global scope of 64 runs full,
N background calls wait, and each step finishes one running call, dispatches (which starts the
best waiting call) and queues one new call, so N stays constant. Four populations:

- one tenant, every call from its own agent run (runs unlimited): calls of distinct runs share a
  queue, so the cost should not follow N;
- every call from its own tenant (tenants limited to 4 running): the book finds the tenant whose
  turn it is through its turn index, so the cost should not follow N either;
- the same with one call in 16 of band `bulk`: choosing between two bands (ageing, shares) goes
  through the index too;
- a tenant per call, every tenant running the one call its limit allows and waiting with
  another (no global limit): each step ends one tenant's call, anywhere in the turn order, and
  only that tenant can start; the tenants ahead of it stay parked until their own calls end.

Reported: CPU µs per release (`time.process_time`, best of 3; fewer releases where many wait)
and the ratio to N = 16 of the same population in the same run. Goal (the issue's): O(1) per
call whatever the number in flight.
"""

from __future__ import annotations

import functools
import time

from bench.common import Table
from policies.admission import AdmissionRequest, AdmissionState, Admit, Queue, decide_entry
from policies.admission_book import AdmissionBook, Running
from policies.model import Config, Limits, UpstreamSpec, WorkClass

__all__ = ["run"]

_RUNNING = 64
_WAITING = (16, 256, 4096)
_NOW = 1000.0


def _config() -> Config:
    return Config(
        upstreams={"up": UpstreamSpec("up", "mcp_http", url="http://127.0.0.1:9")},
        limits={"global": Limits(max_running=_RUNNING), "tenant": Limits(max_running=4)},
    )


def _request(population: str, number: int) -> AdmissionRequest:
    if population == "runs":
        return AdmissionRequest("acme", "background", "up", run_id=f"r{number}", deadline=1e12)
    band: WorkClass = "bulk" if population == "two bands" and number % 16 == 0 else "background"
    return AdmissionRequest(f"t{number}", band, "up", run_id=f"r{number}", deadline=1e12)


def _start(book: AdmissionBook, request: AdmissionRequest) -> Running:
    """Start `request` as if nothing else ran."""
    admitted = decide_entry(book.config, AdmissionState(), request, _NOW)
    assert isinstance(admitted, Admit)
    return book.start(request, admitted.scopes, _NOW)


def _queue(book: AdmissionBook, request: AdmissionRequest, full: AdmissionState) -> None:
    """Queue `request` as `full` (a state where it cannot start) makes it wait."""
    decision = decide_entry(book.config, full, request, _NOW)
    assert isinstance(decision, Queue)
    book.enqueue(request, decision, _NOW)


def _per_release_us(population: str, waiting: int, releases: int) -> float:
    book = AdmissionBook(_config())
    full = AdmissionState(running={"global": 10**9})
    running = [_start(book, _request(population, -1 - number)) for number in range(_RUNNING)]
    numbers = iter(range(10**9))
    for _ in range(waiting):
        _queue(book, _request(population, next(numbers)), full)
    started_at = time.process_time()
    for _ in range(releases):
        book.finish(running.pop(0), _NOW)
        running += [started for _, started in book.dispatch(_NOW).started]
        _queue(book, _request(population, next(numbers)), full)
    return (time.process_time() - started_at) / releases * 1e6


def _own_limit_release_us(waiting: int, releases: int) -> float:
    """Every waiting tenant runs its one allowed call (no global limit); each step ends one
    tenant's call, dispatches (that tenant's next call starts) and queues another for it."""
    book = AdmissionBook(
        Config(
            upstreams={"up": UpstreamSpec("up", "mcp_http", url="http://127.0.0.1:9")},
            limits={"tenant": Limits(max_running=1)},
        )
    )
    full = AdmissionState(running={f"tenant:t{n}": 10**9 for n in range(waiting)})

    def request(number: int) -> AdmissionRequest:
        return AdmissionRequest(f"t{number}", "background", "up", deadline=1e12)

    running = [_start(book, request(number)) for number in range(waiting)]
    for number in range(waiting):
        _queue(book, request(number), full)
    book.dispatch(_NOW)  # nobody fits: every tenant is at its own limit
    started_at = time.process_time()
    for step in range(releases):
        number = (step * 7919) % waiting  # ends calls all over the turn order
        book.finish(running[number], _NOW)
        (started,) = book.dispatch(_NOW).started
        running[number] = started[1]
        _queue(book, request(number), full)
    return (time.process_time() - started_at) / releases * 1e6


def run(quick: bool = False) -> list[Table]:
    """CPU per release with 16, 256 and 4,096 calls waiting, for each population."""
    budget = 100_000 if quick else 400_000  # releases × waiting per cell: bounds the slow cells
    rows: list[list[str]] = []
    for population, label in (
        ("runs", "one tenant, a run per call"),
        ("tenants", "a tenant per call"),
        ("two bands", "a tenant per call, 1 in 16 bulk"),
        ("own limit", "a tenant per call, each at its own limit"),
    ):
        base = 0.0
        for waiting in _WAITING:
            releases = max(min(2000, budget // waiting), 20)
            measure = (
                _own_limit_release_us
                if population == "own limit"
                else functools.partial(_per_release_us, population)
            )
            cost = min(measure(waiting, releases) for _ in range(3))
            base = base or cost
            rows.append([label, str(waiting), f"{cost:.1f}", f"{cost / base:.2f}×"])
    note = (
        "Up to 2,000 releases per cell (fewer where many wait; finish one call, dispatch, queue a "
        "new one: the number waiting stays constant) behind a global scope of "
        f"{_RUNNING} running calls, tenants limited to 4 (the last population: tenants limited to "
        "1, each running one call, no global limit); CPU of this process, best of 3. The "
        "ratio is against 16 waiting calls of the same population. Goal: per-release cost "
        "independent of the number waiting."
    )
    return [
        Table(
            title="Admission: CPU per release as calls wait",
            columns=["waiting calls", "waiting", "CPU µs per release", "vs 16 waiting"],
            rows=rows,
            note=note,
        )
    ]
