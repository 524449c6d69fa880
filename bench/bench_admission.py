"""Admission: CPU per release as the number of waiting calls grows.

In-process, on the real `AdmissionBook` (no event loop, no I/O): a global scope of 64 runs full,
N background calls wait, and each step finishes one running call, dispatches (which starts the
best waiting call) and queues one new call, so N stays constant. Three populations:

- one tenant, every call from its own agent run (runs unlimited): calls of distinct runs share a
  queue, so the cost should not follow N;
- every call from its own tenant (tenants limited to 4 running): the book finds the tenant whose
  turn it is through its turn index, so the cost should not follow N either;
- the same with one call in 16 of band `bulk`: with two bands besides critical waiting, the book
  falls back to the engine's full scan, one queue head per waiting tenant, so the cost follows N.

Reported: CPU µs per release (`time.process_time`, best of 3; fewer releases where many wait)
and the ratio to N = 16 of the same population in the same run. Goal (the issue's): O(1) per
call whatever the number in flight.
"""

from __future__ import annotations

import time

from bench.common import Table
from policies.admission import AdmissionRequest, AdmissionState, Admit, Queue, decide_entry
from policies.admission_book import AdmissionBook, Running
from policies.model import Config, Limits, UpstreamSpec

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
    band = "bulk" if population == "two bands" and number % 16 == 0 else "background"
    return AdmissionRequest(f"t{number}", band, "up", run_id=f"r{number}", deadline=1e12)


def _per_release_us(population: str, waiting: int, releases: int) -> float:
    config = _config()
    book = AdmissionBook(config)
    full = AdmissionState(running={"global": 10**9})
    running: list[Running] = []
    for number in range(_RUNNING):
        request = _request(population, -1 - number)
        admitted = decide_entry(config, AdmissionState(), request, _NOW)
        assert isinstance(admitted, Admit)
        running.append(book.start(request, admitted.scopes, _NOW))
    numbers = iter(range(10**9))

    def enqueue() -> None:
        request = _request(population, next(numbers))
        decision = decide_entry(config, full, request, _NOW)
        assert isinstance(decision, Queue)
        book.enqueue(request, decision, _NOW)

    for _ in range(waiting):
        enqueue()
    started_at = time.process_time()
    for _ in range(releases):
        book.finish(running.pop(0), _NOW)
        running += [started for _, started in book.dispatch(_NOW).started]
        enqueue()
    return (time.process_time() - started_at) / releases * 1e6


def run(quick: bool = False) -> list[Table]:
    """CPU per release with 16, 256 and 4,096 calls waiting, for each population."""
    budget = 100_000 if quick else 400_000  # releases × waiting per cell: bounds the slow cells
    rows: list[list[str]] = []
    for population, label in (
        ("runs", "one tenant, a run per call"),
        ("tenants", "a tenant per call"),
        ("two bands", "a tenant per call, 1 in 16 bulk"),
    ):
        base = 0.0
        for waiting in _WAITING:
            releases = max(min(2000, budget // waiting), 20)
            cost = min(_per_release_us(population, waiting, releases) for _ in range(3))
            base = base or cost
            rows.append([label, str(waiting), f"{cost:.1f}", f"{cost / base:.2f}×"])
    note = (
        "Up to 2,000 releases per cell (fewer where many wait; finish one call, dispatch, queue a "
        "new one: the number waiting stays constant) behind a global scope of "
        f"{_RUNNING} running calls, tenants limited to 4; CPU of this process, best of 3. The "
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
