"""The dispatcher of deferred work: accepted calls run when admission allows, exactly once.

Deferred work waits in the ledger (`accepted`, with its request), never only in memory, so it
survives a restart. The dispatcher reads the oldest waiting calls of each tenant and upstream
(when it starts, when a call is accepted here, when one of its own frees a place, and every
`deferred.poll_interval_s` for work accepted by another replica), brings a few of each to the
scheduler as *deferred* admission requests of their band — the same priority bands, shares,
round-robin between tenants and ageing as live calls, ageing counted from when the call was
accepted, and never into the share of a band that cannot wait (`policies.admission.live_reserve`)
— and, once one holds its slot, claims it in the ledger (write-ahead: accepted → running, by
exactly one replica) and hands it to the runner of its path (MCP or HTTP), which forwards it and
records what became of it through a `proxy.runtime.deferred_job.DeferredJob`. A call the
scheduler refuses (its patience ran out, a cooldown, shutting down) stays accepted and is offered
again after its `retry_after`; one refused because an operator paused one of its scopes is offered
again at the first look after the pause is lifted (a pause has no known end: the 30 s a paused
caller is told to wait would otherwise hold deferred work long after a resume).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Literal

from aiohttp import web

from ledger import LedgerError, LedgerStore
from ledger.deferred import Candidate
from policies.admission import AdmissionRequest
from policies.model import WORK_CLASSES, UpstreamSpec, WorkClass
from proxy.runtime.deferred_job import DeferredJob, Runner, decode_envelope
from proxy.runtime.leases import Lease, keep_lease
from proxy.runtime.scheduler import AdmissionRefused, Slot
from proxy.state import CONFIG, LEDGER, RUNTIME, SCHEDULER
from proxy.telemetry import tracing

__all__ = ["DEFERRED", "Dispatcher"]

log = logging.getLogger("interlock.deferred")

_WAITING_PER_UPSTREAM = 8
"""Deferred calls of one upstream waiting in the scheduler at once (they count as queued)."""
_WAITING_PER_TENANT = 2
"""… of one tenant and upstream: the scheduler's round-robin sees every waiting tenant."""
_PER_GROUP = 4
"""Oldest waiting calls read per (tenant, upstream) each pass."""
_CANDIDATES = 1000


def _band(value: str) -> WorkClass:
    for band in WORK_CLASSES:
        if band == value:
            return band
    return "background"


@dataclass
class _Hand:
    """Deferred calls this replica has taken from the ledger and not yet let go."""

    waiting: dict[str, Candidate] = field(default_factory=dict)
    running: set[str] = field(default_factory=set)
    not_before: dict[str, float] = field(default_factory=dict)
    paused: dict[str, str] = field(default_factory=dict)
    """Calls refused by a pause, and the paused scope: held back until it is resumed."""

    def holds(self, entry_id: str) -> bool:
        return entry_id in self.waiting or entry_id in self.running


class Dispatcher:
    """Runs this replica's share of the deferred work (one per application: `app[DEFERRED]`)."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._runners: dict[str, Runner] = {}
        self._hand = _Hand()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._runs: set[asyncio.Task[None]] = set()
        self._stopping = False

    def register(self, kind: Literal["mcp", "http"], runner: Runner) -> None:
        """Deferred calls of `kind` are run by `runner`."""
        self._runners[kind] = runner

    def wake(self) -> None:
        """Look for waiting work now (a call was accepted, or a place freed)."""
        self._wake.set()

    @property
    def in_hand(self) -> tuple[int, int]:
        """(waiting for a slot, running) deferred calls of this replica."""
        return len(self._hand.waiting), len(self._hand.running)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="deferred-dispatcher")

    async def stop(self, grace_s: float) -> None:
        """Stop taking work; what runs gets `grace_s` to finish, the rest is cancelled (and so
        recorded `unknown` if it was sent, while the ledger is still open)."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        runs = set(self._runs)
        if not runs:
            return
        _done, pending = await asyncio.wait(runs, timeout=grace_s)
        for run in pending:
            run.cancel()
        if pending:
            log.warning(
                "%d deferred call(s) still running at shutdown were cancelled", len(pending)
            )
            await asyncio.wait(pending, timeout=5.0)

    async def _loop(self) -> None:
        poll_s = self._app[CONFIG].deferred.poll_interval_s
        while not self._stopping:
            self._wake.clear()
            store = self._app[LEDGER].store
            if store is not None and not self._app[RUNTIME].shutting_down:
                try:
                    found = await store.deferred.candidates(_CANDIDATES, per_group=_PER_GROUP)
                except LedgerError as exc:
                    log.warning("deferred work could not be read: %s", exc)
                    found = []
                for candidate in self._pick(found):
                    self._start(candidate)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll_s):
                    await self._wake.wait()

    def _pick(self, found: list[Candidate]) -> list[Candidate]:
        """The candidates to bring to the scheduler now: not in hand, not backing off, within
        the waiting windows per upstream and per tenant (oldest first)."""
        now = time.monotonic()
        hand = self._hand
        if hand.paused:  # held back while still waiting here and its scope still paused
            paused = self._app[SCHEDULER].paused_scopes()
            waiting = {candidate.entry_id for candidate in found}
            hand.paused = {
                i: scope for i, scope in hand.paused.items() if scope in paused and i in waiting
            }
        per_upstream = Counter(c.upstream for c in hand.waiting.values())
        per_tenant = Counter((c.upstream, c.tenant) for c in hand.waiting.values())
        chosen = []
        for candidate in found:
            group = (candidate.upstream, candidate.tenant)
            entry_id = candidate.entry_id
            if hand.holds(entry_id) or entry_id in hand.paused:
                continue
            if hand.not_before.get(entry_id, 0) > now:
                continue
            if per_upstream[candidate.upstream] >= _WAITING_PER_UPSTREAM:
                continue
            if per_tenant[group] >= _WAITING_PER_TENANT:
                continue
            per_upstream[candidate.upstream] += 1
            per_tenant[group] += 1
            chosen.append(candidate)
        for entry_id in [i for i, t in hand.not_before.items() if t <= now]:
            del hand.not_before[entry_id]
        return chosen

    def _start(self, candidate: Candidate) -> None:
        self._hand.waiting[candidate.entry_id] = candidate
        task = asyncio.create_task(self._run(candidate), name=f"deferred-{candidate.entry_id}")
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)

    async def _run(self, candidate: Candidate) -> None:
        hand = self._hand
        try:
            await self._admit_and_run(candidate)
        except Exception:  # one call's bug must not stop the dispatcher
            log.exception("deferred entry %s failed unexpectedly", candidate.entry_id)
        finally:
            hand.waiting.pop(candidate.entry_id, None)
            hand.running.discard(candidate.entry_id)
            self.wake()

    async def _admit_and_run(self, candidate: Candidate) -> None:
        app = self._app
        store = app[LEDGER].store
        spec = app[CONFIG].upstreams.get(candidate.upstream)
        if store is None:
            return
        if spec is None:
            await _refuse_for_good(store, candidate, "its upstream is no longer configured")
            return
        runner = self._runners.get("http" if spec.kind == "http" else "mcp")
        if runner is None:
            return
        admission = _deferred_admission(runner.admission(candidate, spec), candidate)
        try:
            slot = await app[SCHEDULER].admit(admission)
        except AdmissionRefused as refused:
            if refused.refusal.reason == "paused":
                self.held_back(candidate.entry_id, refused.refusal.scope)
            else:
                self._back_off(candidate.entry_id, refused.refusal.retry_after_s)
            return
        self._hand.waiting.pop(candidate.entry_id, None)
        self._hand.running.add(candidate.entry_id)
        self.wake()  # a waiting place freed
        try:
            await self._claim_and_run(store, runner, candidate, spec, slot, admission)
        finally:
            slot.release()

    def held_back(self, entry_id: str, scope: str) -> None:
        """The scheduler refused this call because `scope` is paused: it is not offered again
        while the scope stays paused (and forgotten once it is no longer waiting work)."""
        self._hand.paused[entry_id] = scope

    @property
    def held_back_count(self) -> int:
        """Calls held back by a pause."""
        return len(self._hand.paused)

    def _back_off(self, entry_id: str, retry_after_s: float) -> None:
        delay = retry_after_s if math.isfinite(retry_after_s) and retry_after_s > 0 else 1.0
        self._hand.not_before[entry_id] = time.monotonic() + delay

    async def _claim_and_run(
        self,
        store: LedgerStore,
        runner: Runner,
        candidate: Candidate,
        spec: UpstreamSpec,
        slot: Slot,
        admission: AdmissionRequest,
    ) -> None:
        try:
            entry = await store.deferred.claim(candidate.entry_id)
        except LedgerError as exc:
            log.warning("deferred entry %s could not be claimed: %s", candidate.entry_id, exc)
            self._back_off(candidate.entry_id, 1.0)
            return
        if entry is None or entry.request is None:
            return  # another replica took it, or it was cancelled or finished meanwhile
        try:
            envelope = decode_envelope(entry.request)
        except ValueError:
            log.error("deferred entry %s holds no readable request: refused", entry.id)
            with contextlib.suppress(LedgerError):
                await store.deferred.requeue(
                    entry.id,
                    entry.fencing_token,
                    reason="not sent: its request could not be read",
                    retry_after_s=None,
                    give_up=True,
                )
            return
        attributes = {
            tracing.Attr.UPSTREAM: spec.name,
            tracing.Attr.TENANT: entry.tenant,
            tracing.Attr.WORK_CLASS: entry.work_class,
            tracing.Attr.LEDGER_ENTRY_ID: entry.id,
            tracing.Attr.ATTEMPT: entry.attempt,
            tracing.Attr.QUEUE_WAIT_S: slot.queue_wait_s,
            "interlock.deferred": True,
        }
        lease_s = self._app[CONFIG].ledger.lease_s
        lease = Lease(entry.id, entry.fencing_token)
        with tracing.linked_span(
            f"interlock.deferred.run {entry.tool}",
            link=envelope.get("trace"),
            attributes=attributes,
        ) as span:
            job = DeferredJob(self._app, store, entry, envelope, spec, slot, lease, admission, span)
            async with keep_lease(store, lease, lease_s):
                try:
                    await runner.run(job)
                except BaseException:
                    if job.recorded is None:
                        # cancelled (shutdown) or a bug after write-ahead: it may have been sent
                        await job.unknown("interrupted after write-ahead")
                    raise


def _deferred_admission(base: AdmissionRequest, candidate: Candidate) -> AdmissionRequest:
    now = time.monotonic()
    age = (datetime.now(UTC) - candidate.created_at).total_seconds()
    return replace(
        base,
        work_class=_band(candidate.work_class),
        deadline=math.inf,
        arrived_at=now,
        deferred=True,
        waiting_since=now - max(age, 0.0),
    )


async def _refuse_for_good(store: LedgerStore, candidate: Candidate, why: str) -> None:
    with contextlib.suppress(LedgerError):
        await store.deferred.cancel(candidate.entry_id, actor=store.owner, reason=why)
    log.warning("deferred entry %s refused: %s", candidate.entry_id, why)


DEFERRED = web.AppKey("deferred_dispatcher", Dispatcher)
