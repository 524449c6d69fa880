"""A claimed deferred call in its runner's hands (`DeferredJob`), how the ledger keeps its
request (`encode_envelope`), and what a caller is told when its key's entry answers instead of a
new task (`deferral_refusal`). The dispatcher that hands jobs out is `proxy.runtime.deferred`."""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from aiohttp import web
from opentelemetry.trace import Span

from ledger import EntryView, LedgerError, LedgerStore, LedgerUnavailable, Outcome, StaleToken
from ledger.deferred import Candidate
from policies import answers
from policies.admission import AdmissionRequest
from policies.answers import Answer
from policies.model import UpstreamSpec
from proxy.runtime.leases import Lease
from proxy.runtime.ledger_writes import until_written
from proxy.runtime.scheduler import Slot
from proxy.state import CONFIG
from proxy.telemetry import tracing

__all__ = ["DeferredJob", "Runner", "decode_envelope", "deferral_refusal", "encode_envelope"]

log = logging.getLogger("interlock.deferred")
_FINISH_RETRY_S = 0.2


def encode_envelope(kind: Literal["mcp", "http"], fields: dict[str, Any]) -> bytes:
    """A deferred request as the ledger keeps it: JSON naming its path (`kind`)."""
    return json.dumps({"v": 1, "kind": kind, **fields}, separators=(",", ":")).encode()


def decode_envelope(raw: bytes) -> dict[str, Any]:
    """The request `encode_envelope` kept (raises ValueError when it is not one)."""
    value = json.loads(raw)
    if not isinstance(value, dict) or value.get("v") != 1 or "kind" not in value:
        raise ValueError("not a deferred request envelope")
    return value


def deferral_refusal(kind: str, entry: EntryView, idempotency_key: str | None) -> Answer:
    """What a caller is told when its key's entry answers for it instead of a new task: the
    key was used with other arguments, it needs reconciliation, or it is in progress."""
    if kind == "mismatch":
        return answers.key_mismatch(idempotency_key, entry.id)
    if kind == "needs_reconciliation":
        return answers.needs_reconciliation(idempotency_key, entry.id, str(entry.state))
    return answers.in_progress(idempotency_key, entry.id, str(entry.state))


@dataclass
class DeferredJob:
    """One claimed deferred call in the hands of its runner: the running entry (with its
    request), the slot it holds, its lease, and how to record what became of it."""

    app: web.Application
    store: LedgerStore
    entry: EntryView
    envelope: dict[str, Any]
    spec: UpstreamSpec
    slot: Slot
    lease: Lease
    admission: AdmissionRequest
    span: Span
    recorded: str | None = None
    """The state recorded for this attempt, once it is."""

    async def finish(self, outcome: Outcome, *, failed: bool, error: str | None = None) -> None:
        """The upstream answered: keep its answer as the task's result (up to
        `deferred.max_result_bytes`)."""
        state: Literal["succeeded", "failed"] = "failed" if failed else "succeeded"
        cap = self.app[CONFIG].deferred.max_result_bytes

        async def write() -> EntryView:
            return await self.store.deferred.finish(
                self.lease.entry_id,
                self.lease.token,
                state=state,
                outcome=outcome,
                error=error,
                max_bytes=cap,
            )

        await self._record(state, write)

    async def await_input(self, question: bytes) -> None:
        """The tool asked its user for input (it did not act): the entry waits, with its request
        and `question`, until its caller answers (`tasks/update`)."""
        cap = self.app[CONFIG].deferred.max_result_bytes

        async def write() -> EntryView:
            return await self.store.deferred.await_input(
                self.lease.entry_id, self.lease.token, question=question, max_bytes=cap
            )

        await self._record("rejected", write)

    async def unknown(self, reason: str) -> None:
        """It may have acted and its answer is lost: unknown, never re-sent by the proxy."""

        async def write() -> EntryView:
            return await self.store.mark_unknown(
                self.lease.entry_id, self.lease.token, reason=reason
            )

        await self._record("unknown", write)

    async def not_executed(self, reason: str, retry_after_s: float | None) -> None:
        """It certainly did not run: back in line, or after `deferred.max_attempts` attempts,
        refused for good (rejected)."""
        limit = self.app[CONFIG].deferred.max_attempts
        entry_id, token = self.lease.entry_id, self.lease.token
        spent = self.entry.attempt >= limit
        why = f"given up after {self.entry.attempt} attempts that did not run: {reason}"

        async def requeue() -> EntryView:
            return await self.store.deferred.requeue(
                entry_id,
                token,
                reason=why if spent else reason,
                retry_after_s=retry_after_s,
                give_up=spent,
            )

        await self._record("rejected" if spent else "accepted", requeue)

    async def _record(self, state: str, write: Callable[[], Awaitable[EntryView]]) -> None:
        """Write it, retried while the ledger cannot take it and the lease still holds (a lease
        that lapses makes the entry unknown: the record stays honest either way)."""
        self.span.set_attribute(tracing.Attr.LEDGER_STATE, state)
        loop = asyncio.get_running_loop()
        while True:
            try:
                await until_written(write())
            except StaleToken as exc:
                self.span.set_attribute(tracing.Attr.LEDGER_STATE, str(exc.state))
            except LedgerUnavailable as exc:
                if loop.time() + _FINISH_RETRY_S < self.lease.valid_until:
                    await asyncio.sleep(random.uniform(0, _FINISH_RETRY_S))
                    continue
                log.error("deferred entry %s: %s not recorded: %s", self.entry.id, state, exc)
                self.span.set_attribute("interlock.ledger.error", str(exc))
            except LedgerError as exc:
                self.span.set_attribute("interlock.ledger.error", str(exc))
            self.recorded = state
            return


class Runner(Protocol):
    """How one path (MCP or HTTP) runs its deferred calls."""

    def admission(self, candidate: Candidate, spec: UpstreamSpec) -> AdmissionRequest:
        """The call as the scheduler sees it (its cost class, side effect…); `deferred` and
        `waiting_since` are set by the dispatcher."""

    async def run(self, job: DeferredJob) -> None:
        """Forward the claimed call and record its outcome through `job` (every path out of
        here leaves the entry recorded, or running with its lease to lapse into unknown)."""
