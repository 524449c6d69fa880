"""A call's lease on a real ledger (SQLite and PostgreSQL): the renewer survives a retry's
hand-over to the next attempt, and a lease's renewals keep the entry running."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from ledger import ClaimRequest, ClaimResult, EntryState, LedgerStore
from policies.model import LedgerSettings
from proxy.runtime.leases import Lease, keep_lease, next_attempt
from tests import ledger_fixtures
from tests.integration.waiting import wait_until
from tests.ledger_fixtures import claim_request

ledger_backend = ledger_fixtures.ledger_backend
ledger_url = ledger_fixtures.ledger_url

LEASE_S = 0.6  # renewed every 0.2 s
BOUNDED_S = 20.0


class PausableStore(LedgerStore):
    """A real store whose claims can be held at the door (to place a renewal inside a
    hand-over), and which remembers every renewal's token and answer."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.renewals: list[tuple[int, bool]] = []
        self.claims_paused = asyncio.Event()
        self.claims_paused.set()
        self.claim_waiting = asyncio.Event()

    async def claim(self, req: ClaimRequest) -> ClaimResult:
        if not self.claims_paused.is_set():
            self.claim_waiting.set()
            await self.claims_paused.wait()
        return await super().claim(req)

    async def renew(self, entry_id: str, token: int) -> bool:
        renewed = await super().renew(entry_id, token)
        self.renewals.append((token, renewed))
        return renewed


@pytest.fixture
async def store(ledger_url: str) -> AsyncIterator[PausableStore]:
    store = await PausableStore.open(LedgerSettings(url=ledger_url, lease_s=LEASE_S), owner="r")
    assert isinstance(store, PausableStore)
    try:
        yield store
    finally:
        await store.close()


async def test_the_renewer_survives_a_renewal_inside_a_retry_hand_over(
    store: PausableStore,
) -> None:
    """A renewal that lands between the release of the failed attempt and the claim of the next
    (refused: the old token is gone) does not stop the renewer: it renews the new attempt's token,
    and the entry stays running past several lease lengths."""
    request = claim_request("handed-over")
    first = await store.claim(request)
    lease = Lease(first.entry.id, first.entry.fencing_token)
    old = lease.token
    async with keep_lease(store, lease, LEASE_S):
        store.claims_paused.clear()
        hand_over = asyncio.create_task(next_attempt(store, lease, request))
        await asyncio.wait_for(store.claim_waiting.wait(), BOUNDED_S)
        await wait_until(lambda: (old, False) in store.renewals, BOUNDED_S)
        store.claims_paused.set()
        claim = await asyncio.wait_for(hand_over, BOUNDED_S)
        new = claim.entry.fencing_token
        assert (claim.kind, lease.token) == ("new", new)
        await wait_until(lambda: store.renewals.count((new, True)) >= 5, BOUNDED_S)
        entry, _ = await store.get(lease.entry_id)
    assert (entry.state, entry.attempt, entry.fencing_token) == (EntryState.RUNNING, 2, new)


async def test_renewals_start_on_time_and_stop_when_the_block_ends(store: PausableStore) -> None:
    """A block shorter than a renewal period renews nothing; a longer one renews its lease every
    third of its length; once the block ends, nothing renews it any more (not even a renewal
    that was due)."""
    short = await store.claim(claim_request("short-call"))
    async with keep_lease(store, Lease(short.entry.id, short.entry.fencing_token), LEASE_S):
        await asyncio.sleep(0)
    assert store.renewals == []
    long = await store.claim(claim_request("long-call"))
    lease = Lease(long.entry.id, long.entry.fencing_token)
    async with keep_lease(store, lease, LEASE_S):
        await wait_until(lambda: len(store.renewals) >= 2, BOUNDED_S)
    assert set(store.renewals) == {(lease.token, True)}
    seen = len(store.renewals)
    await asyncio.sleep(LEASE_S)  # two renewal periods: a renewer left behind would show here
    assert len(store.renewals) == seen
