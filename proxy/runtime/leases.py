"""A call's hold on its ledger entry: what a claim that may not run answers, the lease kept alive
while the call is in flight, its hand-over to the next attempt when a retry of a call that
certainly did not run starts, and the recording of its outcome (retried in the background when
the ledger cannot take it at once, so the caller's answer never waits for it)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass
from typing import Literal

from ledger import ClaimRequest, ClaimResult, EntryView, LedgerError, LedgerStore, Outcome
from ledger.finishing import settle_as
from policies import answers
from policies.answers import Answer

__all__ = [
    "FINISH_WAIT_S",
    "AttemptNotClaimed",
    "Lease",
    "claim_refusal",
    "keep_lease",
    "next_attempt",
    "record_finish",
]

log = logging.getLogger("interlock.leases")
FINISH_WAIT_S = 1.0
"""How long a caller's answer may wait for its outcome to be recorded; a finish still not
written by then goes on in the background (see `record_finish`)."""


def claim_refusal(claim: ClaimResult, idempotency_key: str | None) -> Answer | None:
    """What the caller is told when its claim may not run: in progress, mismatch, or needs
    reconciliation. None for a new attempt and for a replay (each protocol renders its own)."""
    entry, state = claim.entry, str(claim.entry.state)
    if claim.kind == "in_progress":
        return answers.in_progress(idempotency_key, entry.id, state)
    if claim.kind == "mismatch":
        return answers.key_mismatch(idempotency_key, entry.id)
    if claim.kind == "needs_reconciliation":
        return answers.needs_reconciliation(idempotency_key, entry.id, state)
    return None


@dataclass
class Lease:
    """The entry a call holds and its current fencing token (a retry moves it to a new one)."""

    entry_id: str
    token: int
    valid_until: float = math.inf
    """Event-loop time by which the lease surely still holds (set by `keep_lease`, moved by
    each renewal): a background finish is retried until then."""
    handing_over: bool = False
    """True while `next_attempt` moves the lease to the next attempt's token."""


class AttemptNotClaimed(Exception):
    """A retry could not take the next attempt: `claim` says who has the key now, or `error`
    says why the ledger could not be asked."""

    def __init__(self, claim: ClaimResult | None = None, error: LedgerError | None = None):
        super().__init__(str(error) if error else f"claim answered {claim.kind if claim else '?'}")
        self.claim = claim
        self.error = error


async def next_attempt(store: LedgerStore, lease: Lease, request: ClaimRequest) -> ClaimResult:
    """Before retrying a call that certainly did not run: record that (running → rejected) and
    claim the key again (rejected → running, attempt + 1), so every attempt that may reach the
    upstream is its own write-ahead with its own fencing token. Moves `lease` to the new token.

    Raises:
        AttemptNotClaimed: another send took the key in between, or the ledger refused.
    """
    lease.handing_over = True
    started = asyncio.get_running_loop().time()
    try:
        await store.release_unsent(
            lease.entry_id, lease.token, reason="not executed; retrying", retry_after_s=None
        )
        claim = await store.claim(request)
    except LedgerError as exc:
        raise AttemptNotClaimed(error=exc) from exc
    finally:
        lease.handing_over = False
    if claim.kind != "new" or claim.entry.id != lease.entry_id:
        raise AttemptNotClaimed(claim)
    lease.token = claim.entry.fencing_token
    lease.valid_until = started + store.settings.lease_s
    return claim


async def _renew_forever(store: LedgerStore, lease: Lease, every_s: float) -> None:
    """Renew now, then every `every_s`, until cancelled or the lease is really lost."""
    loop = asyncio.get_running_loop()
    while True:
        token = lease.token
        started = loop.time()
        try:
            renewed = await store.renew(lease.entry_id, token)
        except LedgerError as exc:
            # The sweeper will mark the entry unknown if the lease really runs out: safe side.
            log.error("entry %s: lease renewal failed: %s", lease.entry_id, exc)
        else:
            if renewed:
                if lease.token == token:
                    lease.valid_until = started + store.settings.lease_s
            # Refused: the token moved on. A hand-over to the next attempt (in flight, or done
            # meanwhile) gives the lease a new token to renew; otherwise it is really lost.
            elif lease.token == token and not lease.handing_over:
                log.warning(
                    "entry %s: lease lost (token %d is no longer current)", lease.entry_id, token
                )
                return
        await asyncio.sleep(every_s)


class keep_lease:  # lower case: used like a function, `async with keep_lease(...)`
    """Renew the lease (whatever its current token) every third of its length until the block
    ends.

    Most calls end long before their first renewal is due: a timer starts the renewing task
    only then, so such a call costs no task of its own. A plain class, not an async generator:
    it is entered once per side-effecting call.
    """

    __slots__ = ("_due", "_every_s", "_lease", "_renewer", "_store")

    def __init__(self, store: LedgerStore, lease: Lease, lease_s: float) -> None:
        self._store = store
        self._lease = lease
        self._every_s = max(lease_s / 3.0, 0.05)
        self._renewer: asyncio.Task[None] | None = None
        self._due: asyncio.TimerHandle | None = None
        # The claim committed just before: its lease surely holds for `lease_s` from a moment ago.
        lease.valid_until = min(lease.valid_until, asyncio.get_running_loop().time() + lease_s)

    async def __aenter__(self) -> None:
        self._due = asyncio.get_running_loop().call_later(self._every_s, self._start)

    def _start(self) -> None:
        renewing = _renew_forever(self._store, self._lease, self._every_s)
        self._renewer = asyncio.create_task(renewing, name=f"lease-{self._lease.entry_id}")

    async def __aexit__(self, *exc_info: object) -> None:
        if self._due is not None:
            self._due.cancel()
        renewer = self._renewer
        if renewer is not None:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer


def record_finish(
    store: LedgerStore,
    lease: Lease,
    *,
    state: Literal["succeeded", "failed"],
    outcome: Outcome,
    error: str | None = None,
) -> asyncio.Future[EntryView | None]:
    """Record the call's confirmed outcome without holding up its answer: the finish runs in the
    background (`LedgerStore.finish_in_background`, retried while the ledger cannot be written,
    until the lease would lapse); the returned future waits for it at most `FINISH_WAIT_S`.

    Its result is the finished entry, or None when the finish is still being retried. A future,
    not a coroutine: `until_written` shields it as it is, and a finish that lands at once costs
    no task.

    Raises (from the future):
        StaleToken, IllegalTransition, EntryNotFound: the ledger refused it (as `finish`).
        LedgerUnavailable: it could not be written before the lease lapsed.
    """
    finishing = store.finish_in_background(
        lease.entry_id,
        lease.token,
        state=state,
        outcome=outcome,
        error=error,
        until=lease.valid_until,
    )
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[EntryView | None] = loop.create_future()

    def landed(finished: asyncio.Future[EntryView]) -> None:
        late.cancel()
        settle_as(answer, finished)

    def still_retrying() -> None:
        if not answer.done():
            finishing.remove_done_callback(landed)
            log.warning("entry %s: answered before its outcome was recorded", lease.entry_id)
            answer.set_result(None)

    late = loop.call_later(FINISH_WAIT_S, still_retrying)
    finishing.add_done_callback(landed)
    return answer
