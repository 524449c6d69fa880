"""A call's hold on its ledger entry: what a claim that may not run answers, the lease kept alive
while the call is in flight, and its hand-over to the next attempt when a retry of a call that
certainly did not run starts."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ledger import ClaimRequest, ClaimResult, LedgerError, LedgerStore
from policies import answers
from policies.answers import Answer

__all__ = ["AttemptNotClaimed", "Lease", "claim_refusal", "keep_lease", "next_attempt"]

log = logging.getLogger("interlock.leases")


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
    try:
        await store.release_unsent(
            lease.entry_id, lease.token, reason="not executed; retrying", retry_after_s=None
        )
        claim = await store.claim(request)
    except LedgerError as exc:
        raise AttemptNotClaimed(error=exc) from exc
    if claim.kind != "new" or claim.entry.id != lease.entry_id:
        raise AttemptNotClaimed(claim)
    lease.token = claim.entry.fencing_token
    return claim


async def _renew_forever(store: LedgerStore, lease: Lease, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        token = lease.token
        try:
            if not await store.renew(lease.entry_id, token) and lease.token == token:
                log.warning(
                    "entry %s: lease lost (token %d is no longer current)", lease.entry_id, token
                )
                return
        except LedgerError as exc:
            # The sweeper will mark the entry unknown if the lease really runs out: safe side.
            log.error("entry %s: lease renewal failed: %s", lease.entry_id, exc)


@contextlib.asynccontextmanager
async def keep_lease(store: LedgerStore, lease: Lease, lease_s: float) -> AsyncIterator[None]:
    """Renew the lease (whatever its current token) every third of its length until the block
    ends."""
    task = asyncio.create_task(
        _renew_forever(store, lease, max(lease_s / 3.0, 0.05)), name=f"lease-{lease.entry_id}"
    )
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
